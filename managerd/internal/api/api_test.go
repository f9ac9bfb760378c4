package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/testkit"
)

func myUID() uint32 { return uint32(os.Getuid()) }

// serve runs NewServer(b, opts) on ln until the test ends.
func serve(t *testing.T, b Backend, opts Options, ln net.Listener) {
	t.Helper()
	gs := NewServer(b, opts)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(ln) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("Serve: %v", err)
		}
	})
}

// startBufconn serves over an in-memory listener whose peer is declared to be this test's uid.
func startBufconn(t *testing.T, b Backend, opts Options) managerv1.ManagerServiceClient {
	t.Helper()
	uid := myUID()
	if opts.InMemoryPeerUID == nil {
		opts.InMemoryPeerUID = &uid
	}
	ln := bufconn.Listen(1 << 20)
	serve(t, b, opts, ln)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return managerv1.NewManagerServiceClient(conn)
}

// startSocket serves on a real Unix socket (Listen) and dials it (Dial).
func startSocket(t *testing.T, b Backend, opts Options) (managerv1.ManagerServiceClient, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "run", "manager.sock")
	ln, err := Listen(sock, -1)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, b, opts, ln)
	c, closer, err := Dial(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closer.Close() })
	return c, sock
}

// transports runs f over bufconn and over a real Unix socket, each admitting this test's uid.
func transports(t *testing.T, opts Options, f func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient)) {
	t.Run("bufconn", func(t *testing.T) {
		b := newFakeBackend()
		o := opts
		o.AllowUIDs = []uint32{myUID()}
		f(t, b, startBufconn(t, b, o))
	})
	t.Run("socket", func(t *testing.T) {
		b := newFakeBackend()
		o := opts
		o.AllowUIDs = []uint32{myUID()}
		c, _ := startSocket(t, b, o)
		f(t, b, c)
	})
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// wantRefusal checks err is a status with code and an ErrorInfo of ErrorDomain naming reason.
func wantRefusal(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v is not a gRPC status", err)
	}
	if st.Code() != code {
		t.Fatalf("code %s (%q), want %s", st.Code(), st.Message(), code)
	}
	var infos []*errdetails.ErrorInfo
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			infos = append(infos, info)
		}
	}
	if len(infos) != 1 {
		t.Fatalf("%d ErrorInfo details (%v), want 1", len(infos), st.Details())
	}
	if infos[0].GetDomain() != ErrorDomain || infos[0].GetReason() != reason {
		t.Fatalf("ErrorInfo {domain %q reason %q}, want {%q %q}", infos[0].GetDomain(), infos[0].GetReason(), ErrorDomain, reason)
	}
}

