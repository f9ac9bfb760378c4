package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
	"github.com/cotalgo/cotal/pkg/managerclient"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
)

// The demo agents and the line alice posts.
var demoAgents = []string{"alice", "bob"}

const demoText = "hello bob, from alice"

// launcherPaths are the launcher's socket and the token file it writes for managerd.
func (l layout) launcherPaths() (sock, token string) {
	return filepath.Join(l.run, "launcher", "launcher.sock"), filepath.Join(l.run, "manager-token", "launcher.token")
}

// devAgentUIDFirst is the first of the dev launcher's devAgentUIDs agent uids (each agent gets
// one of its own): above login.defs' UID_MAX (60000) and below nobody, so no user of a developer's
// machine has them, and apart from the ranges the launcher's and managerd's root tests use.
const (
	devAgentUIDFirst = 64800
	devAgentUIDs     = 16
)

// startLauncher runs `managerd launcher` as root: it admits only the manager dev user and starts
// each agent as a uid of its own from devAgentUIDFirst, in a cgroup of its own under the
// launcher's.
func (s *stack) startLauncher(ctx context.Context) error {
	u, l := s.users, s.l
	sock, token := l.launcherPaths()
	if err := os.MkdirAll(l.run, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(l.run, 0o755); err != nil {
		return err
	}
	lcfg := fmt.Sprintf(`socket: %s
token_file: %s
manager: {uid: %d, gid: %d}
agents: {uid_first: %d, uid_count: %d}
agent_root: %s
connectors:
  testagent: {argv: [%s]}
env_allow: [TERM]
`, q(sock), q(token), u.mgrUID, u.mgrGID, devAgentUIDFirst, devAgentUIDs, q(l.agents), q(filepath.Join(l.bin, "testagent")))
	lpath := filepath.Join(l.launcher, "launcher.yaml")
	if err := os.WriteFile(lpath, []byte(lcfg), 0o600); err != nil {
		return err
	}
	_ = os.Remove(sock) // a socket left by a killed launcher
	launcher, err := s.startChild("launcher", nil, filepath.Join(l.bin, "managerd"), "launcher", "--config", lpath)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, launcher, 15*time.Second, "listening", func() bool {
		fi, err := os.Stat(sock)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	}); err != nil {
		return err
	}
	s.rows = append(s.rows, statusRow{"launcher", "uid 0 (root)", "-", "socket ready", "-"})
	fmt.Fprintf(s.out, "launcher:  managerd launcher (pid %d) as root\n", launcher.cmd.Process.Pid)
	return nil
}

