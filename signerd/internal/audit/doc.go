// Package audit is signerd's tamper-evident audit log: one JSON line per
// signing decision, granted or denied, hash-chained and made durable with
// group commit before the decision is allowed to take effect ([Log.Append]).
// A decision that signs nothing may instead wait only until its line is
// written ([Log.AppendWritten]); the durable line of any later decision
// covers it.
//
// # Group commit
//
// A Log runs a writer and a syncer side by side. The writer writes lines as
// they are appended (up to Config.MaxBatch per write), also while an fsync
// runs; the syncer fsyncs everything written so far and then releases every
// waiter whose line that fsync covered, and starts the next fsync as soon as
// one ends. A batch is therefore "every line written since the previous fsync
// began", and no request waits behind an fsync that does not cover its line.
// An Append is answered only by an fsync that began after its line's write
// completed. A failed write or fsync fails every waiter not yet made durable
// (and every later Append); an fsync already running when a write fails still
// answers the lines it covers. Before a rotation the writer fsyncs the current
// file's lines itself, so no fsync ever targets a file renamed away.
//
// # Line format
//
// Every line is the canonical encoding of a [Record] followed by "\n". The
// canonical encoding is fixed by this package, not by encoding/json, so that a
// file written today still verifies after a Go upgrade:
//
//   - one JSON object, no whitespace, keys in this order: time, replica, seq,
//     caller, rpc, space, profile, subject, jti, expiry (omitted when zero),
//     request_id (omitted when empty), decision, reason (omitted when empty),
//     count (omitted when zero), prev, hash;
//   - strings escape only '"', '\\' and control characters (\b \f \n \r \t,
//     otherwise \u00XX with lower-case hex); everything else is literal UTF-8;
//   - times are UTC in RFC 3339 with nanoseconds, trailing zeros trimmed
//     (time.RFC3339Nano); seq and count are decimal integers.
//
// [Verify] refuses a line that is valid JSON but not in this form, so that
// changing any byte of a line (even whitespace or key case) is reported at that
// line.
//
// # Chain
//
// Each replica keeps its own chain (ARCHITECTURE §7), named by the replica id
// in every line, with seq counting 1, 2, 3, ... along the chain:
//
//	genesis(replica) = SHA-256("cotal-audit/v1\x00" || replica)
//	hash_n           = SHA-256(prev_n || canonical(record_n with hash = ""))
//	prev_1           = genesis(replica), prev_n = hash_(n-1)
//
// where prev_n is the 32 raw bytes and the prev and hash fields hold lower-case
// hex. A line whose content was altered fails its own hash; a deleted,
// duplicated or reordered line breaks the seq/prev link at the position where
// it happened. Lines of several replicas may be interleaved in one file.
//
// # Files
//
// A Log rotates its file when the next line would pass Config.MaxBytes
// (64 MiB by default) and on [Log.Rotate]: the file is renamed to
// path.<seq of its first line, 20 digits> (never over an existing name; the
// names sort in chain order) and the chain goes on in a new file whose first
// line is a continuation line (rpc [ContinueRPC], caller [ContinueCaller]):
// its seq and prev are those of the rotated file's last line plus one, so
// the chain runs across files and each file still verifies alone. A chain
// may begin in a file only at seq 1 or with a continuation line.
// [VerifyFiles] checks files in order and names a gap (a missing file), a
// reordering, a replaced file or a renamed one. At start a final line
// without a newline (a write that never completed, so never acknowledged) is
// cut and saved aside (path.torn.<unix>, see [Repair]); any other break
// refuses the file. An empty current file after an interrupted rotation
// continues the newest rotated file.
//
// # What the chain cannot show
//
// The chain is not keyed: someone who can write the file can rewrite a whole
// suffix consistently, and removing lines from the end (tail truncation)
// leaves a valid, shorter chain. Neither is detectable from the file alone. An
// operator who needs that records the head ([Log.Head] or the heads in
// [Summary]) somewhere the signer host cannot write (a ticket, a transparency
// log, another machine) and checks later that the chain still reaches it.
//
// Never a JWT, never a seed: [Record] has no field meant to hold either, and
// [Log.Append] replaces a field value that holds one with [Redacted] before it
// is written. A credential is recognised by its structure, not by a look-alike
// substring: a JWT is three base64url segments whose first decodes to a JOSE
// header (a JSON object with "alg" or "typ"), a seed is 58 base32 characters
// that nkeys decodes as a seed, checksum included, and a PEM private key has
// its armour line. Caller and space are never redacted (a space "heyJude" is
// a name, not a token).
package audit