// TestRoundTrip: every unary RPC reaches the Backend with the request's values and returns its
// answer, over bufconn and over the real socket; List comes back sorted by name.
func TestRoundTrip(t *testing.T) {
	transports(t, Options{}, func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient) {
		ctx := ctxT(t)
		sp, err := c.Spawn(ctx, &managerv1.SpawnRequest{Name: "ann", Connector: "echo", Subscribe: []string{"general"}, Rows: 30, Cols: 100})
		if err != nil {
			t.Fatal(err)
		}
		if sp.GetAgent().GetName() != "ann" || sp.GetAgent().GetPid() != 4242 || sp.GetAgent().GetConnector() != "echo" {
			t.Fatalf("Spawn answer %v", sp)
		}
		// The Backend can tell who asked: the kernel's answer on the socket, the declared uid in
		// memory.
		if p := b.spawnPeer; p.UID != myUID() || p.Declared != strings.HasSuffix(t.Name(), "/bufconn") || (!p.Declared && p.PID != int32(os.Getpid())) {
			t.Fatalf("Backend saw peer %+v; want uid %d, pid %d on the socket", p, myUID(), os.Getpid())
		}
		if got := b.lastSpawn; got.GetRows() != 30 || got.GetCols() != 100 || strings.Join(got.GetSubscribe(), ",") != "general" {
			t.Fatalf("Backend got Spawn %v", got)
		}
		st, err := c.Stop(ctx, &managerv1.StopRequest{Name: "ann"})
		if err != nil {
			t.Fatal(err)
		}
		if st.GetAgent().GetName() != "ann" || strings.Join(st.GetDeprovisioned(), ",") != "dm_ann,dlv_ann" {
			t.Fatalf("Stop answer %v", st)
		}
		b.agents = []*managerv1.Agent{{Name: "zed"}, {Name: "ann"}, {Name: "mia"}}
		ls, err := c.List(ctx, &managerv1.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, a := range ls.GetAgents() {
			names = append(names, a.GetName())
		}
		if strings.Join(names, ",") != "ann,mia,zed" {
			t.Fatalf("List names %v, want ann,mia,zed", names)
		}
		in, err := c.Inspect(ctx, &managerv1.InspectRequest{Name: "mia"})
		if err != nil {
			t.Fatal(err)
		}
		if in.GetAgent().GetName() != "mia" || in.GetRenewal().GetFailures() != 2 || in.GetDurables()[0] != "dm_mia" {
			t.Fatalf("Inspect answer %v", in)
		}
		term := newFakeTerminal(nil)
		b.terminals["mia"] = term
		ir, err := c.Input(ctx, &managerv1.InputRequest{Name: "mia", Text: []byte("ls -l"), Enter: true})
		if err != nil {
			t.Fatal(err)
		}
		if w, _ := term.state(); ir.GetWritten() != 6 || string(w) != "ls -l\r" {
			t.Fatalf("Input wrote %d, terminal has %q; want 6 and %q", ir.GetWritten(), w, "ls -l\r")
		}
		if _, err := c.Input(ctx, &managerv1.InputRequest{Name: "mia", Text: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if w, _ := term.state(); string(w) != "ls -l\rx" {
			t.Fatalf("terminal has %q after an Input without enter", w)
		}
		ss, err := c.Status(ctx, &managerv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if ss.GetSpace() != "alpha" || ss.GetLease() != managerv1.LeaseState_LEASE_STATE_HELD || ss.GetCapacity() != 8 {
			t.Fatalf("Status answer %v", ss)
		}
		sd, err := c.Shutdown(ctx, &managerv1.ShutdownRequest{WithAgents: true})
		if err != nil {
			t.Fatal(err)
		}
		if !b.withAgents || strings.Join(sd.GetSpared(), ",") != "a" {
			t.Fatalf("Shutdown: backend with_agents %v, answer %v", b.withAgents, sd)
		}
	})
}

// TestRefusals: a Backend refusal reaches the client as its code with an ErrorInfo naming the
// reason in ErrorDomain; requests of the wrong shape are refused at the API (INVALID_ARGUMENT,
// reason INVALID_ARGUMENT) without reaching the Backend.
func TestRefusals(t *testing.T) {
	transports(t, Options{}, func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient) {
		ctx := ctxT(t)
		for _, tc := range []struct {
			name   string
			refuse *Refusal
		}{
			{"fail/agent-unknown", Refuse(codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN, "no agent %q", "x")},
			{"fail/capacity", Refuse(codes.ResourceExhausted, managerv1.Reason_REASON_CAPACITY_EXHAUSTED, "full")},
			{"fail/shutdown-conflict", Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_SHUTDOWN_CONFLICT, "other")},
		} {
			t.Run(tc.name, func(t *testing.T) {
				b.setErr(tc.refuse)
				_, err := c.Stop(ctx, &managerv1.StopRequest{Name: "x"})
				wantRefusal(t, err, tc.refuse.Code, strings.TrimPrefix(tc.refuse.Reason.String(), "REASON_"))
				if got := status.Convert(err).Message(); got != tc.refuse.Message {
					t.Fatalf("message %q, want %q", got, tc.refuse.Message)
				}
				// Wrapped, it is still the refusal.
				b.setErr(errors.Join(errors.New("context"), tc.refuse))
				_, err = c.Shutdown(ctx, &managerv1.ShutdownRequest{})
				wantRefusal(t, err, tc.refuse.Code, strings.TrimPrefix(tc.refuse.Reason.String(), "REASON_"))
			})
		}
		b.setErr(nil)
		before := b.calls.Load()
		big := bytes.Repeat([]byte("a"), MaxInputBytes+1)
		for _, tc := range []struct {
			name string
			call func() error
		}{
			{"fail/spawn-no-name", func() error { _, err := c.Spawn(ctx, &managerv1.SpawnRequest{Connector: "echo"}); return err }},
			{"fail/spawn-no-connector", func() error { _, err := c.Spawn(ctx, &managerv1.SpawnRequest{Name: "a"}); return err }},
			{"fail/spawn-rows", func() error {
				_, err := c.Spawn(ctx, &managerv1.SpawnRequest{Name: "a", Connector: "echo", Rows: 1001})
				return err
			}},
			{"fail/stop-no-name", func() error { _, err := c.Stop(ctx, &managerv1.StopRequest{}); return err }},
			{"fail/inspect-long-name", func() error {
				_, err := c.Inspect(ctx, &managerv1.InspectRequest{Name: strings.Repeat("n", 257)})
				return err
			}},
			{"fail/input-too-big", func() error { _, err := c.Input(ctx, &managerv1.InputRequest{Name: "a", Text: big}); return err }},
			{"fail/input-nothing", func() error { _, err := c.Input(ctx, &managerv1.InputRequest{Name: "a"}); return err }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				wantRefusal(t, tc.call(), codes.InvalidArgument, "INVALID_ARGUMENT")
			})
		}
		if n := b.calls.Load() - before; n != 0 {
			t.Fatalf("the Backend was called %d times for requests refused at the API", n)
		}
		// A write to an exited agent's terminal is AGENT_EXITED.
		term := newFakeTerminal(nil)
		term.writeErr = errors.New("write /dev/ptmx: input/output error")
		close(term.exited)
		b.terminals["gone"] = term
		_, err := c.Input(ctx, &managerv1.InputRequest{Name: "gone", Text: []byte("x")})
		wantRefusal(t, err, codes.FailedPrecondition, "AGENT_EXITED")
	})
}

