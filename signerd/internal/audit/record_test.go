package audit

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// recordKeys is every key a line may have. Adding a field to Record must be
// a deliberate change here: nothing that can hold a JWT or a seed belongs.
var recordKeys = []string{
	"caller", "count", "decision", "expiry", "hash", "jti", "prev", "profile", "reason",
	"replica", "request_id", "rpc", "seq", "space", "subject", "time",
}

func TestRecordHasNoUnknownFields(t *testing.T) {
	var goNames []string
	rt := reflect.TypeFor[Record]()
	for i := range rt.NumField() {
		goNames = append(goNames, rt.Field(i).Name)
	}
	wantNames := []string{"Time", "Replica", "Seq", "Caller", "RPC", "Space", "Profile", "Subject", "JTI", "Expiry", "RequestID", "Decision", "Reason", "Count", "Prev", "Hash"}
	if !slices.Equal(goNames, wantNames) {
		t.Fatalf("Record fields %v, want exactly %v", goNames, wantNames)
	}
	full := Record{
		Time: base, Replica: "r1", Seq: 1, Caller: "c", RPC: "Mint", Space: "s", Profile: "p",
		Subject: "U", JTI: "J", Expiry: base, RequestID: "q", Decision: Denied, Reason: "x", Count: 7,
		Prev: GenesisHash("r1"), Hash: GenesisHash("r1"),
	}
	for name, data := range map[string][]byte{
		"encoding/json": must(json.Marshal(full)),
		"canonical":     encode(nil, &full),
	} {
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := slices.Sorted(maps.Keys(m)); !slices.Equal(got, recordKeys) {
			t.Fatalf("%s marshals keys %v, want %v", name, got, recordKeys)
		}
	}
	// The canonical form decodes strictly into the same record.
	dec := json.NewDecoder(bytes.NewReader(encode(nil, &full)))
	dec.DisallowUnknownFields()
	var back Record
	if err := dec.Decode(&back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, full) {
		t.Fatalf("round trip %+v, want %+v", back, full)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestCountLine: an aggregate line carries its count between reason and prev, the count is
// covered by the hash, and a zero count is written by leaving the key out, so "count":0 is not
// canonical.
func TestCountLine(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path}, noSync)
	agg := Record{Caller: "sha256:00ff", RPC: "Mint", Decision: Denied, Reason: "rate-limited", Count: 25504}
	for i, r := range []Record{sample(0), agg, sample(1)} {
		if err := l.Append(context.Background(), r); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	lines := readLines(t, path)
	if _, err := Verify(bytes.NewReader(join(lines))); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if !bytes.Contains(lines[1], []byte(`"decision":"denied","reason":"rate-limited","count":25504,"prev":"`)) {
		t.Fatalf("aggregate line %s does not carry its count in place", lines[1])
	}
	if bytes.Contains(lines[0], []byte(`"count"`)) {
		t.Fatalf("single line %s carries a count", lines[0])
	}
	for _, tc := range []struct {
		name   string
		line   int
		edit   func(string) string
		reason string
	}{
		{"fail/count-changed", 2, func(s string) string { return strings.Replace(s, `"count":25504`, `"count":2`, 1) }, "hash does not match"},
		{"fail/count-removed", 2, func(s string) string { return strings.Replace(s, `,"count":25504`, ``, 1) }, "hash does not match"},
		{"fail/count-zero-written", 1, func(s string) string { return strings.Replace(s, `,"prev"`, `,"count":0,"prev"`, 1) }, "canonical"},
		{"fail/count-negative", 2, func(s string) string { return strings.Replace(s, `"count":25504`, `"count":-1`, 1) }, "wrong type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Verify(bytes.NewReader(join(replaceIn(lines, tc.line, tc.edit))))
			if be := wantBreak(t, err, tc.line); !strings.Contains(be.Reason, tc.reason) {
				t.Fatalf("reason %q does not contain %q", be.Reason, tc.reason)
			}
		})
	}
}

func TestGenesisHash(t *testing.T) {
	// SHA-256("cotal-audit/v1\x00r1"), computed independently:
	// printf 'cotal-audit/v1\0r1' | sha256sum
	const want = "4701a033a4741e76e44a48d6e73833cfce0a65f83d476bc74b9671db5311402e"
	if got := GenesisHash("r1"); got != want {
		t.Fatalf("GenesisHash(r1) = %s, want %s", got, want)
	}
	if GenesisHash("r1") == GenesisHash("r2") {
		t.Fatal("replicas share a genesis hash")
	}
}

