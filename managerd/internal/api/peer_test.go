package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// clientEnv makes this test binary a client: it dials the socket named by the variable, calls
// Status and opens an Attach, and prints one clientResult per call as a JSON line.
const clientEnv = "MANAGERD_API_TEST_CLIENT"

func TestMain(m *testing.M) {
	if sock := os.Getenv(clientEnv); sock != "" {
		os.Exit(clientMain(sock))
	}
	os.Exit(m.Run())
}

// clientResult is one call's outcome in a client child.
type clientResult struct {
	Call   string `json:"call"`
	UID    int    `json:"uid"`
	Code   string `json:"code"`
	Reason string `json:"reason,omitempty"`
	Domain string `json:"domain,omitempty"`
	Err    string `json:"err,omitempty"`
}

func clientMain(sock string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 20e9)
	defer cancel()
	enc := json.NewEncoder(os.Stdout)
	report := func(call string, err error) {
		st := status.Convert(err)
		r := clientResult{Call: call, UID: os.Getuid(), Code: st.Code().String()}
		if err != nil {
			r.Err = err.Error()
		}
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok {
				r.Reason, r.Domain = info.GetReason(), info.GetDomain()
			}
		}
		_ = enc.Encode(r)
	}
	c, closer, err := Dial(ctx, sock)
	if err != nil {
		report("dial", err)
		return 0
	}
	defer closer.Close()
	_, err = c.Status(ctx, &managerv1.StatusRequest{})
	report("status", err)
	s, err := c.Attach(ctx)
	if err == nil {
		err = s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: "ann"}}})
		if err == nil || errors.Is(err, io.EOF) {
			_, err = s.Recv()
		}
	}
	report("attach", err)
	return 0
}

// TestPeerGate: over the real socket, a peer whose uid the list does not name is refused with
// PERMISSION_DENIED, reason PEER_NOT_ALLOWED, on unary calls and Attach, and the Backend is never
// called; an empty list admits nobody; a declared in-memory uid is never trusted on a real
// socket.
func TestPeerGate(t *testing.T) {
	other := myUID() + 1
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"fail/not-listed", Options{AllowUIDs: []uint32{other}}},
		{"fail/empty-list", Options{}},
		{"fail/declared-uid-ignored-on-socket", Options{AllowUIDs: []uint32{other}, InMemoryPeerUID: &other}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFakeBackend()
			b.terminals["ann"] = newFakeTerminal(nil)
			c, _ := startSocket(t, b, tc.opts)
			ctx := ctxT(t)
			_, err := c.Status(ctx, &managerv1.StatusRequest{})
			wantRefusal(t, err, codes.PermissionDenied, "PEER_NOT_ALLOWED")
			_, err = c.Stop(ctx, &managerv1.StopRequest{Name: "ann"})
			wantRefusal(t, err, codes.PermissionDenied, "PEER_NOT_ALLOWED")
			s, err := c.Attach(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = s.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: "ann"}}})
			_, err = s.Recv()
			wantRefusal(t, err, codes.PermissionDenied, "PEER_NOT_ALLOWED")
			if n := b.calls.Load(); n != 0 {
				t.Fatalf("the Backend was called %d times for a refused peer", n)
			}
		})
	}
	t.Run("ok/listed", func(t *testing.T) {
		b := newFakeBackend()
		c, _ := startSocket(t, b, Options{AllowUIDs: []uint32{other, myUID()}})
		if _, err := c.Status(ctxT(t), &managerv1.StatusRequest{}); err != nil {
			t.Fatal(err)
		}
		if n := b.calls.Load(); n != 1 {
			t.Fatalf("Backend calls %d, want 1", n)
		}
	})
}

// TestUnidentifiedTransports: a TCP connection is refused at the handshake even with a declared
// in-memory uid (it is an OS socket without SO_PEERCRED), and an in-memory connection without a
// declared uid is refused; neither reaches the Backend.
func TestUnidentifiedTransports(t *testing.T) {
	uid := myUID()
	t.Run("fail/tcp", func(t *testing.T) {
		b := newFakeBackend()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		serve(t, b, Options{AllowUIDs: []uint32{uid}, InMemoryPeerUID: &uid}, ln)
		conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = managerv1.NewManagerServiceClient(conn).Status(ctxT(t), &managerv1.StatusRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("Status over TCP: %v, want UNAVAILABLE", err)
		}
		if n := b.calls.Load(); n != 0 {
			t.Fatalf("Backend calls %d", n)
		}
	})
	t.Run("fail/bufconn-undeclared", func(t *testing.T) {
		b := newFakeBackend()
		ln := bufconn.Listen(1 << 16)
		serve(t, b, Options{AllowUIDs: []uint32{uid}}, ln)
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = managerv1.NewManagerServiceClient(conn).Status(ctxT(t), &managerv1.StatusRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("Status in memory without a declared uid: %v, want UNAVAILABLE", err)
		}
		if n := b.calls.Load(); n != 0 {
			t.Fatalf("Backend calls %d", n)
		}
	})
}