// TestInternalErrors: an error that is not a Refusal reaches the client as INTERNAL with a fixed
// message and no details (never its text, which might carry a secret); the log has the cause.
func TestInternalErrors(t *testing.T) {
	const secret = "SUAJSECRETSEEDTEXT"
	var logs testkit.SyncBuffer
	b := newFakeBackend()
	uid := myUID()
	c := startBufconn(t, b, Options{AllowUIDs: []uint32{uid}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := ctxT(t)
	b.setErr(errors.New("reading " + secret + ": boom"))
	calls := []func() error{
		func() error {
			_, err := c.Spawn(ctx, &managerv1.SpawnRequest{Name: "a", Connector: "echo"})
			return err
		},
		func() error { _, err := c.Stop(ctx, &managerv1.StopRequest{Name: "a"}); return err },
		func() error { _, err := c.List(ctx, &managerv1.ListRequest{}); return err },
		func() error { _, err := c.Inspect(ctx, &managerv1.InspectRequest{Name: "a"}); return err },
		func() error { _, err := c.Input(ctx, &managerv1.InputRequest{Name: "a", Enter: true}); return err },
		func() error { _, err := c.Status(ctx, &managerv1.StatusRequest{}); return err },
		func() error { _, err := c.Shutdown(ctx, &managerv1.ShutdownRequest{}); return err },
		func() error {
			s, err := c.Attach(ctx)
			if err != nil {
				return err
			}
			if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: "a"}}}); err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		},
	}
	for i, call := range calls {
		err := call()
		st := status.Convert(err)
		if st.Code() != codes.Internal || st.Message() != internalMessage || len(st.Details()) != 0 {
			t.Fatalf("call %d: %v (details %v), want INTERNAL %q without details", i, err, st.Details(), internalMessage)
		}
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("call %d: the error text reached the client: %v", i, err)
		}
	}
	if n := strings.Count(logs.String(), secret); n != len(calls) {
		t.Fatalf("the log names the cause %d times, want %d:\n%s", n, len(calls), logs.String())
	}
	// A refusal without a reason is a bug: INTERNAL too, not an UNSPECIFIED reason.
	b.setErr(Refuse(codes.NotFound, managerv1.Reason_REASON_UNSPECIFIED, "x"))
	_, err := c.Stop(ctx, &managerv1.StopRequest{Name: "a"})
	if st := status.Convert(err); st.Code() != codes.Internal || len(st.Details()) != 0 {
		t.Fatalf("reasonless refusal: %v, want INTERNAL without details", err)
	}
}