// TestGolden pins the line format byte for byte: a change to the encoding
// would make every existing audit file fail to verify.
func TestGolden(t *testing.T) {
	path := logPath(t)
	l := openLog(t, Config{Path: path, Replica: "golden-1"}, noSync)
	recs := []Record{
		sample(0),
		{Caller: "spiffe://cotal.local/managerd/space-a", RPC: "Remint", Space: "space-a", Profile: "supervisor",
			Subject: "UCXH2TZ5VZBBXKJ3MLLAPZ6BHYQXZW4X6HJ6UMBHWNEDTF3ZTHH4WQBT", Decision: Denied, Reason: "not_own_issuer",
			RequestID: "req-7"},
		// Every escaping rule at once.
		{Caller: "spiffe://x", RPC: "Mint", Space: "quote\" back\\ nl\n tab\t ctl\x01 del\x7f <&> é \u2028",
			Profile: "agent", Subject: "bad\xffutf8", Decision: Granted, Time: time.Date(2026, 3, 1, 13, 0, 0, 120000000, time.FixedZone("x", 3600))},
	}
	for i, r := range recs {
		if err := l.Append(context.Background(), r); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "chain.golden")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("lines differ from %s:\n got: %s\nwant: %s", golden, got, want)
	}
	sum, err := Verify(bytes.NewReader(want))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Lines != 3 || len(sum.Chains) != 1 || sum.Chains[0].Seq != 3 {
		t.Fatalf("summary %+v, want 3 lines on one chain", sum)
	}
}

func TestAppendSanitizes(t *testing.T) {
	jwt, seed := testJWT, testSeed
	tests := []struct {
		name string
		in   func(*Record)
		got  func(Record) string
		want string
	}{
		{"ok/jwt-in-subject-redacted", func(r *Record) { r.Subject = jwt }, func(r Record) string { return r.Subject }, Redacted},
		{"ok/jwt-inside-request-id-redacted", func(r *Record) { r.RequestID = "x " + jwt }, func(r Record) string { return r.RequestID }, Redacted},
		{"ok/seed-in-request-id-redacted", func(r *Record) { r.RequestID = seed }, func(r Record) string { return r.RequestID }, Redacted},
		{"ok/pem-in-profile-redacted", func(r *Record) { r.Profile = "-----BEGIN PRIVATE KEY-----" }, func(r Record) string { return r.Profile }, Redacted},
		{"ok/seed-across-the-cut-redacted", func(r *Record) { r.RequestID = strings.Repeat("x", MaxFieldBytes-10) + " " + seed },
			func(r Record) string { return r.RequestID }, Redacted},
		{"ok/public-key-kept", func(r *Record) {}, func(r Record) string { return r.Subject }, sample(0).Subject},
		{"ok/long-value-cut", func(r *Record) { r.RequestID = strings.Repeat("é", 200) }, func(r Record) string { return r.RequestID },
			strings.Repeat("é", (MaxFieldBytes-3)/2) + "..."},
		{"ok/invalid-utf8-replaced", func(r *Record) { r.Profile = "a\xffb" }, func(r Record) string { return r.Profile }, "a\uFFFDb"},
		// Finding 9: "eyJ" inside a word is not a JWT, and the caller and
		// space are never redacted.
		{"ok/space-heyJude-kept", func(r *Record) { r.Space = "heyJude" }, func(r Record) string { return r.Space }, "heyJude"},
		{"ok/caller-heyJude-kept", func(r *Record) { r.Caller = "spiffe://cotal.local/managerd/heyJude" }, func(r Record) string { return r.Caller },
			"spiffe://cotal.local/managerd/heyJude"},
		{"ok/caller-never-redacted", func(r *Record) { r.Caller = "spiffe://x/" + jwt }, func(r Record) string { return r.Caller }, "spiffe://x/" + jwt},
		{"ok/request-id-eyJ-word-kept", func(r *Record) { r.RequestID = "heyJude.eyJx.y" }, func(r Record) string { return r.RequestID }, "heyJude.eyJx.y"},
		{"ok/long-base32-run-kept", func(r *Record) { r.RequestID = strings.Repeat("SA", 40) }, func(r Record) string { return r.RequestID }, strings.Repeat("SA", 40)},
		{"ok/jwt-glued-to-text-redacted", func(r *Record) { r.Profile = "agent" + jwt + "." }, func(r Record) string { return r.Profile }, Redacted},
		{"ok/seed-glued-to-text-redacted", func(r *Record) { r.JTI = "X" + seed + "Y" }, func(r Record) string { return r.JTI }, Redacted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := logPath(t)
			l := openLog(t, Config{Path: path}, noSync)
			r := sample(0)
			tc.in(&r)
			if err := l.Append(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			lines := readLines(t, path)
			if got := tc.got(decodeLine(t, lines[0])); got != tc.want {
				t.Fatalf("field = %q, want %q", got, tc.want)
			}
			for _, secret := range []string{jwt, seed, "PRIVATE KEY"} {
				if bytes.Contains(lines[0], []byte(secret)) && !strings.HasPrefix(tc.name, "ok/caller-never-redacted") {
					t.Fatalf("line holds a credential: %s", lines[0])
				}
			}
		})
	}
}

