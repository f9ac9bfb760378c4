// Package lease is a broker-backed single-holder claim on one key of a KV bucket: authd's plane
// claim (key "plane" in cotal_auth_<space>) and deliveryd's lease (key "lease.0" in
// cotal_delivery_<space>) are the same mechanism (reference/delivery.md §2).
//
// The claim is a row {holder, incarnation, since, ready}, created atomically (KV create: it
// fails when a live row exists) and renewed by compare-and-set on the broker's revision. Expiry
// is the bucket's TTL (max_age): a holder that stops renewing loses its row after the TTL, so a
// crashed holder's successor waits at most that long. Acquire refuses a bucket without a TTL,
// where a crash would hold the key for ever.
//
// A row is "ours" only when both holder and incarnation match: a replacement of the same daemon
// presents the same holder, never the same incarnation. Release deletes the row by CAS on the
// revision the broker reports for our row, so it never deletes a successor's. A failed renewal
// is a question, not a verdict: Renew re-reads the key and says whether the claim is still held,
// gone, taken by another, or unknown (the broker did not answer).
//
// Early reclaim. A claimant may take a live row before its TTL (Config.Reclaim) only when its
// own check proves the holder gone; the row then names the holder (Row.Instance, Row.User,
// Row.Conn) so the check can find the holder's connection. The take is a compare-and-set at the
// revision read before the check, so a holder that renewed meanwhile keeps its claim, and a
// holder that was replaced finds its row Taken at its next renewal and stops.
//
// Fencing. A holder that cannot renew must stop its effects before any successor can hold the
// key, that is before the broker can expire its row. The broker expires a row TTL after it
// stored it, measured on the broker's own clock; the holder cannot see that instant, but it
// knows when it sent its last write that the broker stored, and the broker stored it no earlier.
// So Fence is that send time plus the TTL less Margin, on this process's monotonic clock: a
// holder that has stopped acting by Fence has stopped before the row can expire, whatever the
// offset between the two clocks. Margin (a tenth of the TTL, between 100 ms and 5 s: 3 s at the
// delivery and plane defaults of 30 s) absorbs what is left: the broker's clock running fast or
// stepping forward between the store and the expiry (NTP slews by at most 500 ppm, 15 ms over
// 30 s; a cluster's new stream leader expires by its own clock, which NTP keeps within
// milliseconds of the old one's), the holder's timer firing late on a loaded machine, and the
// effects already in flight when it fires (one round trip). What no margin covers: a forward
// step of a broker's wall clock larger than the margin, and bytes a stalled network delivers
// later than that: a fence on the holder's side bounds when an effect is issued, not when it
// lands.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Row is the value of a claimed key.
type Row struct {
	// Holder names the claimant for an operator (authd: "authd <host> pid <pid>").
	Holder string `json:"holder"`
	// Incarnation is random per Lease: it tells this process from a restart of the same holder.
	Incarnation string `json:"incarnation"`
	// Since is when the claim was created.
	Since time.Time `json:"since"`
	// Ready says the holder serves (set by SetReady once everything is bound).
	Ready bool `json:"ready"`
	// Instance, User and Conn name the holder for a connection-liveness sweep (Config.Reclaim):
	// its stable instance id, the public user nkey its claim connection authenticates with, and
	// that connection's name. Empty for a claimant that gives none (deliveryd's lease).
	Instance string `json:"instance,omitempty"`
	User     string `json:"user,omitempty"`
	Conn     string `json:"conn,omitempty"`
}

// maxRowBytes bounds a row read from the broker.
const maxRowBytes = 4096

// decodeRow reads a row strictly; a value that is not one is reported, never trusted.
func decodeRow(b []byte) (Row, error) {
	var r Row
	if len(b) > maxRowBytes {
		return r, fmt.Errorf("lease: row of %d bytes", len(b))
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("lease: row: %w", err)
	}
	if r.Holder == "" || r.Incarnation == "" {
		return r, errors.New("lease: row without holder or incarnation")
	}
	return r, nil
}

// State is what a renewal learned about the claim.
type State int

