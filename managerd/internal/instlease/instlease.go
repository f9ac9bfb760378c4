// Package instlease is managerd's instance lease (issue 11 item 2; reference/manager.md §1.2):
// one key per manager instance, lease.<instanceId> in the space's manager bucket
// cotal_manager_<space>, whose max_age (10 s, pkg/provision) is the lease's TTL. The holder
// renews every TTL/4 (2.5 s) by compare-and-set on the broker's revision; its row is upstream's
// {holder, instanceId, runtime, root, pid, since} (lifecycle.ManagerLease, the codec authd reads
// it with), to which SetRegistration adds the processEpoch and registrationRevision authd
// committed for this start; Release compares the broker's row with that rewritten row.
//
// Acquire is an atomic KV create. When a row is already there it decides, from the row alone:
//   - another root holds it: refused with *LeaseHeld (SameRoot false), whatever its pid;
//   - this root, a live process (its /proc entry is there and not a zombie, or a lease this
//     process still holds): refused with *LeaseHeld (SameRoot true);
//   - this root, a dead predecessor (its pid gone, or this process's own earlier start that is
//     no longer held): it waits for the old row to expire (at most the TTL plus a margin, and
//     ctx), then creates its own.
//
// A row that cannot be read, does not decode, or names another instance, and a broker that
// refuses or does not answer, are plain errors (a *lease.PermissionError when the credential was
// refused), never *LeaseHeld: a conflict is reported only when a row proves one.
//
// Renew rewrites the row by CAS; a deleted or expired key is put again by the next renew, and a
// row another holder created meanwhile is left alone (Taken). Release marks the lease stopping,
// so no renew in flight or later ever puts the row again, then deletes the row by CAS on the
// revision it just read, only when that row is this lease's own.
//
// managerd's Start acquires the lease once its supervisor credential is proven, runs Run in its
// group, and calls Release only after every child is proven gone (issue 11 item 5); a Stop that
// cannot prove that keeps the lease.
//
// The mechanism beneath (the bucket's TTL as expiry, CAS create/update/delete, permission
// classification) is pkg/lease's; that package's Lease type is not used because its row
// ({holder, incarnation, since as RFC 3339, ready}) is not upstream's manager row and its
// refusal is unconditional, where this lease waits out a dead predecessor.
package instlease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Row is the value of one instance's lease key: lifecycle.ManagerLease, whose codec authd reads
// the row with too.
type Row = lifecycle.ManagerLease

// DecodeRow decodes and validates a lease row as Acquire reads it (for managerd's own tests and
// tools that read the bucket).
func DecodeRow(b []byte) (Row, error) { return lifecycle.DecodeManagerLease(b) }

// Defaults (upstream's MANAGER_LEASE_* numbers, packages/core/src/streams.ts).
const (
	// DefaultOpTimeout bounds each broker operation: upstream's 2 s per renewal attempt.
	DefaultOpTimeout = 2 * time.Second
	// DefaultWaitMargin is added to the TTL when waiting out a dead predecessor's row: the
	// broker's expiry runs a little after max_age.
	DefaultWaitMargin = 3 * time.Second
)

// ErrStopping: Renew was called on a lease Release has begun to release; nothing is written.
var ErrStopping = errors.New("instlease: the lease is stopping")

// LeaseHeld is Acquire's refusal: a row proves the instance is served elsewhere, by a live
// process on this root (SameRoot) or by any holder on another root.
type LeaseHeld struct {
	Bucket, Key string
	// Row is the holder's row as read from the broker.
	Row Row
	// SameRoot says the holder serves from this lease's root.
	SameRoot bool
}

func (e *LeaseHeld) Error() string {
	since := time.UnixMilli(e.Row.Since).UTC().Format(time.RFC3339)
	if e.SameRoot {
		return fmt.Sprintf("manager instance %s already serves from this root (%s/%s: holder %q, %s, pid %d, root %s, since %s): stop it first",
			e.Row.InstanceID, e.Bucket, e.Key, e.Row.Holder, e.Row.Runtime, e.Row.PID, e.Row.Root, since)
	}
	return fmt.Sprintf("manager instance %s is held from another root (%s/%s: holder %q, %s, pid %d, root %s, since %s): stop that manager, or give this one its own instance id",
		e.Row.InstanceID, e.Bucket, e.Key, e.Row.Holder, e.Row.Runtime, e.Row.PID, e.Row.Root, since)
}

