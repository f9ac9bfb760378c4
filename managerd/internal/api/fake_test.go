package api

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// fakeBackend stands in for managerd's Manager (tested in its own package): each method returns
// what the test set, and calls counts every call, so a test can prove the Backend was never
// reached.
type fakeBackend struct {
	calls atomic.Int64

	mu         sync.Mutex
	err        error // returned by every method when set
	agents     []*managerv1.Agent
	terminals  map[string]*fakeTerminal
	lastSpawn  *managerv1.SpawnRequest
	spawnPeer  PeerInfo
	lastName   string
	withAgents bool
}

var _ Backend = (*fakeBackend)(nil)

func newFakeBackend() *fakeBackend {
	return &fakeBackend{terminals: map[string]*fakeTerminal{}}
}

func (b *fakeBackend) setErr(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.err = err
}

func (b *fakeBackend) enter(name string) error {
	b.calls.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastName = name
	return b.err
}

func (b *fakeBackend) Spawn(ctx context.Context, req *managerv1.SpawnRequest) (*managerv1.Agent, error) {
	if err := b.enter(req.GetName()); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastSpawn = req
	b.spawnPeer, _ = PeerFromContext(ctx)
	return &managerv1.Agent{Name: req.GetName(), Connector: req.GetConnector(), Pid: 4242,
		Process: managerv1.ProcessState_PROCESS_STATE_RUNNING}, nil
}

func (b *fakeBackend) Stop(_ context.Context, name string) (*managerv1.StopResponse, error) {
	if err := b.enter(name); err != nil {
		return nil, err
	}
	return &managerv1.StopResponse{Agent: &managerv1.Agent{Name: name, Process: managerv1.ProcessState_PROCESS_STATE_EXITED},
		Deprovisioned: []string{"dm_" + name, "dlv_" + name}}, nil
}

func (b *fakeBackend) List(context.Context) ([]*managerv1.Agent, error) {
	if err := b.enter(""); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.agents, nil
}

func (b *fakeBackend) Inspect(_ context.Context, name string) (*managerv1.InspectResponse, error) {
	if err := b.enter(name); err != nil {
		return nil, err
	}
	return &managerv1.InspectResponse{Agent: &managerv1.Agent{Name: name}, Durables: []string{"dm_" + name},
		Renewal: &managerv1.Renewal{Failures: 2}}, nil
}

func (b *fakeBackend) Terminal(name string) (Terminal, error) {
	if err := b.enter(name); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.terminals[name]
	if !ok {
		return nil, errors.New("fake: no terminal " + name)
	}
	return t, nil
}

func (b *fakeBackend) Status(context.Context) (*managerv1.StatusResponse, error) {
	if err := b.enter(""); err != nil {
		return nil, err
	}
	return &managerv1.StatusResponse{Space: "alpha", InstanceId: "i-1", Lease: managerv1.LeaseState_LEASE_STATE_HELD,
		Connectors: []string{"echo"}, Capacity: 8}, nil
}

func (b *fakeBackend) Shutdown(_ context.Context, withAgents bool) (*managerv1.ShutdownResponse, error) {
	if err := b.enter(""); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.withAgents = withAgents
	return &managerv1.ShutdownResponse{Spared: []string{"a"}}, nil
}

// fakeTerminal is a scripted PTY: each Attach gets its own output channel (announced on subs),
// writes and resizes are recorded, exit is closed by the test.
type fakeTerminal struct {
	snapshot []byte
	subs     chan *fakeSub
	exited   chan struct{}
	code     atomic.Int32
	writeErr error

	mu      sync.Mutex
	written bytes.Buffer
	resizes [][2]uint16
	changed chan struct{} // signalled (non-blocking) on every write or resize
}

// fakeSub is one Attach subscription.
type fakeSub struct {
	out      chan []byte
	lagged   atomic.Bool
	detached chan struct{}
	once     sync.Once
}

var _ Terminal = (*fakeTerminal)(nil)

func newFakeTerminal(snapshot []byte) *fakeTerminal {
	return &fakeTerminal{snapshot: snapshot, subs: make(chan *fakeSub, 16), exited: make(chan struct{}),
		changed: make(chan struct{}, 1)}
}

func (t *fakeTerminal) Attach() ([]byte, <-chan []byte, func() bool, func(), error) {
	s := &fakeSub{out: make(chan []byte, 64), detached: make(chan struct{})}
	t.subs <- s
	return bytes.Clone(t.snapshot), s.out, s.lagged.Load, func() { s.once.Do(func() { close(s.detached) }) }, nil
}

func (t *fakeTerminal) Write(_ context.Context, p []byte) (int, error) {
	if t.writeErr != nil {
		return 0, t.writeErr
	}
	t.mu.Lock()
	t.written.Write(p)
	t.mu.Unlock()
	t.signal()
	return len(p), nil
}

func (t *fakeTerminal) Resize(rows, cols uint16) error {
	t.mu.Lock()
	t.resizes = append(t.resizes, [2]uint16{rows, cols})
	t.mu.Unlock()
	t.signal()
	return nil
}

func (t *fakeTerminal) signal() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

func (t *fakeTerminal) Exited() <-chan struct{} { return t.exited }
func (t *fakeTerminal) ExitCode() int32         { return t.code.Load() }

func (t *fakeTerminal) state() ([]byte, [][2]uint16) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.written.Bytes()), append([][2]uint16(nil), t.resizes...)
}