// attachOpen opens an Attach session to name and returns the stream and the snapshot.
func attachOpen(t *testing.T, ctx context.Context, c managerv1.ManagerServiceClient, name string) (managerv1.ManagerService_AttachClient, []byte) {
	t.Helper()
	s, err := c.Attach(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: name}}}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatalf("first Attach frame: %v", err)
	}
	snap, ok := first.GetFrame().(*managerv1.AttachResponse_Snapshot)
	if !ok {
		t.Fatalf("first Attach frame is %T, want a snapshot", first.GetFrame())
	}
	return s, snap.Snapshot
}

// waitFor polls cond until it holds or 10 s pass (the terminal signals each change).
func waitFor(t *testing.T, term *fakeTerminal, what string, cond func(w []byte, r [][2]uint16) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		w, r := term.state()
		if cond(w, r) {
			return
		}
		select {
		case <-term.changed:
		case <-deadline:
			t.Fatalf("%s: terminal has written %q, resizes %v", what, w, r)
		}
	}
}

// TestAttach: the snapshot comes first, then the terminal's output byte-exact (random bytes in
// random chunks, one chunk larger than a frame); keystrokes and resizes reach the terminal; the
// agent's exit sends the rest of the output, then an exited frame with its code, then ends the
// stream; the session is detached.
func TestAttach(t *testing.T) {
	transports(t, Options{}, func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient) {
		ctx := ctxT(t)
		rng := rand.New(rand.NewPCG(1, 2))
		snapshot := make([]byte, 3000)
		for i := range snapshot {
			snapshot[i] = byte(rng.UintN(256))
		}
		term := newFakeTerminal(snapshot)
		b.terminals["ann"] = term
		s, snap := attachOpen(t, ctx, c, "ann")
		if !bytes.Equal(snap, snapshot) {
			t.Fatalf("snapshot is %d bytes, differs from the terminal's %d", len(snap), len(snapshot))
		}
		sub := <-term.subs
		var want []byte
		var chunks [][]byte
		chunk := func(n int) {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rng.UintN(256))
			}
			want = append(want, p...)
			chunks = append(chunks, p)
		}
		chunk(maxDataFrame*2 + 17) // split into three frames
		for range 200 {
			chunk(1 + int(rng.UintN(4096)))
		}
		go func() {
			for _, p := range chunks {
				sub.out <- p
			}
		}()
		var got []byte
		for len(got) < len(want) {
			r, err := s.Recv()
			if err != nil {
				t.Fatalf("after %d of %d bytes: %v", len(got), len(want), err)
			}
			d, ok := r.GetFrame().(*managerv1.AttachResponse_Data)
			if !ok {
				t.Fatalf("frame %T after %d bytes, want data", r.GetFrame(), len(got))
			}
			if len(d.Data) > maxDataFrame {
				t.Fatalf("a data frame of %d bytes, more than %d", len(d.Data), maxDataFrame)
			}
			got = append(got, d.Data...)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("output is not byte-exact: got %d bytes, want %d", len(got), len(want))
		}

		keys := []byte("hello\x03\x1b[A\r")
		if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Data{Data: keys}}); err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Resize{Resize: &managerv1.Resize{Rows: 50, Cols: 132}}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, term, "keystrokes and resize", func(w []byte, r [][2]uint16) bool {
			return bytes.Equal(w, keys) && len(r) == 1 && r[0] == [2]uint16{50, 132}
		})

		// Exit: output written before the exit still arrives, then exited, then EOF.
		tail := []byte("goodbye\r\n")
		sub.out <- tail
		term.code.Store(3)
		close(term.exited)
		close(sub.out)
		var rest []byte
		for {
			r, err := s.Recv()
			if err != nil {
				t.Fatalf("before the exited frame: %v", err)
			}
			if d, ok := r.GetFrame().(*managerv1.AttachResponse_Data); ok {
				rest = append(rest, d.Data...)
				continue
			}
			ex, ok := r.GetFrame().(*managerv1.AttachResponse_Exited)
			if !ok {
				t.Fatalf("frame %T, want exited", r.GetFrame())
			}
			if ex.Exited.GetExitCode() != 3 {
				t.Fatalf("exit code %d, want 3", ex.Exited.GetExitCode())
			}
			break
		}
		if !bytes.Equal(rest, tail) {
			t.Fatalf("output after the exit %q, want %q", rest, tail)
		}
		if _, err := s.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("after exited: %v, want the stream to end OK (EOF)", err)
		}
		select {
		case <-sub.detached:
		case <-time.After(10 * time.Second):
			t.Fatal("the session was not detached after the stream ended")
		}
	})
}