// The states of a claim after Renew.
const (
	// Held: the row is ours and its revision is current.
	Held State = iota + 1
	// Gone: the key has no row (expired or deleted); Reacquire may create it again.
	Gone
	// Taken: another holder's row is there. Do not release; stop serving.
	Taken
	// Unknown: the broker did not answer; stay quiesced and ask again.
	Unknown
)

func (s State) String() string {
	switch s {
	case Held:
		return "held"
	case Gone:
		return "gone"
	case Taken:
		return "taken"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// HeldError: a live row of another holder (or incarnation) occupies the key. It names the holder.
type HeldError struct {
	Bucket, Key string
	Row         Row
	// Reclaim is why Config.Reclaim refused to take the key (or why the take lost its
	// compare-and-set); nil when no reclaim was asked. Unwrap returns it.
	Reclaim error
}

// Details are the held claim's facts for a refusal file: holder, incarnation, since, bucket, key,
// and the holder's instance and connection name and the reclaim refusal when there are any.
func (e *HeldError) Details() map[string]string {
	d := map[string]string{"holder": e.Row.Holder, "incarnation": e.Row.Incarnation,
		"since": e.Row.Since.UTC().Format(time.RFC3339), "bucket": e.Bucket, "key": e.Key}
	if e.Row.Instance != "" {
		d["instance"] = e.Row.Instance
	}
	if e.Row.Conn != "" {
		d["conn"] = e.Row.Conn
	}
	if e.Reclaim != nil {
		d["reclaim"] = e.Reclaim.Error()
	}
	return d
}

func (e *HeldError) Error() string {
	held := fmt.Sprintf("lease: %s/%s is held by %q (incarnation %s, since %s)",
		e.Bucket, e.Key, e.Row.Holder, e.Row.Incarnation, e.Row.Since.UTC().Format(time.RFC3339))
	if e.Reclaim != nil {
		// The refusal says what to do: an inconclusive check must not send the operator after a
		// holder that may be gone.
		return held + "; not reclaimed: " + e.Reclaim.Error()
	}
	return held + "; a live claim already exists, so this instance does not start: stop that one, or wait for its claim to expire"
}

// Unwrap returns the reclaim refusal, if any.
func (e *HeldError) Unwrap() error { return e.Reclaim }

// PermissionError: the broker refused this connection's credential a subject the claim needs.
// It is never reported as another holder.
type PermissionError struct {
	Bucket, Key string
	Err         error
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("lease: %s/%s: the broker refused this credential: %v", e.Bucket, e.Key, e.Err)
}

// Unwrap returns the broker's permission error.
func (e *PermissionError) Unwrap() error { return e.Err }

// Errors.
var (
	// ErrNoTTL: the bucket keeps rows for ever (no max_age and no per-key TTLs), so a crashed
	// holder would never be replaced.
	ErrNoTTL = errors.New("lease: bucket has no TTL (neither max_age nor per-key TTLs)")
	// ErrNotHeld: an operation that needs the claim was called after it was lost or released.
	ErrNotHeld = errors.New("lease: not held")
)

// Config is what Acquire needs. Conn, Bucket, Key and Holder are required.
type Config struct {
	// Conn is a broker connection whose credential may create, update, get and delete Key in
	// Bucket, and read the bucket's stream info.
	Conn *nats.Conn
	// Bucket and Key name the claim.
	Bucket, Key string
	// Holder names this claimant for whoever finds the row.
	Holder string
	// Now is the clock for Row.Since; nil means time.Now.
	Now func() time.Time
	// OpTimeout bounds each broker operation; zero means 5 s.
	OpTimeout time.Duration
	// KeyTTL is the row's lifetime on a bucket with per-key TTLs and no max_age; zero means
	// DefaultKeyTTL. It is ignored on a bucket with a max_age, whose TTL applies. At least 1 s.
	KeyTTL time.Duration
	// Clock is the monotonic clock the fence is measured on; nil means time.Now (whose readings
	// carry Go's monotonic clock, so a wall-clock step does not move the fence).
	Clock func() time.Time
	// Instance, User and ConnName are written into the row (Row.Instance, Row.User, Row.Conn) so
	// a successor can sweep for this holder's connection. Optional.
	Instance, User, ConnName string
	// Reclaim, when set, is asked about the live row of another holder (or incarnation) that
	// Acquire finds on the key, and may let Acquire take it before its TTL: nil takes the key by
	// writing this claim's row at the revision Acquire read before asking (a compare-and-set, never
	// a blind write), so any write of the holder meanwhile voids the take and Acquire refuses with
	// a *HeldError; an error refuses, and Acquire returns a *HeldError carrying it (Reclaim). It
	// must answer nil only on conclusive proof that the holder is gone (authd: a complete
	// connection-liveness sweep that lists none of the holder's connections). A row that cannot be
	// decoded is never offered to it.
	Reclaim func(ctx context.Context, held Row) error
}

// DefaultKeyTTL is the row lifetime on a per-key-TTL bucket (the delivery lease's 30 s).
const DefaultKeyTTL = 30 * time.Second

// Lease is a claim this process holds. It is safe for concurrent use.
type Lease struct {
	cfg Config
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	ttl time.Duration
	// keyTTL is set when every write carries the row's TTL (a per-key-TTL bucket).
	keyTTL bool

	// base is the clock's reading at Acquire; fence is Fence as a duration since base, so MayAct
	// reads it without the lock.
	base  time.Time
	fence atomic.Int64

	mu  sync.Mutex // guards row, rev, written, released
	row Row
	rev uint64
	// written is when this holder sent the last write of its row the broker stored (created,
	// renewed or marked ready): read on the clock before the write left, so never later than
	// the broker's store.
	written time.Time
	// released is set by Release; nothing is written after it.
	released bool
	// freed is set once a Release settled the row (deleted it, or found it gone or another's);
	// until then a Release that failed may be called again.
	freed bool
	// reclaimed is the row Acquire replaced through Config.Reclaim.
	reclaimed *Row
}

// Acquire binds the bucket and creates Key with a new row (ready false). It refuses with a
// *HeldError naming the holder when a live row exists (another process's, or an earlier
// incarnation of this holder that has not expired), with a *PermissionError when the broker
// refuses a subject, with ErrNoTTL for a bucket without max_age, and with the bucket's missing
// stream named when it does not exist.
func Acquire(ctx context.Context, cfg Config) (*Lease, error) {
	switch {
	case cfg.Conn == nil:
		return nil, errors.New("lease: Config.Conn is nil")
	case cfg.Bucket == "" || cfg.Key == "" || cfg.Holder == "":
		return nil, errors.New("lease: Config needs Bucket, Key and Holder")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 5 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	l := &Lease{cfg: cfg, base: cfg.Clock()}
	l.fence.Store(math.MinInt64)
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	octx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
	defer cancel()
	kv, err := js.KeyValue(octx, cfg.Bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("lease: bucket %s does not exist (the space is not provisioned)", cfg.Bucket)
		}
		return nil, l.classify(fmt.Errorf("lease: bind bucket %s: %w", cfg.Bucket, err))
	}
	st, err := kv.Status(octx)
	if err != nil {
		return nil, l.classify(fmt.Errorf("lease: bucket %s status: %w", cfg.Bucket, err))
	}
	if wrapKV != nil {
		kv = wrapKV(kv)
	}
	l.js, l.kv, l.ttl = js, kv, st.TTL()
	if l.ttl <= 0 {
		bs, ok := st.(*jetstream.KeyValueBucketStatus)
		if !ok || bs.StreamInfo() == nil || !bs.StreamInfo().Config.AllowMsgTTL {
			return nil, fmt.Errorf("%w: %s", ErrNoTTL, cfg.Bucket)
		}
		switch {
		case cfg.KeyTTL == 0:
			cfg.KeyTTL = DefaultKeyTTL
		case cfg.KeyTTL < time.Second:
			return nil, fmt.Errorf("lease: KeyTTL %v is under a second", cfg.KeyTTL)
		}
		l.cfg.KeyTTL, l.ttl, l.keyTTL = cfg.KeyTTL, cfg.KeyTTL, true
	}
	inc := make([]byte, 16)
	_, _ = rand.Read(inc)
	l.row = Row{Holder: cfg.Holder, Incarnation: hex.EncodeToString(inc), Since: cfg.Now().UTC().Truncate(time.Millisecond),
		Instance: cfg.Instance, User: cfg.User, Conn: cfg.ConnName}
	if err := l.create(ctx, true); err != nil {
		return nil, err
	}
	return l, nil
}

// TTL is the bucket's TTL: a row not renewed within it expires.
func (l *Lease) TTL() time.Duration { return l.ttl }

// RenewInterval is how often to renew: half the TTL, at least a second (upstream's rule).
func (l *Lease) RenewInterval() time.Duration { return max(time.Second, l.ttl/2) }

// Margin is how long before its row can expire this holder's fence falls: a tenth of the TTL,
// at least 100 ms and at most 5 s (see the package doc for what it absorbs). It leaves a holder
// that renews every RenewInterval four tenths of the TTL to get a renewal through.
func (l *Lease) Margin() time.Duration {
	return min(5*time.Second, max(100*time.Millisecond, l.ttl/10))
}

// Fence is the instant by which this holder must have stopped every effect of holding the
// claim: the send time of its last write the broker stored, plus the TTL, less Margin, on
// Config.Clock. Only a successful write moves it (forward); a failed renewal leaves it where it
// was. Zero after Release.
func (l *Lease) Fence() time.Time {
	f := l.fence.Load()
	if f == math.MinInt64 {
		return time.Time{}
	}
	return l.base.Add(time.Duration(f))
}

// Fenced reports whether Fence has passed (or the claim was released): from then on the holder
// may not act until a write succeeds again. It takes no lock, so effects may check it each time.
func (l *Lease) Fenced() bool {
	return int64(l.cfg.Clock().Sub(l.base)) >= l.fence.Load()
}

// wrote records a write the broker stored, sent at sent, and moves the fence. mu must be held.
func (l *Lease) wrote(sent time.Time) {
	if l.released {
		return
	}
	l.written = sent
	if f := int64(sent.Sub(l.base) + l.ttl - l.Margin()); f > l.fence.Load() {
		l.fence.Store(f)
	}
}

// Row returns this claim's row.
func (l *Lease) Row() Row {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.row
}

// create is Acquire's and Reacquire's KV create; only Acquire's may reclaim (a holder that found
// its row gone and another's in its place has been replaced, and stops).
func (l *Lease) create(ctx context.Context, mayReclaim bool) error {
	l.mu.Lock()
	row := l.row
	l.mu.Unlock()
	b, _ := json.Marshal(row)
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	var opts []jetstream.KVCreateOpt
	if l.keyTTL {
		opts = append(opts, jetstream.KeyTTL(l.ttl))
	}
	for attempt := 1; ; attempt++ {
		sent := l.cfg.Clock()
		rev, err := l.kv.Create(octx, l.cfg.Key, b, opts...)
		if err == nil {
			l.mu.Lock()
			l.rev = rev
			l.wrote(sent)
			l.mu.Unlock()
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return l.classify(fmt.Errorf("lease: create %s/%s: %w", l.cfg.Bucket, l.cfg.Key, err))
		}
		e, gerr := l.kv.Get(octx, l.cfg.Key)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) && attempt < createAttempts {
			continue // the row expired or was released between the create and the read: create again
		}
		if gerr != nil {
			return l.classify(fmt.Errorf("lease: %s/%s exists but cannot be read: %w", l.cfg.Bucket, l.cfg.Key, gerr))
		}
		other, derr := decodeRow(e.Value())
		if derr != nil {
			return fmt.Errorf("lease: %s/%s holds a value that is not a claim row: %w", l.cfg.Bucket, l.cfg.Key, derr)
		}
		if l.cfg.Reclaim == nil || !mayReclaim {
			return &HeldError{Bucket: l.cfg.Bucket, Key: l.cfg.Key, Row: other}
		}
		return l.reclaim(ctx, other, e.Revision())
	}
}

// createAttempts bounds create's tries when the row it found is gone by the time it reads it (a
// crashed holder's row expiring at that moment; a successor starting then must not fail on it).
const createAttempts = 3

// wrapKV is nil outside tests: a test sets it (export_test.go) to make create's race happen.
var wrapKV func(jetstream.KeyValue) jetstream.KeyValue

// reclaim asks Config.Reclaim about the held row read at rev and, on its nil, writes this
// claim's row at rev (CAS), keeping the TTL the bucket needs. A write of anyone else after rev
// makes the CAS fail: the take is refused, never retried blind.
func (l *Lease) reclaim(ctx context.Context, held Row, rev uint64) error {
	if err := l.cfg.Reclaim(ctx, held); err != nil {
		return &HeldError{Bucket: l.cfg.Bucket, Key: l.cfg.Key, Row: held, Reclaim: err}
	}
	l.mu.Lock()
	l.rev = rev
	l.mu.Unlock()
	if err := l.update(ctx, l.Row()); err != nil {
		if cerr := l.classify(err); errors.As(cerr, new(*PermissionError)) {
			return cerr
		}
		return &HeldError{Bucket: l.cfg.Bucket, Key: l.cfg.Key, Row: held,
			Reclaim: fmt.Errorf("the row changed while its holder was swept, so the compare-and-set at revision %d lost: %w", rev, err)}
	}
	l.mu.Lock()
	l.reclaimed = &held
	l.mu.Unlock()
	return nil
}

// Reclaimed is the row this claim replaced through Config.Reclaim, or nil when Acquire created
// the key.
func (l *Lease) Reclaimed() *Row {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reclaimed == nil {
		return nil
	}
	r := *l.reclaimed
	return &r
}

// classify is Classify for this claim.
func (l *Lease) classify(err error) error { return Classify(l.cfg.Conn, l.cfg.Bucket, l.cfg.Key, err) }

// Classify turns a failure the broker caused by refusing a subject into a *PermissionError for
// bucket/key, and returns any other error as it is. A denied publish or request is not answered
// (the broker sends the violation asynchronously), so the call itself times out; nc's last error
// says why. Other claims on a KV key (managerd's instance lease) use it to report a refused
// credential as such, never as another holder.
func Classify(nc *nats.Conn, bucket, key string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, nats.ErrPermissionViolation) {
		return &PermissionError{Bucket: bucket, Key: key, Err: err}
	}
	last := nc.LastError()
	if last != nil && errors.Is(last, nats.ErrPermissionViolation) &&
		(strings.Contains(last.Error(), bucket) || strings.Contains(strings.ToLower(last.Error()), "$js.api")) {
		return &PermissionError{Bucket: bucket, Key: key, Err: fmt.Errorf("%w (after: %v)", last, err)}
	}
	return err
}