// Config is what Acquire needs. Conn, Names, InstanceID, Holder, Runtime and Root are required.
type Config struct {
	// Conn is a broker connection whose credential may bind and read the manager bucket and
	// publish to its lease.* keys (the supervisor profile).
	Conn *nats.Conn
	// Names is the space.
	Names space.Names
	// InstanceID is the manager instance (UID grammar); the key is lease.<InstanceID>.
	InstanceID string
	// Holder is the manager's endpoint principal, <owner>.<actor>.
	Holder string
	// Runtime is how agents run ("pty").
	Runtime string
	// Root is the workspace root, an absolute path; it is cleaned.
	Root string
	// PID is this process's id; zero means os.Getpid().
	PID int
	// Alive reports whether pid is a live process on this host; nil means ProcAlive.
	Alive func(pid int) bool
	// Now is the clock for Row.Since; nil means time.Now.
	Now func() time.Time
	// OpTimeout bounds each broker operation; zero means DefaultOpTimeout.
	OpTimeout time.Duration
	// WaitMargin is added to the TTL when waiting out a dead predecessor; zero means
	// DefaultWaitMargin.
	WaitMargin time.Duration
	// Logger receives the wait and the renew loop's state changes; nil discards them.
	Logger *slog.Logger
	// OnChange, if set, is called by Run on its own goroutine after a renewal whose outcome
	// differs from the previous one's (from Held to Unknown, say), with that renewal's error, and
	// after a renewal that found the row gone and put it again (from Gone to Held): the lease was
	// lost for a while. It must not block.
	OnChange func(from, to lease.State, err error)
}

// Lease is an instance lease this process holds. It is safe for concurrent use.
type Lease struct {
	cfg    Config
	bucket string
	key    string
	kv     jetstream.KeyValue
	ttl    time.Duration
	row    Row

	// renewMu makes renewals single-flight; Release takes it to await one in flight.
	renewMu sync.Mutex
	mu      sync.Mutex // guards rev, renewed, state, stopping, freed, reput
	rev     uint64
	renewed time.Time
	state   lease.State
	// stopping is set by Release; nothing is written after it.
	stopping bool
	// freed is set once Release settled the row.
	freed bool
	// reput is set by a renewal that put the row again; Run reports and clears it.
	reput   bool
	stopped chan struct{} // closed when stopping is set
}

// held are the leases this process holds and has not begun to release, by heldKey: a row of this
// process that one of them wrote is a live double start, not a dead predecessor.
var held sync.Map // heldKey -> *Lease

// heldKey names a row on a key: the bucket, the key and the whole row (a row of this pid with
// another since is an earlier start).
type heldKey struct {
	bucket, key string
	row         Row
}

// Acquire creates the instance's row, waiting out a dead predecessor's (see the package doc). It
// refuses with *LeaseHeld only when a row proves a live holder on this root or any holder on
// another root; every other failure is a plain error naming the bucket and key.
func Acquire(ctx context.Context, cfg Config) (*Lease, error) {
	switch {
	case cfg.Conn == nil:
		return nil, errors.New("instlease: Config.Conn is nil")
	case cfg.Holder == "" || cfg.Runtime == "":
		return nil, errors.New("instlease: Config needs Holder and Runtime")
	case !filepath.IsAbs(cfg.Root):
		return nil, fmt.Errorf("instlease: root %q is not an absolute path", cfg.Root)
	}
	bucket, err := cfg.Names.Bucket(space.Manager)
	if err != nil {
		return nil, fmt.Errorf("instlease: %w", err)
	}
	key, err := space.ManagerLeaseKey(cfg.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("instlease: %w", err)
	}
	cfg.Root = filepath.Clean(cfg.Root)
	if cfg.PID == 0 {
		cfg.PID = os.Getpid()
	}
	if cfg.Alive == nil {
		cfg.Alive = ProcAlive
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.WaitMargin <= 0 {
		cfg.WaitMargin = DefaultWaitMargin
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Lease{cfg: cfg, bucket: bucket, key: key, stopped: make(chan struct{})}
	l.row = Row{Holder: cfg.Holder, InstanceID: cfg.InstanceID, Runtime: cfg.Runtime, Root: cfg.Root, PID: cfg.PID, Since: cfg.Now().UnixMilli()}
	if err := l.row.Validate(); err != nil {
		return nil, fmt.Errorf("instlease: %w", err)
	}
	if err := l.bind(ctx); err != nil {
		return nil, err
	}
	var deadline time.Time
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("instlease: acquire %s/%s: %w", bucket, key, err)
		}
		rev, err := l.create(ctx)
		if err == nil {
			l.mu.Lock()
			l.rev, l.state, l.renewed = rev, lease.Held, time.Now()
			l.mu.Unlock()
			held.Store(heldKey{bucket, key, l.row}, l)
			return l, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, l.classify(fmt.Errorf("instlease: create %s/%s: %w", bucket, key, err))
		}
		other, orev, found, err := l.read(ctx)
		if err != nil {
			return nil, err
		}
		if !found {
			// Expired between the create and the read: create again, within the same bound, so
			// a broker whose create and read disagree cannot keep this loop going.
			if deadline.IsZero() {
				deadline = time.Now().Add(l.ttl + cfg.WaitMargin)
			} else if time.Now().After(deadline) {
				return nil, fmt.Errorf("instlease: %s/%s: the create keeps finding a row the read does not", bucket, key)
			}
			continue
		}
		if !l.predecessorDead(other) {
			return nil, &LeaseHeld{Bucket: bucket, Key: key, Row: other, SameRoot: other.Root == l.row.Root}
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(l.ttl + cfg.WaitMargin)
		}
		cfg.Logger.Info("manager lease: waiting for a dead predecessor's row to expire",
			"bucket", bucket, "key", key, "pid", other.PID, "root", other.Root, "ttl", l.ttl)
		if err := l.waitChange(ctx, orev, other, deadline); err != nil {
			return nil, err
		}
	}
}