// startManagerd runs `managerd serve`, as the manager dev user with its files its own when
// root, and returns its ManagerService client once its lease is held. Without root it runs as
// this uid, which can read the signer's seeds, so it needs --dev-allow-readable-seeds (managerd
// warns); it has no launcher and so spawns nothing.
func (s *stack) startManagerd(ctx context.Context, addr, natsURL string) (managerv1.ManagerServiceClient, error) {
	u, l := s.users, s.l
	sock, token := l.launcherPaths()
	uid, gid := os.Getuid(), os.Getgid()
	if u != nil {
		uid, gid = int(u.mgrUID), int(u.mgrGID)
	}
	// managerd's own files, its user's; the signer's and the PKI's directories stay 0700 root.
	own := func(p string, mode os.FileMode, dir bool) error {
		if dir {
			if err := os.MkdirAll(p, mode); err != nil {
				return err
			}
		}
		if err := os.Chown(p, uid, gid); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	}
	m := l.managerd
	for _, d := range []struct {
		p    string
		mode os.FileMode
	}{{m, 0o700}, {filepath.Join(m, "tls"), 0o700}, {filepath.Join(m, "state"), 0o700}, {filepath.Join(m, "api"), 0o750}, {filepath.Join(m, "root"), 0o755}} {
		if err := own(d.p, d.mode, true); err != nil {
			return nil, err
		}
	}
	f := l.clientFiles(mtls.KindManagerd, s.o.space)
	for _, c := range []struct {
		from, to string
		mode     os.FileMode
	}{{f.ServerCAFile, "ca.pem", 0o644}, {f.CertFile, "client.pem", 0o644}, {f.KeyFile, "client-key.pem", 0o600}} {
		to := filepath.Join(m, "tls", c.to)
		if err := copyFile(c.from, to, c.mode); err != nil {
			return nil, err
		}
		if err := own(to, c.mode, false); err != nil {
			return nil, err
		}
	}
	apiSock := filepath.Join(m, "api", "manager.sock")
	mcfg := fmt.Sprintf(`space: %s
brokers: [%s]
signer: {address: %s, ca: %s, cert: %s, key: %s}
state_dir: %s
instance_id: %s
root: %s
owner: local
actor: manager
agent_owner: local
launcher: {socket: %s, token_file: %s}
api: {socket: %s, allow_uids: [%d]}
connectors: [testagent]
env_allow: [TERM]
capacity: 4
agent_ttl: 15m
signer_seed_paths: [%s, %s, %s]
log_level: info
`, s.o.space, q(natsURL), q(addr), q(filepath.Join(m, "tls", "ca.pem")), q(filepath.Join(m, "tls", "client.pem")),
		q(filepath.Join(m, "tls", "client-key.pem")), q(filepath.Join(m, "state")), instanceID, q(filepath.Join(m, "root")),
		q(sock), q(token), q(apiSock), os.Getuid(), q(filepath.Join(l.trust, "signer")), q(filepath.Join(l.trust, "operator")), q(filepath.Join(l.trust, "authd")))
	mpath := filepath.Join(m, "managerd.yaml")
	if err := os.WriteFile(mpath, []byte(mcfg), 0o600); err != nil {
		return nil, err
	}
	if err := own(mpath, 0o600, false); err != nil {
		return nil, err
	}
	// As root, no --dev-allow-readable-seeds: managerd's uid cannot open the signer's
	// directories, and managerd checks that itself at start-up.
	argv, cred, mgrBin := []string{"serve", "--config", mpath}, (*syscall.Credential)(nil), filepath.Join(s.o.bin, "managerd")
	if u != nil {
		cred, mgrBin = creds(u.mgrUID, u.mgrGID), filepath.Join(l.bin, "managerd")
	} else {
		argv = append(argv, "--dev-allow-readable-seeds")
	}
	mgr, err := s.startChild("managerd", cred, append([]string{mgrBin}, argv...)...)
	if err != nil {
		return nil, err
	}
	var api managerv1.ManagerServiceClient
	var st *managerv1.StatusResponse
	if err := waitFor(ctx, mgr, 40*time.Second, "serving with its lease held", func() bool {
		if api == nil {
			c, closer, err := managerclient.Dial(ctx, apiSock)
			if err != nil {
				return false
			}
			api = c
			s.closers = append(s.closers, func() { closer.Close() })
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		r, err := api.Status(cctx, &managerv1.StatusRequest{})
		if err != nil || r.Lease != managerv1.LeaseState_LEASE_STATE_HELD {
			return false
		}
		st = r
		return true
	}); err != nil {
		return nil, err
	}
	mgr.stop = func(ctx context.Context) {
		if r, err := api.Shutdown(ctx, &managerv1.ShutdownRequest{WithAgents: true}); err == nil {
			if len(r.Stopped) > 0 {
				fmt.Fprintf(s.out, "stopped: agents %s (ManagerService Shutdown)\n", strings.Join(r.Stopped, ", "))
			}
			if len(r.Spared) == 0 {
				_ = os.Remove(l.lifecycles()) // managerd stopped and deprovisioned them
			}
		} else {
			fmt.Fprintf(s.out, "managerd Shutdown: %v (sending SIGTERM)\n", err)
		}
	}
	mgrID, _ := certFacts(f.CertFile)
	supKey, _ := s.auditCredential(mgrID, "supervisor")
	s.rows = append(s.rows, statusRow{"managerd", fmt.Sprintf("%s (uid %d)", mgrID, uid), supKey,
		fmt.Sprintf("lease held, signer reachable %v", st.GetSigner().GetReachable()), fmtTS(st.Supervisor.GetExpiresAt())})
	if u != nil {
		fmt.Fprintf(s.out, "managerd:  managerd serve (pid %d) as %s (uid %d), lease held, no --dev-allow-readable-seeds\n", mgr.cmd.Process.Pid, managerUser, uid)
	} else {
		fmt.Fprintf(s.out, "managerd:  managerd serve (pid %d) as uid %d with --dev-allow-readable-seeds (this uid can read the signer's seeds; root runs it as its own user), lease held\n", mgr.cmd.Process.Pid, uid)
	}
	return api, nil
}

// agentDemo spawns the two demo agents through ManagerService (the launcher starts each as a
// uid of its own) and has alice's line reach bob through deliveryd, read from bob's terminal.
func (s *stack) agentDemo(ctx context.Context, api managerv1.ManagerServiceClient, pcfg provision.Config) error {
	if err := s.cleanStale(ctx, pcfg); err != nil {
		return err
	}
	// The two agents, alice and bob, both on general.
	terms := map[string]*terminal{}
	var spawned []lifecycle
	for _, name := range demoAgents {
		a, err := spawn(ctx, api, name)
		if err != nil {
			return err
		}
		spawned = append(spawned, lifecycle{Name: a.Name, Actor: a.Actor, UID: a.LifecycleUid})
		if err := writeJSON(s.l.lifecycles(), spawned); err != nil {
			return err
		}
		t, err := attach(ctx, api, name)
		if err != nil {
			return err
		}
		terms[name] = t
		fmt.Fprintf(s.out, "agent:     %s spawned (pid %d, uid %s of its own)\n", name, a.Pid, procUID(a.Pid))
	}
	for _, name := range demoAgents {
		if _, err := terms[name].waitLine(ctx, "ready", 30*time.Second); err != nil {
			return fmt.Errorf("agent %s: %w", name, err)
		}
	}
	if _, err := api.Input(ctx, &managerv1.InputRequest{Name: "alice", Text: []byte(demoText), Enter: true}); err != nil {
		return fmt.Errorf("input to alice: %w", err)
	}
	got, err := terms["bob"].waitLine(ctx, "recv general local.alice "+demoText, 30*time.Second)
	if err != nil {
		return fmt.Errorf("bob: %w", err)
	}
	fmt.Fprintf(s.out, "message:   alice posted %q on general; bob's terminal (Attach): %s\n", demoText, got)
	terms["alice"].close()
	s.bobTerm = terms["bob"] // the bearer demo's post reaches bob too; closed by stopAll
	s.closers = append(s.closers, s.bobTerm.close)
	l2, err := api.List(ctx, &managerv1.ListRequest{})
	if err != nil {
		return err
	}
	for _, a := range l2.Agents {
		ready := strings.ToLower(strings.TrimPrefix(a.Process.String(), "PROCESS_STATE_")) + ", " + strings.ToLower(strings.TrimPrefix(a.Mesh.String(), "MESH_STATE_"))
		if a.Name == "bob" {
			ready += ", message received"
		}
		s.rows = append(s.rows, statusRow{"agent " + a.Name, fmt.Sprintf("%s.%s (uid %s)", a.Owner, a.Actor, procUID(a.Pid)), a.UserPublicKey,
			ready, fmtTS(a.CredentialExpiresAt)})
	}
	return nil
}

// spawn starts name as a test agent; one left running by an earlier run under this instance is
// stopped first, so each run shows a fresh spawn.
func spawn(ctx context.Context, api managerv1.ManagerServiceClient, name string) (*managerv1.Agent, error) {
	req := &managerv1.SpawnRequest{Name: name, Connector: "testagent", Env: map[string]string{"TERM": "xterm"}}
	r, err := api.Spawn(ctx, req)
	if status.Code(err) == codes.AlreadyExists {
		if _, serr := api.Stop(ctx, &managerv1.StopRequest{Name: name}); serr != nil {
			return nil, fmt.Errorf("stop the earlier %s: %w", name, serr)
		}
		r, err = api.Spawn(ctx, req)
	}
	if err != nil {
		return nil, fmt.Errorf("spawn %s: %w", name, err)
	}
	return r.Agent, nil
}

// terminal is an Attach stream's output: the snapshot, then the data frames.
type terminal struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelFunc
	done   chan struct{}
}