// update writes row at the current revision (CAS). Callers hold no lock.
func (l *Lease) update(ctx context.Context, row Row) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return ErrNotHeld
	}
	rev := l.rev
	l.mu.Unlock()
	b, _ := json.Marshal(row)
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	var nrev uint64
	var err error
	sent := l.cfg.Clock()
	if l.keyTTL {
		// KeyValue.Update carries no TTL, so a row written with it would never expire: publish
		// the same CAS write with the row's TTL.
		var ack *jetstream.PubAck
		ack, err = l.js.PublishMsg(octx, &nats.Msg{Subject: "$KV." + l.cfg.Bucket + "." + l.cfg.Key, Data: b},
			jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgTTL(l.ttl))
		if err == nil {
			nrev = ack.Sequence
		}
	} else {
		nrev, err = l.kv.Update(octx, l.cfg.Key, b, rev)
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.rev, l.row = nrev, row
	l.wrote(sent)
	l.mu.Unlock()
	return nil
}

// LastWritten is when this holder sent the last write of its row the broker stored (created,
// renewed or marked ready), on Config.Clock: a daemon's proof of progress for systemd's watchdog
// (zero before the first write).
func (l *Lease) LastWritten() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written
}

// SetReady writes the row with Ready set to ready, by CAS. A failure leaves the claim as it
// was; Renew says what became of it.
func (l *Lease) SetReady(ctx context.Context, ready bool) error {
	row := l.Row()
	row.Ready = ready
	if err := l.update(ctx, row); err != nil {
		return l.classify(fmt.Errorf("lease: mark %s/%s ready=%v: %w", l.cfg.Bucket, l.cfg.Key, ready, err))
	}
	return nil
}