// bind opens the bucket and reads its TTL; a bucket without max_age is refused (a crashed
// holder's row would never expire, and the wait would have no bound).
func (l *Lease) bind(ctx context.Context) error {
	js, err := jetstream.New(l.cfg.Conn)
	if err != nil {
		return fmt.Errorf("instlease: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	kv, err := js.KeyValue(octx, l.bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("instlease: bucket %s does not exist (the space is not provisioned)", l.bucket)
		}
		return l.classify(fmt.Errorf("instlease: bind bucket %s: %w", l.bucket, err))
	}
	st, err := kv.Status(octx)
	if err != nil {
		return l.classify(fmt.Errorf("instlease: bucket %s status: %w", l.bucket, err))
	}
	if st.TTL() <= 0 {
		return fmt.Errorf("%w: %s has no max_age", lease.ErrNoTTL, l.bucket)
	}
	l.kv, l.ttl = kv, st.TTL()
	return nil
}

func (l *Lease) classify(err error) error {
	return lease.Classify(l.cfg.Conn, l.bucket, l.key, err)
}

// create puts this lease's row if the key has none.
func (l *Lease) create(ctx context.Context) (uint64, error) {
	b, err := lifecycle.EncodeManagerLease(l.currentRow())
	if err != nil {
		return 0, err
	}
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	return l.kv.Create(octx, l.key, b)
}

// read gets the key's row: found false when there is none; an unreadable or undecodable value,
// or a row of another instance, is a plain error naming the key.
func (l *Lease) read(ctx context.Context) (Row, uint64, bool, error) {
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	e, err := l.kv.Get(octx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return Row{}, 0, false, nil
	case err != nil:
		return Row{}, 0, false, l.classify(fmt.Errorf("instlease: the lease %s/%s could not be read: %w", l.bucket, l.key, err))
	}
	r, err := lifecycle.DecodeManagerLease(e.Value())
	if err != nil {
		return Row{}, 0, false, fmt.Errorf("instlease: the lease %s/%s holds a value that is not a manager lease row: %w", l.bucket, l.key, err)
	}
	if r.InstanceID != l.cfg.InstanceID {
		return Row{}, 0, false, fmt.Errorf("instlease: the lease %s/%s holds a row of instance %s", l.bucket, l.key, r.InstanceID)
	}
	return r, e.Revision(), true, nil
}

// predecessorDead says whether other, the row on our key, is a predecessor whose row we may wait
// out: it serves this root and its process is gone (or is this process, in a lease no longer
// held). Another root is never dead to us: its pid means nothing on this host.
func (l *Lease) predecessorDead(other Row) bool {
	if other.Root != l.cfg.Root {
		return false
	}
	if other.PID == l.cfg.PID {
		_, live := held.Load(heldKey{l.bucket, l.key, other})
		return !live
	}
	return !l.cfg.Alive(other.PID)
}

// waitChange polls the key until its row is gone or replaced (revision moved), ctx ends, or
// deadline passes. There is no watch: the supervisor credential may read keys, not create
// consumers on the bucket.
func (l *Lease) waitChange(ctx context.Context, rev uint64, other Row, deadline time.Time) error {
	every := min(max(l.ttl/20, 50*time.Millisecond), 500*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("instlease: waiting for %s/%s (dead predecessor pid %d) to expire: %w", l.bucket, l.key, other.PID, ctx.Err())
		case <-t.C:
		}
		_, nrev, found, err := l.read(ctx)
		if err != nil {
			return err
		}
		if !found || nrev != rev {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("instlease: the row of dead predecessor pid %d on %s/%s did not expire within the TTL %v plus %v; is the bucket's max_age honoured?",
				other.PID, l.bucket, l.key, l.ttl, l.cfg.WaitMargin)
		}
	}
}