func attach(ctx context.Context, api managerv1.ManagerServiceClient, name string) (*terminal, error) {
	actx, cancel := context.WithCancel(ctx)
	st, err := api.Attach(actx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("attach %s: %w", name, err)
	}
	if err := st.Send(&managerv1.AttachRequest{Frame: &managerv1.AttachRequest_Open{Open: &managerv1.AttachOpen{Name: name}}}); err != nil {
		cancel()
		return nil, fmt.Errorf("attach %s: %w", name, err)
	}
	t := &terminal{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			t.mu.Lock()
			switch f := r.Frame.(type) {
			case *managerv1.AttachResponse_Snapshot:
				t.buf.Reset()
				t.buf.Write(f.Snapshot)
			case *managerv1.AttachResponse_Data:
				t.buf.Write(f.Data)
			}
			t.mu.Unlock()
		}
	}()
	return t, nil
}

func (t *terminal) close() { t.cancel(); <-t.done }

// waitLine waits for a terminal line starting with prefix and returns it.
func (t *terminal) waitLine(ctx context.Context, prefix string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	for {
		t.mu.Lock()
		text := t.buf.String()
		t.mu.Unlock()
		for _, line := range strings.Split(strings.ReplaceAll(text, "\r", ""), "\n") {
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
		}
		select {
		case <-t.done:
			return "", fmt.Errorf("terminal closed before %q; it showed:\n%s", prefix, text)
		default:
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no %q on the terminal after %v; it showed:\n%s", prefix, within, text)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return "", err
		}
	}
}