func TestAppendRefusesBadRecord(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Record)
		field string
	}{
		{"fail/unknown-decision", func(r *Record) { r.Decision = "maybe" }, "decision"},
		{"fail/empty-decision", func(r *Record) { r.Decision = "" }, "decision"},
		{"fail/denied-without-reason", func(r *Record) { r.Decision, r.Reason = Denied, "" }, "reason"},
		{"fail/reason-not-a-code", func(r *Record) { r.Decision, r.Reason = Denied, "not allowed, sorry" }, "reason"},
		{"fail/seed-as-reason", func(r *Record) {
			r.Decision, r.Reason = Denied, "SUAKYRHVIOREXV7EUZTBHUHL7NUMHPMAS7QMDU3GTIUWEI5LDNOXD43IZY"
		}, "reason"},
		{"fail/no-caller", func(r *Record) { r.Caller = "" }, "caller"},
		{"fail/no-rpc", func(r *Record) { r.RPC = "" }, "rpc"},
		{"fail/continuation-rpc-reserved", func(r *Record) { r.RPC = ContinueRPC }, "rpc"},
		{"fail/time-out-of-range", func(r *Record) { r.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "time"},
		{"fail/expiry-out-of-range", func(r *Record) { r.Expiry = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) }, "expiry"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := logPath(t)
			l := openLog(t, Config{Path: path}, noSync)
			r := sample(0)
			tc.edit(&r)
			err := l.Append(context.Background(), r)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("Append = %v, want *FieldError for %s", err, tc.field)
			}
			// A refused record does not use up a seq.
			if err := l.Append(context.Background(), sample(1)); err != nil {
				t.Fatal(err)
			}
			if got := seqs(t, readLines(t, path)); !slices.Equal(got, []uint64{1}) {
				t.Fatalf("seqs %v, want [1]", got)
			}
		})
	}
}

// FuzzSealVerify checks that whatever free text a caller passes, Append's
// sanitized line verifies (the canonical encoder and encoding/json agree).
func FuzzSealVerify(f *testing.F) {
	f.Add("spiffe://x", "Mint", "space\x00\"\\", "\u2028\xff<&>", "é\x7f", int64(0))
	f.Add("", "", "", "", "", int64(-1))
	long := strings.Repeat("\u00e9\"", 200)
	f.Add(long, long, long, long, long, int64(1<<62))
	f.Fuzz(func(t *testing.T, caller, rpc, space, subject, reqID string, ns int64) {
		r := Record{Caller: caller, RPC: rpc, Space: space, Subject: subject, RequestID: reqID,
			Decision: Granted, Time: time.Unix(0, ns), Replica: "r1", Seq: 1}
		sanitize(&r)
		line, hash := seal(genesis("r1"), &r)
		// seal encodes once; it must give what the two-pass definition gives: the hash over
		// prev and the encoding with hash "", then the encoding with the hash filled in.
		unsealed := r
		unsealed.Hash = ""
		if want := chainHash(genesis("r1"), encode(nil, &unsealed)); hash != want || r.Hash != hex.EncodeToString(want[:]) {
			t.Fatalf("seal hash %x (field %s), want %x", hash, r.Hash, want)
		}
		if want := append(encode(nil, &r), '\n'); !bytes.Equal(line, want) {
			t.Fatalf("sealed line\n%s\nwant\n%s", line, want)
		}
		sum, err := Verify(bytes.NewReader(line))
		if err != nil {
			t.Fatalf("sealed line does not verify: %v\n%s", err, line)
		}
		if sum.Lines != 1 {
			t.Fatalf("Lines = %d", sum.Lines)
		}
	})
}