// TTL is the bucket's max_age: a row not renewed within it expires.
func (l *Lease) TTL() time.Duration { return l.ttl }

// RenewInterval is TTL/4 (upstream's MANAGER_LEASE_RENEW_MS, 2.5 s for the 10 s bucket).
func (l *Lease) RenewInterval() time.Duration { return l.ttl / 4 }

// Row is this lease's row.
func (l *Lease) Row() Row { return l.currentRow() }

func (l *Lease) currentRow() Row {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.row
}

// SetRegistration rewrites this lease's row, by compare-and-set on the revision this lease last
// wrote, with the process epoch and registration revision authd committed for this start: every
// later renewal writes that row, and Release deletes only that row. On any failure (the broker
// did not answer, or the row moved: a renewal that put it again) the row is unchanged and the
// caller may call again; after Release began it writes nothing and returns ErrStopping.
func (l *Lease) SetRegistration(ctx context.Context, processEpoch, registrationRevision uint64) error {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	if l.isStopping() {
		return ErrStopping
	}
	l.mu.Lock()
	old, rev := l.row, l.rev
	l.mu.Unlock()
	next := old
	next.ProcessEpoch, next.RegistrationRevision = processEpoch, registrationRevision
	b, err := lifecycle.EncodeManagerLease(next)
	if err != nil {
		return fmt.Errorf("instlease: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	nrev, err := l.kv.Update(octx, l.key, b, rev)
	if err != nil {
		return l.classify(fmt.Errorf("instlease: record the registration in %s/%s: %w", l.bucket, l.key, err))
	}
	l.mu.Lock()
	l.row, l.rev, l.renewed, l.state = next, nrev, time.Now(), lease.Held
	// The live-start marker follows the row (a row of this process is a live double start only
	// if it is the row a held lease last wrote), unless Release began meanwhile.
	held.CompareAndDelete(heldKey{l.bucket, l.key, old}, l)
	if !l.stopping {
		held.Store(heldKey{l.bucket, l.key, next}, l)
	}
	l.mu.Unlock()
	return nil
}

// Key is the lease's bucket and key.
func (l *Lease) Key() (bucket, key string) { return l.bucket, l.key }

// State is what the last renewal learned (Held after Acquire).
func (l *Lease) State() lease.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

func (l *Lease) isStopping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopping
}

func (l *Lease) set(rev uint64, st lease.State) {
	l.mu.Lock()
	if rev != 0 {
		l.rev = rev
		l.renewed = time.Now()
	}
	l.state = st
	l.mu.Unlock()
}

// LastRenewed is when this process last wrote its row (created or renewed): managerd's proof of
// progress for systemd's watchdog.
func (l *Lease) LastRenewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed
}

// Renew rewrites the row by CAS, restarting its TTL, and says what it found: Held (renewed, or
// put again after the key was deleted or expired), Taken (another row is there; it is left
// alone, and a later renew puts ours again once it is gone), or Unknown (the broker did not
// answer or refused). After Release began it writes nothing and returns ErrStopping.
func (l *Lease) Renew(ctx context.Context) (lease.State, error) {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	if l.isStopping() {
		return lease.Gone, ErrStopping
	}
	b, err := lifecycle.EncodeManagerLease(l.currentRow())
	if err != nil {
		return lease.Unknown, err
	}
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	nrev, uerr := l.kv.Update(octx, l.key, b, rev)
	if uerr == nil {
		l.set(nrev, lease.Held)
		return lease.Held, nil
	}
	other, orev, found, rerr := l.read(ctx)
	switch {
	case rerr != nil:
		l.set(0, lease.Unknown)
		return lease.Unknown, rerr
	case !found:
		// Deleted or expired: put it again (the stopping flag was checked under renewMu, which
		// Release takes before it deletes, so a stopping lease never gets here).
		nrev, cerr := l.create(ctx)
		if cerr != nil {
			l.set(0, lease.Unknown)
			return lease.Unknown, l.classify(fmt.Errorf("instlease: re-put %s/%s: %w", l.bucket, l.key, cerr))
		}
		l.set(nrev, lease.Held)
		l.mu.Lock()
		l.reput = true
		l.mu.Unlock()
		l.cfg.Logger.Warn("manager lease: the key was gone; put again", "bucket", l.bucket, "key", l.key)
		return lease.Held, nil
	case other == l.currentRow():
		// Our own row at a revision we did not write: adopt it and renew once more.
		nrev, uerr = l.kv.Update(octx, l.key, b, orev)
		if uerr != nil {
			l.set(0, lease.Unknown)
			return lease.Unknown, l.classify(fmt.Errorf("instlease: renew %s/%s after re-read: %w", l.bucket, l.key, uerr))
		}
		l.set(nrev, lease.Held)
		return lease.Held, nil
	}
	l.set(0, lease.Taken)
	return lease.Taken, &LeaseHeld{Bucket: l.bucket, Key: l.key, Row: other, SameRoot: other.Root == l.cfg.Root}
}