// Renew rewrites the row by CAS, restarting its TTL. On success it returns Held. On failure it
// re-reads the key: Held when the row there is still ours (its revision is adopted, and the
// rewrite retried once), Gone when there is no row, Taken when another holder's row is there,
// and Unknown when the broker did not answer; the error says what failed.
func (l *Lease) Renew(ctx context.Context) (State, error) {
	err := l.update(ctx, l.Row())
	if err == nil {
		return Held, nil
	}
	if errors.Is(err, ErrNotHeld) {
		return Gone, err
	}
	st, rerr := l.reread(ctx)
	if st == Held {
		if err := l.update(ctx, l.Row()); err != nil {
			return Unknown, l.classify(fmt.Errorf("lease: renew %s/%s after re-read: %w", l.cfg.Bucket, l.cfg.Key, err))
		}
		return Held, nil
	}
	if rerr == nil {
		rerr = l.classify(fmt.Errorf("lease: renew %s/%s: %w", l.cfg.Bucket, l.cfg.Key, err))
	}
	return st, rerr
}

// reread reads the key and grades it; a Held answer adopts the broker's revision.
func (l *Lease) reread(ctx context.Context) (State, error) {
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	e, err := l.kv.Get(octx, l.cfg.Key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return Gone, nil
	case err != nil:
		return Unknown, l.classify(fmt.Errorf("lease: re-read %s/%s: %w", l.cfg.Bucket, l.cfg.Key, err))
	}
	other, derr := decodeRow(e.Value())
	mine := l.Row()
	if derr != nil || other.Holder != mine.Holder || other.Incarnation != mine.Incarnation {
		if derr != nil {
			other = Row{Holder: "(unreadable row)"}
		}
		return Taken, &HeldError{Bucket: l.cfg.Bucket, Key: l.cfg.Key, Row: other}
	}
	l.mu.Lock()
	l.rev = e.Revision()
	l.mu.Unlock()
	return Held, nil
}

