// Command apitest serves the real ManagerService (managerd/internal/api) over a Unix socket with
// a scripted Backend, for the TypeScript SDK's tests (sdk/ts/test/manager.test.ts), which build
// it with go build. It is a test fixture, not a daemon: it holds no agent and no credential.
//
//	apitest --socket PATH [--allow-uid UID]...
//
// It prints "ready" once the socket accepts and serves until stdin closes or SIGTERM. The
// scripted Backend: Status answers space "alpha" with connectors [echo]; Stop, Inspect and
// Terminal refuse any name but "echo" with NOT_FOUND, reason AGENT_UNKNOWN; List shows "echo";
// the "echo" terminal's snapshot is "SNAPSHOT\r\n", it sends "ready\r\n" to each new session,
// echoes every keystroke to every session, and exits with code 7 on "q".
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"google.golang.org/grpc/codes"

	"github.com/cotalgo/cotal/managerd/internal/api"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

type uidList []uint32

func (u *uidList) String() string { return fmt.Sprint(*u) }
func (u *uidList) Set(s string) error {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return err
	}
	*u = append(*u, uint32(v))
	return nil
}

func main() {
	sock := flag.String("socket", "", "socket path (required)")
	var allow uidList
	flag.Var(&allow, "allow-uid", "peer uid to admit (repeatable; default this process's uid)")
	flag.Parse()
	if *sock == "" {
		fmt.Fprintln(os.Stderr, "apitest: --socket is required")
		os.Exit(2)
	}
	if len(allow) == 0 {
		allow = uidList{uint32(os.Getuid())}
	}
	ln, err := api.Listen(*sock, -1)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apitest:", err)
		os.Exit(1)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	gs := api.NewServer(&backend{term: newTerminal()}, api.Options{AllowUIDs: allow, Logger: log})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent closing stdin (or dying) stops us
		stop()
	}()
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	fmt.Println("ready")
	if err := gs.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "apitest:", err)
		os.Exit(1)
	}
}

type backend struct{ term *terminal }

func unknown(name string) error {
	return api.Refuse(codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN, "no agent %q", name)
}

func agent() *managerv1.Agent {
	return &managerv1.Agent{Name: "echo", Actor: "echo", Connector: "echo", Pid: 4242,
		Process: managerv1.ProcessState_PROCESS_STATE_RUNNING}
}

func (b *backend) Spawn(_ context.Context, req *managerv1.SpawnRequest) (*managerv1.Agent, error) {
	return nil, api.Refuse(codes.AlreadyExists, managerv1.Reason_REASON_NAME_IN_USE, "agent %q exists", req.GetName())
}

func (b *backend) Stop(_ context.Context, name string) (*managerv1.StopResponse, error) {
	if name != "echo" {
		return nil, unknown(name)
	}
	return &managerv1.StopResponse{Agent: agent()}, nil
}

func (b *backend) List(context.Context) ([]*managerv1.Agent, error) {
	return []*managerv1.Agent{agent()}, nil
}

func (b *backend) Inspect(_ context.Context, name string) (*managerv1.InspectResponse, error) {
	if name != "echo" {
		return nil, unknown(name)
	}
	return &managerv1.InspectResponse{Agent: agent()}, nil
}

func (b *backend) Terminal(name string) (api.Terminal, error) {
	if name != "echo" {
		return nil, unknown(name)
	}
	return b.term, nil
}

func (b *backend) Status(context.Context) (*managerv1.StatusResponse, error) {
	return &managerv1.StatusResponse{Space: "alpha", InstanceId: "apitest", Lease: managerv1.LeaseState_LEASE_STATE_HELD,
		Connectors: []string{"echo"}, Agents: 1, Capacity: 4}, nil
}

func (b *backend) Shutdown(context.Context, bool) (*managerv1.ShutdownResponse, error) {
	return nil, errors.New("apitest: shutdown is not scripted")
}

// terminal echoes keystrokes to every session.
type terminal struct {
	mu     sync.Mutex
	subs   map[chan []byte]struct{}
	exited chan struct{}
	once   sync.Once
}

func newTerminal() *terminal {
	return &terminal{subs: map[chan []byte]struct{}{}, exited: make(chan struct{})}
}

func (t *terminal) Attach() ([]byte, <-chan []byte, func() bool, func(), error) {
	ch := make(chan []byte, 256)
	ch <- []byte("ready\r\n")
	t.mu.Lock()
	select {
	case <-t.exited:
		close(ch)
	default:
		t.subs[ch] = struct{}{}
	}
	t.mu.Unlock()
	detach := func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, ok := t.subs[ch]; ok {
			delete(t.subs, ch)
			close(ch)
		}
	}
	return []byte("SNAPSHOT\r\n"), ch, func() bool { return false }, detach, nil
}

func (t *terminal) Write(_ context.Context, p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	select {
	case <-t.exited:
		return 0, errors.New("apitest: exited")
	default:
	}
	for ch := range t.subs {
		select {
		case ch <- bytes.Clone(p):
		default:
		}
	}
	if bytes.Contains(p, []byte("q")) {
		t.once.Do(func() { close(t.exited) })
		for ch := range t.subs {
			delete(t.subs, ch)
			close(ch)
		}
	}
	return len(p), nil
}

func (t *terminal) Resize(rows, cols uint16) error { return nil }
func (t *terminal) Exited() <-chan struct{}        { return t.exited }
func (t *terminal) ExitCode() int32                { return 7 }