// Run renews every RenewInterval until ctx ends or Release begins; it logs each change of state,
// reports it to Config.OnChange, and returns nil (losing the key does not end it: the next renew
// puts it again).
func (l *Lease) Run(ctx context.Context) error {
	t := time.NewTicker(l.RenewInterval())
	defer t.Stop()
	last := l.State()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-l.stopped:
			return nil
		case <-t.C:
		}
		st, err := l.Renew(ctx)
		if errors.Is(err, ErrStopping) {
			return nil
		}
		l.mu.Lock()
		reput := l.reput
		l.reput = false
		l.mu.Unlock()
		if st != last {
			l.cfg.Logger.Warn("manager lease: state changed", "bucket", l.bucket, "key", l.key, "from", last.String(), "to", st.String(), "err", err)
			if l.cfg.OnChange != nil {
				l.cfg.OnChange(last, st, err)
			}
			last = st
		} else if reput && l.cfg.OnChange != nil {
			l.cfg.OnChange(lease.Gone, st, nil)
		}
	}
}

// releaseAttempts bounds Release's read-then-delete rounds. A round the broker does not answer
// is tried again: a supervisor's connection is cut and reconnected each time its credential
// expires, and a request sent across that cut loses its reply though the broker is fine.
const releaseAttempts = 3

// Release marks the lease stopping (no renewal puts the row again, and Run returns), awaits a
// renewal in flight, then deletes the row by CAS on the revision it just read, only if that row
// is this lease's own: a successor's row is never deleted. A row another holder wrote, or no row,
// leaves nothing to do. A round the broker does not answer (each operation bounded by OpTimeout)
// is tried again, up to releaseAttempts rounds while ctx lasts, each from a fresh read: a delete
// that landed but whose reply was lost then reads as no row. If no round is answered, or the
// connection is closed or refused, the row is left to expire with the TTL and the error says
// so; Release may be called again.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if !l.stopping {
		l.stopping = true
		close(l.stopped)
	}
	l.mu.Unlock()
	held.CompareAndDelete(heldKey{l.bucket, l.key, l.currentRow()}, l)
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	l.mu.Lock()
	freed := l.freed
	l.mu.Unlock()
	if freed {
		return nil
	}
	var deleted bool
	var err error
	for range releaseAttempts {
		if deleted, err = l.releaseOnce(ctx); err == nil || !unanswered(err) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return l.classify(fmt.Errorf("instlease: release %s/%s left to the TTL: %w", l.bucket, l.key, err))
	}
	l.setFreed()
	if deleted {
		l.set(0, lease.Gone)
	}
	return nil
}

// releaseOnce is one round of Release: read the row, delete it by CAS if it is this lease's.
// deleted says this round deleted it; no row, or another's, is no error and nothing deleted.
func (l *Lease) releaseOnce(ctx context.Context) (deleted bool, err error) {
	octx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
	defer cancel()
	e, err := l.kv.Get(octx, l.key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	case err != nil:
		return false, err
	}
	if r, derr := lifecycle.DecodeManagerLease(e.Value()); derr != nil || r != l.currentRow() {
		return false, nil
	}
	if err := l.kv.Delete(octx, l.key, jetstream.LastRevision(e.Revision())); err != nil {
		return false, err
	}
	return true, nil
}

// unanswered reports whether err is the broker not answering in time (worth another round), as
// opposed to a closed connection or a refusal.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

func (l *Lease) setFreed() {
	l.mu.Lock()
	l.freed = true
	l.mu.Unlock()
}

// ProcAlive reports whether pid is a live process on this host: /proc/<pid> exists and is not a
// zombie. Without /proc, or when the entry cannot be read (hidepid), it answers true, so a lease
// is refused rather than waited for. A pid reused by an unrelated process also reads as alive: the
// row carries no process start time (upstream's fields), so that case refuses too.
func ProcAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// The state is the first field after the command, which is in parentheses and may hold any
	// byte, so read it after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	st := b[i+2]
	return st != 'Z' && st != 'X'
}