// Reacquire creates the row again after Renew said Gone (same incarnation, ready false). It
// refuses like Acquire, with a *HeldError if another holder got there first.
func (l *Lease) Reacquire(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return ErrNotHeld
	}
	l.row.Ready = false
	l.mu.Unlock()
	return l.create(ctx, false)
}

// Release deletes the row if, on a fresh read, it is still ours, by CAS on the revision just
// read, so a successor's row is never deleted. If the row is another's or gone it does nothing
// and returns nil; if the broker does not answer the row is left to expire with the TTL and the
// error says so. After the first call Renew and SetReady refuse with ErrNotHeld. Release is
// idempotent once it has settled the row; a call that failed may be made again (after the
// connection came back, say), and tries again.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.freed {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	l.fence.Store(math.MinInt64) // a releasing holder acts no more
	l.mu.Unlock()
	st, err := l.reread(ctx)
	if st != Held {
		if st == Unknown {
			return fmt.Errorf("lease: release left to the TTL: %w", err)
		}
		l.setFreed()
		return nil
	}
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	if err := l.kv.Delete(octx, l.cfg.Key, jetstream.LastRevision(rev)); err != nil {
		return l.classify(fmt.Errorf("lease: release %s/%s left to the TTL: %w", l.cfg.Bucket, l.cfg.Key, err))
	}
	l.setFreed()
	return nil
}

func (l *Lease) setFreed() {
	l.mu.Lock()
	l.freed = true
	l.mu.Unlock()
}