// TestAttachExitDrain: an agent that exits while its terminal's output never ends (a grandchild
// holds the PTY) still gets its exited frame, after ExitDrain.
func TestAttachExitDrain(t *testing.T) {
	b := newFakeBackend()
	c := startBufconn(t, b, Options{AllowUIDs: []uint32{myUID()}, ExitDrain: 50 * time.Millisecond})
	term := newFakeTerminal(nil)
	b.terminals["ann"] = term
	s, snap := attachOpen(t, ctxT(t), c, "ann")
	if len(snap) != 0 {
		t.Fatalf("snapshot %q, want empty", snap)
	}
	<-term.subs
	term.code.Store(-1)
	close(term.exited)
	r, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if ex, ok := r.GetFrame().(*managerv1.AttachResponse_Exited); !ok || ex.Exited.GetExitCode() != -1 {
		t.Fatalf("frame %v, want exited -1", r)
	}
	if _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after exited: %v, want EOF", err)
	}
}

// TestAttachRefusals: a first frame other than open, a second open, an empty frame and a resize
// out of 1..1000 end the stream with INVALID_ARGUMENT; an unknown agent is the Backend's
// refusal; a lagging subscriber ends with DATA_LOSS.
func TestAttachRefusals(t *testing.T) {
	transports(t, Options{}, func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient) {
		ctx := ctxT(t)
		term := newFakeTerminal([]byte("snap"))
		b.terminals["ann"] = term
		frames := map[string]*managerv1.AttachRequest{
			"data":   {Frame: &managerv1.AttachRequest_Data{Data: []byte("x")}},
			"resize": {Frame: &managerv1.AttachRequest_Resize{Resize: &managerv1.Resize{Rows: 10, Cols: 10}}},
			"open":   {Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: "ann"}}},
			"empty":  {},
		}
		recvErr := func(s managerv1.ManagerService_AttachClient) error {
			for {
				if _, err := s.Recv(); err != nil {
					return err
				}
			}
		}
		for _, first := range []string{"data", "resize", "empty"} {
			t.Run("fail/first-"+first, func(t *testing.T) {
				before := b.calls.Load()
				s, err := c.Attach(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Send(frames[first]); err != nil {
					t.Fatal(err)
				}
				wantRefusal(t, recvErr(s), codes.InvalidArgument, "INVALID_ARGUMENT")
				if n := b.calls.Load() - before; n != 0 {
					t.Fatalf("Backend called %d times", n)
				}
			})
		}
		t.Run("fail/no-open", func(t *testing.T) {
			s, err := c.Attach(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.CloseSend(); err != nil {
				t.Fatal(err)
			}
			wantRefusal(t, recvErr(s), codes.InvalidArgument, "INVALID_ARGUMENT")
		})
		for _, tc := range []struct {
			name  string
			frame *managerv1.AttachRequest
		}{
			{"fail/second-open", frames["open"]},
			{"fail/empty-frame", frames["empty"]},
			{"fail/resize-zero-rows", &managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Resize{Resize: &managerv1.Resize{Rows: 0, Cols: 80}}}},
			{"fail/resize-1001-cols", &managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Resize{Resize: &managerv1.Resize{Rows: 24, Cols: 1001}}}},
			{"fail/data-too-big", &managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Data{Data: make([]byte, MaxInputBytes+1)}}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s, snap := attachOpen(t, ctx, c, "ann")
				if string(snap) != "snap" {
					t.Fatalf("snapshot %q", snap)
				}
				sub := <-term.subs
				if err := s.Send(tc.frame); err != nil {
					t.Fatal(err)
				}
				wantRefusal(t, recvErr(s), codes.InvalidArgument, "INVALID_ARGUMENT")
				<-sub.detached
			})
		}
		if _, r := term.state(); len(r) != 0 {
			t.Fatalf("refused resizes reached the terminal: %v", r)
		}
		t.Run("fail/unknown-agent", func(t *testing.T) {
			b.setErr(Refuse(codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN, "no agent"))
			defer b.setErr(nil)
			s, err := c.Attach(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(frames["open"]); err != nil {
				t.Fatal(err)
			}
			wantRefusal(t, recvErr(s), codes.NotFound, "AGENT_UNKNOWN")
		})
		t.Run("fail/lagged", func(t *testing.T) {
			s, _ := attachOpen(t, ctx, c, "ann")
			sub := <-term.subs
			sub.out <- []byte("before")
			sub.lagged.Store(true)
			close(sub.out)
			r, err := s.Recv()
			if err != nil || string(r.GetData()) != "before" {
				t.Fatalf("got %v, %v; want the output sent before the lag", r, err)
			}
			err = recvErr(s)
			if st := status.Convert(err); st.Code() != codes.DataLoss || len(st.Details()) != 0 {
				t.Fatalf("lagged: %v, want DATA_LOSS without a reason", err)
			}
			<-sub.detached
		})
	})
}