// TestDial: Dial refuses a path that is not a socket, naming it, and a missing one.
func TestDial(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Dial(context.Background(), file); err == nil || !strings.Contains(err.Error(), file+" is not a socket") {
		t.Fatalf("Dial(regular file): %v", err)
	}
	if _, _, err := Dial(context.Background(), filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Dial(missing): %v, want not-exist", err)
	}
}

// TestListen: the socket is 0660 in a 0750 directory made for it; an existing directory looser
// than 0750, a non-socket at the path and a socket in use are refused, naming the path; a stale
// socket is replaced; Close removes the socket.
func TestListen(t *testing.T) {
	base := t.TempDir()
	t.Run("ok/modes", func(t *testing.T) {
		sock := filepath.Join(base, "ok", "m.sock")
		ln, err := Listen(sock, -1)
		if err != nil {
			t.Fatal(err)
		}
		wantMode(t, filepath.Dir(sock), os.ModeDir|0o750)
		wantMode(t, sock, os.ModeSocket|0o660)
		ln.Close()
		if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket after Close: %v", err)
		}
	})
	t.Run("ok/tighter-existing-dir", func(t *testing.T) {
		dir := filepath.Join(base, "tight")
		mkdir(t, dir, 0o700)
		ln, err := Listen(filepath.Join(dir, "m.sock"), -1)
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
		wantMode(t, dir, os.ModeDir|0o700) // left as it was
	})
	t.Run("ok/stale-socket", func(t *testing.T) {
		sock := filepath.Join(base, "stale", "m.sock")
		mkdir(t, filepath.Dir(sock), 0o750)
		old, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		old.SetUnlinkOnClose(false)
		old.Close()
		ln, err := Listen(sock, -1)
		if err != nil {
			t.Fatalf("over a stale socket: %v", err)
		}
		ln.Close()
	})
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T) string
		want    func(sock string) string
	}{
		{"fail/looser-dir", func(t *testing.T) string {
			dir := filepath.Join(base, "loose")
			mkdir(t, dir, 0o755)
			return filepath.Join(dir, "m.sock")
		}, func(sock string) string { return filepath.Dir(sock) + " is mode 0755" }},
		{"fail/group-writable-dir", func(t *testing.T) string {
			dir := filepath.Join(base, "gw")
			mkdir(t, dir, 0o770)
			return filepath.Join(dir, "m.sock")
		}, func(sock string) string { return filepath.Dir(sock) + " is mode 0770" }},
		{"fail/dir-is-symlink", func(t *testing.T) string {
			real := filepath.Join(base, "real")
			mkdir(t, real, 0o750)
			link := filepath.Join(base, "link")
			if err := os.Symlink(real, link); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "m.sock")
		}, func(sock string) string { return filepath.Dir(sock) + ": not a directory" }},
		{"fail/not-a-socket", func(t *testing.T) string {
			dir := filepath.Join(base, "file")
			mkdir(t, dir, 0o750)
			p := filepath.Join(dir, "m.sock")
			if err := os.WriteFile(p, []byte("keep"), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, func(sock string) string { return sock + " exists and is not a socket" }},
		{"fail/in-use", func(t *testing.T) string {
			sock := filepath.Join(base, "inuse", "m.sock")
			ln, err := Listen(sock, -1)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return sock
		}, func(sock string) string { return sock + ": another server is listening" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := tc.prepare(t)
			ln, err := Listen(sock, -1)
			if err == nil {
				ln.Close()
				t.Fatalf("Listen(%s) succeeded", sock)
			}
			if want := tc.want(sock); !strings.Contains(err.Error(), want) {
				t.Fatalf("Listen: %v; want it to say %q", err, want)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(base, "file", "m.sock")); err != nil || string(b) != "keep" {
		t.Fatalf("the refused non-socket was touched: %q, %v", b, err)
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode() & (os.ModeType | os.ModePerm); got != want {
		t.Fatalf("%s is %v, want %v", path, got, want)
	}
}

// nobody is the uid and gid the root tests run a foreign client as (no passwd entry needed).
const nobody = 65534

// TestRootForeignUID (root only): the server admits uid 0; this test binary re-executed as uid
// 65534 (a member of the socket's group, so it can connect) is refused PEER_NOT_ALLOWED on Status
// and Attach, the Backend never called; once the list names 65534 the same client is served. A
// directory owned by another uid and one of the wrong group are refused, naming them, and the
// socket and directory carry the configured group.
func TestRootForeignUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: running a client as another uid needs root (CI runs as root)")
	}
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // traversable by the foreign client
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "api.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	runClient := func(t *testing.T, sock string) map[string]clientResult {
		t.Helper()
		cmd := exec.Command(bin)
		cmd.Env = []string{clientEnv + "=" + sock}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client: %v (stdout %s)", err, out)
		}
		res := map[string]clientResult{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var r clientResult
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				t.Fatalf("client line %q: %v", line, err)
			}
			if r.UID != nobody {
				t.Fatalf("client ran as uid %d, want %d", r.UID, nobody)
			}
			res[r.Call] = r
		}
		return res
	}
	start := func(t *testing.T, allow []uint32) (*fakeBackend, string) {
		t.Helper()
		sock := filepath.Join(base, fmt.Sprintf("run-%d", len(allow)), "m.sock")
		ln, err := Listen(sock, nobody)
		if err != nil {
			t.Fatal(err)
		}
		wantOwner(t, filepath.Dir(sock), 0, nobody)
		wantOwner(t, sock, 0, nobody)
		wantMode(t, filepath.Dir(sock), os.ModeDir|0o750)
		wantMode(t, sock, os.ModeSocket|0o660)
		b := newFakeBackend()
		b.terminals["ann"] = newFakeTerminal(nil)
		serve(t, b, Options{AllowUIDs: allow}, ln)
		return b, sock
	}
	t.Run("fail/foreign-uid", func(t *testing.T) {
		b, sock := start(t, []uint32{0})
		res := runClient(t, sock)
		for _, call := range []string{"status", "attach"} {
			r := res[call]
			if r.Code != codes.PermissionDenied.String() || r.Reason != "PEER_NOT_ALLOWED" || r.Domain != ErrorDomain {
				t.Fatalf("%s as uid %d: %+v, want PermissionDenied PEER_NOT_ALLOWED %s", call, nobody, r, ErrorDomain)
			}
		}
		if n := b.calls.Load(); n != 0 {
			t.Fatalf("the Backend was called %d times for a foreign uid", n)
		}
	})
	t.Run("ok/listed-foreign-uid", func(t *testing.T) {
		b, sock := start(t, []uint32{0, nobody})
		res := runClient(t, sock)
		if r := res["status"]; r.Code != codes.OK.String() {
			t.Fatalf("status as a listed uid: %+v", r)
		}
		if n := b.calls.Load(); n < 1 {
			t.Fatalf("Backend calls %d, want the Status at least", n)
		}
	})
	t.Run("fail/outside-the-group", func(t *testing.T) {
		// The socket's directory is root's group, not the client's: its 0750 mode stops the
		// client from even reaching the socket, before any gate, though the list names it.
		sock := filepath.Join(base, "rootgroup", "m.sock")
		ln, err := Listen(sock, -1)
		if err != nil {
			t.Fatal(err)
		}
		b := newFakeBackend()
		serve(t, b, Options{AllowUIDs: []uint32{0, nobody}}, ln)
		res := runClient(t, sock)
		if r, ok := res["dial"]; !ok || !strings.Contains(r.Err, "permission denied") {
			t.Fatalf("from outside the socket's group: %+v, want Dial to fail with permission denied", res)
		}
		if n := b.calls.Load(); n != 0 {
			t.Fatalf("Backend calls %d", n)
		}
	})
	t.Run("fail/dir-owned-by-other-uid", func(t *testing.T) {
		dir := filepath.Join(base, "foreign")
		mkdir(t, dir, 0o750)
		if err := os.Chown(dir, nobody, 0); err != nil {
			t.Fatal(err)
		}
		_, err := Listen(filepath.Join(dir, "m.sock"), -1)
		if err == nil || !strings.Contains(err.Error(), dir+" is owned by uid 65534") {
			t.Fatalf("Listen under a foreign directory: %v", err)
		}
	})
	t.Run("fail/dir-of-other-group", func(t *testing.T) {
		dir := filepath.Join(base, "othergroup")
		mkdir(t, dir, 0o750)
		_, err := Listen(filepath.Join(dir, "m.sock"), nobody)
		if err == nil || !strings.Contains(err.Error(), dir+" has group 0, not 65534") {
			t.Fatalf("Listen in a directory of another group: %v", err)
		}
	})
}

func wantOwner(t *testing.T, path string, uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != uid || st.Gid != gid {
		t.Fatalf("%s is owned %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}