// waitFor polls ok until it holds, c exits, ctx ends or within passes.
func waitFor(ctx context.Context, c *child, within time.Duration, what string, ok func() bool) error {
	deadline := time.Now().Add(within)
	for !ok() {
		if !c.running() {
			return fmt.Errorf("%s exited before %s (%v); see %s", c.name, what, c.err, c.log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not %s after %v; see %s", c.name, what, within, c.log)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// lifecycle is one demo agent incarnation cotal-dev spawned, recorded until managerd has stopped
// and deprovisioned it.
type lifecycle struct {
	Name, Actor, UID string
}

// lifecycles is the record of the demo agents spawned and not yet deprovisioned.
func (l layout) lifecycles() string { return filepath.Join(l.root, "demo-lifecycles.json") }

// cleanStale deprovisions the demo agents an interrupted run left provisioned (cotal-dev killed,
// so managerd stopped without stopping them): their read-ACL rows would otherwise stay live next
// to the new incarnation's, and deliveryd refuses a durable join for an alias with two.
func (s *stack) cleanStale(ctx context.Context, pcfg provision.Config) error {
	b, err := os.ReadFile(s.l.lifecycles())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var stale []lifecycle
	if err := json.Unmarshal(b, &stale); err != nil {
		return fmt.Errorf("%s: %w", s.l.lifecycles(), err)
	}
	for _, lc := range stale {
		res, err := provision.RunDeprovisionAgent(ctx, pcfg, "local", lc.Actor, lc.UID, nil)
		if err != nil {
			return fmt.Errorf("deprovision %s (lifecycle %s) left by an interrupted run: %w", lc.Name, lc.UID, err)
		}
		fmt.Fprintf(s.out, "cleanup:   deprovisioned %s (lifecycle %s) left by an interrupted run: %s (%s)\n", lc.Name, lc.UID, strings.Join(res.Removed, ", "), res)
	}
	return os.Remove(s.l.lifecycles())
}

// writeJSON writes v to path (0600) through a temporary file and a rename.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// procUID is the real uid of pid from /proc/<pid>/status ("?" when it cannot be read): the
// launcher picks each agent's uid from its range.
func procUID(pid int32) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				return f[0]
			}
		}
	}
	return "?"
}