// TestAttachClientLeaves: a client that cancels its stream is detached.
func TestAttachClientLeaves(t *testing.T) {
	transports(t, Options{}, func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient) {
		term := newFakeTerminal(nil)
		b.terminals["ann"] = term
		ctx, cancel := context.WithCancel(ctxT(t))
		attachOpen(t, ctx, c, "ann")
		sub := <-term.subs
		cancel()
		select {
		case <-sub.detached:
		case <-time.After(10 * time.Second):
			t.Fatal("a client that left was not detached")
		}
	})
}

// TestAttachLimit: MaxAttach sessions may be open at once; one more is RESOURCE_EXHAUSTED with
// reason ATTACH_LIMIT before the Backend is asked; a closed session frees its slot.
func TestAttachLimit(t *testing.T) {
	transports(t, Options{MaxAttach: 2}, func(t *testing.T, b *fakeBackend, c managerv1.ManagerServiceClient) {
		term := newFakeTerminal(nil)
		b.terminals["ann"] = term
		ctx1, cancel1 := context.WithCancel(ctxT(t))
		attachOpen(t, ctx1, c, "ann")
		sub1 := <-term.subs
		attachOpen(t, ctxT(t), c, "ann")
		<-term.subs
		before := b.calls.Load()
		s, err := c.Attach(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		wantRefusal(t, err, codes.ResourceExhausted, "ATTACH_LIMIT")
		if n := b.calls.Load() - before; n != 0 {
			t.Fatalf("Backend called %d times past the limit", n)
		}
		cancel1()
		<-sub1.detached
		// The slot is released when the handler returns, just after detach: poll.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s, err := c.Attach(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: "ann"}}}); err != nil {
				t.Fatal(err)
			}
			r, err := s.Recv()
			if err == nil {
				if _, ok := r.GetFrame().(*managerv1.AttachResponse_Snapshot); !ok {
					t.Fatalf("first frame %T", r.GetFrame())
				}
				break
			}
			wantRefusal(t, err, codes.ResourceExhausted, "ATTACH_LIMIT")
			if time.Now().After(deadline) {
				t.Fatal("the closed session's slot was never released")
			}
		}
	})
}
