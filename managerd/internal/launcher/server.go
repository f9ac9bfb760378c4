package launcher

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/cotalgo/cotal/managerd/internal/unixsock"
)

// Capabilities the launcher needs in its effective set (root has them all): change uid and gid
// in the child, chown the agent's directory and files, write and chmod in a directory the agent
// owns, and signal the agent uid's process groups.
var requiredCaps = []struct {
	bit  uint
	name string
}{
	{unix.CAP_CHOWN, "CAP_CHOWN"},
	{unix.CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"},
	{unix.CAP_FOWNER, "CAP_FOWNER"},
	{unix.CAP_KILL, "CAP_KILL"},
	{unix.CAP_SETGID, "CAP_SETGID"},
	{unix.CAP_SETUID, "CAP_SETUID"},
}

// MaxConcurrent is how many requests the launcher serves at once; more are refused
// RESOURCE_EXHAUSTED. managerd keeps its own calls under it.
const MaxConcurrent = 8

// Per-connection bounds.
const (
	connTimeout    = 10 * time.Second
	maxConcurrent  = MaxConcurrent
	materialName   = "launch-material"
	tokenFileMode  = 0o600
	socketDirMode  = 0o750
	agentDirMode   = 0o750
	agentRootMode  = 0o755
	tokenDirMode   = 0o700
	socketFileMode = 0o660
)

// Inputs are what Start needs.
type Inputs struct {
	// Config is a validated configuration (LoadConfig). Required.
	Config Config
	// Logger gets one line per request (peer, reason, agent, pid); never the token. Optional.
	Logger *slog.Logger
}

// Server is a running launcher: it listens on the configured socket and starts agents for
// managerd alone.
type Server struct {
	cfg    Config
	log    *slog.Logger
	ln     *net.UnixListener
	rootFD int
	token  []byte
	sem    chan struct{}

	mu       sync.Mutex
	children map[int]uint64 // pid → start time, until the child exits
	names    map[string]int // agent name → its child's pid (0 while launching)

	wg        sync.WaitGroup
	closeOnce sync.Once
	done      chan struct{}
	err       error
}

// Start checks the launcher's privileges, prepares the agent root, writes a fresh token file and
// listens; it returns once the socket accepts. It refuses, naming the cause: a configuration that
// does not validate, a process without the capabilities it needs, an agent root a group or other
// may write or another uid owns, a path that is a symbolic link, or a non-socket at the socket
// path. ctx ending closes the server.
func Start(ctx context.Context, in Inputs) (*Server, error) {
	cfg := in.Config
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("launcher: config: %w", err)
	}
	log := in.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkCaps(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: log, rootFD: -1, sem: make(chan struct{}, maxConcurrent),
		children: map[int]uint64{}, names: map[string]int{}, done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.release()
		}
	}()
	if err := s.openAgentRoot(); err != nil {
		return nil, err
	}
	if err := s.writeToken(); err != nil {
		return nil, err
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	ok = true
	s.wg.Add(1)
	go s.serve()
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.done:
		}
	}()
	log.Info("launcher listening", "socket", cfg.Socket, "manager_uid", *cfg.Manager.UID, "agent_uid", *cfg.Agent.UID)
	return s, nil
}

// Close stops accepting, waits for requests in flight and releases the socket. It is idempotent.
// Agents already started keep running: their lifetime is managerd's.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		_ = s.ln.Close()
		s.wg.Wait()
		s.release()
		close(s.done)
	})
	return nil
}

// Done is closed once the server has stopped.
func (s *Server) Done() <-chan struct{} { return s.done }

// Err is why the server stopped (nil after Close).
func (s *Server) Err() error {
	<-s.done
	return s.err
}

func (s *Server) release() {
	if s.ln != nil {
		_ = s.ln.Close()
	}
	if s.rootFD >= 0 {
		_ = unix.Close(s.rootFD)
		s.rootFD = -1
	}
	clear(s.token)
}

// checkCaps refuses a process lacking a capability the launcher needs, naming it.
func checkCaps() error {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("launcher: reading capabilities: %w", err)
	}
	var eff uint64
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			found = err == nil
		}
	}
	if !found {
		return errors.New("launcher: no CapEff line in /proc/self/status")
	}
	var missing []string
	for _, c := range requiredCaps {
		if eff&(1<<c.bit) == 0 {
			missing = append(missing, c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("launcher: needs root or the capabilities %s (missing %s)", capNames(), strings.Join(missing, ", "))
	}
	return nil
}

func capNames() string {
	var n []string
	for _, c := range requiredCaps {
		n = append(n, c.name)
	}
	return strings.Join(n, " ")
}

// safeParent resolves the directory that holds dir and refuses it unless every directory from
// / down to it is owned by root or the launcher's uid and writable by no one else (or sticky,
// as /tmp): the launcher chowns and chmods what it makes there as root, so no other uid may be
// able to swap a path component under it. It returns dir under the resolved parent.
func safeParent(dir string) (string, error) {
	parent, err := filepath.EvalSymlinks(filepath.Dir(dir))
	if err != nil {
		return "", fmt.Errorf("parent of %s: %w", dir, err)
	}
	euid := uint32(os.Geteuid())
	for p := parent; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return "", err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", fmt.Errorf("%s is not a directory", p)
		}
		if st.Uid != 0 && st.Uid != euid {
			return "", fmt.Errorf("%s (above %s) is owned by uid %d: only root or the launcher may own it", p, dir, st.Uid)
		}
		if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
			return "", fmt.Errorf("%s (above %s) is mode %#o: a group or other may write it", p, dir, st.Mode&0o7777)
		}
		if p == "/" {
			break
		}
	}
	return filepath.Join(parent, filepath.Base(dir)), nil
}

// secureDir makes dir if missing under a safe parent (safeParent), refuses a symbolic link, and
// sets its owner and mode through a descriptor (never a path that could be swapped). It returns
// the resolved path.
func secureDir(dir string, uid, gid int, mode uint32) (string, error) {
	dir, err := safeParent(dir)
	if err != nil {
		return "", err
	}
	if err := unix.Mkdir(dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", err
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return "", fmt.Errorf("%s: %w (a symbolic link is refused)", dir, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return "", err
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return "", err
	}
	return dir, nil
}

// openAgentRoot makes the agent root if missing (0755, under a safe parent) and keeps a
// descriptor on it: every agent directory is made and opened relative to it, never through a
// path a request could bend.
func (s *Server) openAgentRoot() error {
	root, err := safeParent(s.cfg.AgentRoot)
	if err != nil {
		return fmt.Errorf("launcher: agent_root: %w", err)
	}
	if err := unix.Mkdir(root, agentRootMode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("launcher: agent_root: %w", err)
	}
	fd, err := unix.Open(root, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("launcher: agent_root %s: %w (a symbolic link is refused)", root, err)
	}
	s.rootFD = fd
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("launcher: agent_root %s: %w", root, err)
	}
	if st.Uid != uint32(os.Geteuid()) {
		return fmt.Errorf("launcher: agent_root %s is owned by uid %d, not the launcher's %d", root, st.Uid, os.Geteuid())
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("launcher: agent_root %s is mode %#o: a group or other may write it", root, st.Mode&0o777)
	}
	return nil
}

// writeToken makes a fresh 32-byte token and writes it, hex, to token_file (0600 in a 0700
// directory, both managerd's), replacing any earlier one atomically.
func (s *Server) writeToken() error {
	mUID, mGID := int(*s.cfg.Manager.UID), int(*s.cfg.Manager.GID)
	dir, err := secureDir(filepath.Dir(s.cfg.TokenFile), mUID, mGID, tokenDirMode)
	if err != nil {
		return fmt.Errorf("launcher: token_file directory: %w", err)
	}
	s.token = make([]byte, tokenBytes)
	if _, err := rand.Read(s.token); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("launcher: token directory %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	hexTok := []byte(hex.EncodeToString(s.token) + "\n")
	defer clear(hexTok)
	if err := writeFileAt(dfd, filepath.Base(s.cfg.TokenFile), hexTok, mUID, mGID, tokenFileMode); err != nil {
		return fmt.Errorf("launcher: token file %s: %w", s.cfg.TokenFile, err)
	}
	return nil
}

// writeFileAt writes data to name in the directory dfd atomically: a new file under a random
// name (O_EXCL|O_NOFOLLOW, so nothing planted there is followed), owned uid:gid with mode, synced,
// then renamed over name (a symbolic link at name is replaced, never followed).
func writeFileAt(dfd int, name string, data []byte, uid, gid int, mode uint32) error {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return err
	}
	tmp := "." + name + "." + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = unix.Unlinkat(dfd, tmp, 0)
		}
	}()
	if err := f.Chown(uid, gid); err != nil {
		return err
	}
	if err := f.Chmod(os.FileMode(mode)); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := unix.Renameat(dfd, tmp, dfd, name); err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	ok = true
	return nil
}

// listen binds the socket: directory 0750 launcher:manager-group, socket 0660.
func (s *Server) listen() error {
	dir, err := secureDir(filepath.Dir(s.cfg.Socket), os.Geteuid(), int(*s.cfg.Manager.GID), socketDirMode)
	if err != nil {
		return fmt.Errorf("launcher: socket directory: %w", err)
	}
	sock := filepath.Join(dir, filepath.Base(s.cfg.Socket))
	ln, err := unixsock.Listen(sock, int(*s.cfg.Manager.GID), socketFileMode)
	if err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	s.ln = ln
	return nil
}

func (s *Server) serve() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.err = err
				s.log.Error("launcher accept", "err", err)
				go s.Close()
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close()
			s.handle(conn)
		}()
	}
}

// handle serves one connection: peer uid, then the bounded frame, the token, the values, and
// only then the work.
func (s *Server) handle(conn *net.UnixConn) {
	_ = conn.SetDeadline(time.Now().Add(connTimeout))
	cred, err := unixsock.PeerCred(conn)
	if err != nil {
		s.log.Warn("launcher: peer credentials unreadable", "err", err)
		return
	}
	log := s.log.With("peer_uid", cred.Uid, "peer_pid", cred.Pid)
	reply := func(resp response, master *os.File) error {
		body, _ := json.Marshal(resp)
		var oob []byte
		if master != nil {
			oob = unix.UnixRights(int(master.Fd()))
		}
		_, _, err := conn.WriteMsgUnix(frame(body), oob, nil)
		if err != nil {
			log.Warn("launcher: answer not sent", "err", err)
		}
		return err
	}
	refused := func(err error) {
		var re *RefusedError
		if !errors.As(err, &re) {
			re = refuse(ReasonBadRequest, "%s", trimErr(err))
		}
		log.Warn("launcher: refused", "reason", re.Reason, "msg", re.Message)
		_ = reply(response{Reason: re.Reason, Message: re.Message}, nil)
	}
	if cred.Uid != *s.cfg.Manager.UID {
		refused(refuse(ReasonPeerNotAllowed, "uid %d may not use this launcher", cred.Uid))
		return
	}
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		refused(refuse(ReasonResourceExhausted, "%d requests in flight", maxConcurrent))
		return
	}
	body, err := readFrame(bufio.NewReaderSize(conn, 4096), MaxRequestBytes)
	if err != nil {
		refused(err)
		return
	}
	req, err := decodeRequest(body)
	clear(body)
	if err != nil {
		refused(err)
		return
	}
	if err := checkToken(s.token, req.Token); err != nil {
		refused(err)
		return
	}
	req.Token = ""
	if err := s.cfg.validate(req); err != nil {
		refused(err)
		return
	}
	switch req.Op {
	case opReplace:
		defer clear(req.Material)
		if err := s.replaceMaterial(req); err != nil {
			refused(err)
			return
		}
		log.Info("launcher: replaced launch material", "pid", req.Pid)
		_ = reply(response{OK: true}, nil)
	case opSignal:
		if err := s.signal(req); err != nil {
			refused(err)
			return
		}
		log.Info("launcher: signalled", "pid", req.Pid, "signal", req.Signal)
		_ = reply(response{OK: true}, nil)
	case opLaunch:
		defer clear(req.Material) // credentials: not kept past the launch
		child, master, err := s.launch(&req.Request)
		if err != nil {
			refused(err)
			return
		}
		defer master.Close()
		log.Info("launcher: started", "agent", req.Name, "connector", req.Connector, "pid", child.Pid)
		if err := reply(response{OK: true, Child: &child}, master); err != nil {
			// Nobody holds the child or its terminal: end it rather than leave it unowned.
			s.kill(child, unix.SIGKILL)
			log.Warn("launcher: killed an agent whose caller did not take it", "agent", req.Name, "pid", child.Pid)
		}
	}
}

// kill signals a running child's group; it does nothing once the child has exited.
func (s *Server) kill(c Child, sig unix.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.children[c.Pid]; ok && st == c.StartTime {
		_ = unix.Kill(-c.Pid, sig)
	}
}

// signal sends TERM or KILL to the process group of a child this launcher started and that has
// not exited, named by pid and start time.
func (s *Server) signal(req *wireRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock() // held across kill: the reaper cannot drop the pid (and the pid be reused) meanwhile
	st, ok := s.children[req.Pid]
	if !ok || st != req.StartTime {
		return refuse(ReasonChildUnknown, "pid %d with start time %d is not a running child of this launcher", req.Pid, req.StartTime)
	}
	// Exited but not yet reaped is gone too (as Child.Gone says), so a caller that saw it gone
	// always hears CHILD_UNKNOWN after.
	if gone, err := (Child{Pid: req.Pid, StartTime: req.StartTime}).Gone(); err != nil || gone {
		return refuse(ReasonChildUnknown, "pid %d has exited", req.Pid)
	}
	sig := unix.SIGTERM
	if req.Signal == "KILL" {
		sig = unix.SIGKILL
	}
	if err := unix.Kill(-req.Pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return refuse(ReasonLaunchFailed, "kill: %v", err)
	}
	return nil
}

// replaceMaterial rewrites the launch material of a child this launcher started and has not
// reaped, named by pid and start time: a new file in the child's directory (opened through the
// agent root's descriptor, no symbolic link followed), the agent's and 0600, renamed over
// launch-material. s.mu is held throughout, so the child cannot be reaped and its name launched
// again meanwhile (a late renewal never overwrites a successor's material).
func (s *Server) replaceMaterial(req *wireRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.children[req.Pid]
	if !ok || st != req.StartTime {
		return refuse(ReasonChildUnknown, "pid %d with start time %d is not a running child of this launcher", req.Pid, req.StartTime)
	}
	if gone, err := (Child{Pid: req.Pid, StartTime: req.StartTime}).Gone(); err != nil || gone {
		return refuse(ReasonChildUnknown, "pid %d has exited", req.Pid)
	}
	name := ""
	for n, pid := range s.names {
		if pid == req.Pid {
			name = n
			break
		}
	}
	if name == "" {
		return refuse(ReasonChildUnknown, "pid %d has no agent directory", req.Pid)
	}
	dfd, err := unix.Openat(s.rootFD, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return refuse(ReasonLaunchFailed, "agent directory: %v", err)
	}
	defer unix.Close(dfd)
	aUID, aGID := int(*s.cfg.Agent.UID), int(*s.cfg.Agent.GID)
	if err := writeFileAt(dfd, materialName, req.Material, aUID, aGID, 0o600); err != nil {
		return refuse(ReasonLaunchFailed, "launch material: %v", err)
	}
	return nil
}

// agentDir makes (or adopts) <agent_root>/<name> relative to the root descriptor, refusing a
// symbolic link, and sets it to agent:manager 0750. It returns an open descriptor on it.
// created says whether this call made it.
func (s *Server) agentDir(name string) (fd int, created bool, err error) {
	err = unix.Mkdirat(s.rootFD, name, 0o700)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, false, err
	}
	created = err == nil
	fd, err = unix.Openat(s.rootFD, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err == nil {
		if err = unix.Fchown(fd, int(*s.cfg.Agent.UID), int(*s.cfg.Manager.GID)); err == nil {
			err = unix.Fchmod(fd, agentDirMode)
		}
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		if created {
			_ = unix.Unlinkat(s.rootFD, name, unix.AT_REMOVEDIR)
		}
		return -1, false, err
	}
	return fd, created, nil
}

// launch starts one agent on a new PTY and returns the child and the PTY master. One name has
// at most one agent from this launcher at a time (NAME_IN_USE): a second would overwrite the
// first's launch material.
func (s *Server) launch(req *Request) (Child, *os.File, error) {
	s.mu.Lock()
	if pid, ok := s.names[req.Name]; ok {
		// An agent that has exited but is not yet reaped no longer holds its name (Child.Gone
		// says it is gone, so its caller may launch it again at once).
		gone, err := Child{Pid: pid, StartTime: s.children[pid]}.Gone()
		if pid == 0 || err != nil || !gone {
			s.mu.Unlock()
			return Child{}, nil, refuse(ReasonNameInUse, "agent %q is launching or running", req.Name)
		}
	}
	s.names[req.Name] = 0
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.mu.Lock()
			if s.names[req.Name] == 0 {
				delete(s.names, req.Name)
			}
			s.mu.Unlock()
		}
	}()
	argv := s.cfg.Connectors[req.Connector].Argv
	aUID, aGID := *s.cfg.Agent.UID, *s.cfg.Agent.GID
	dir := filepath.Join(s.cfg.AgentRoot, req.Name)
	dfd, created, err := s.agentDir(req.Name)
	if err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "agent directory: %v", err)
	}
	defer unix.Close(dfd)
	ok := false
	wroteMaterial := false
	defer func() {
		if ok {
			return
		}
		// A launch that failed leaves no material, and no directory it made.
		if wroteMaterial {
			_ = unix.Unlinkat(dfd, materialName, 0)
		}
		if created {
			_ = unix.Unlinkat(s.rootFD, req.Name, unix.AT_REMOVEDIR)
		}
	}()

	env := []string{"PATH=" + s.cfg.Path, "HOME=" + dir}
	for _, k := range sortedKeys(req.Env) {
		env = append(env, k+"="+req.Env[k])
	}
	if req.Material != nil {
		if err := writeFileAt(dfd, materialName, req.Material, int(aUID), int(aGID), 0o600); err != nil {
			return Child{}, nil, refuse(ReasonLaunchFailed, "launch material: %v", err)
		}
		wroteMaterial = true
		env = append(env, EnvLaunchMaterial+"="+filepath.Join(dir, materialName))
	} else if err := unix.Unlinkat(dfd, materialName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return Child{}, nil, refuse(ReasonLaunchFailed, "stale launch material: %v", err)
	}

	master, slave, err := pty.Open()
	if err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "pty: %v", err)
	}
	defer slave.Close()
	defer func() {
		if !ok {
			master.Close()
		}
	}()
	if req.Rows > 0 && req.Cols > 0 {
		if err := pty.Setsize(master, &pty.Winsize{Rows: req.Rows, Cols: req.Cols}); err != nil {
			return Child{}, nil, refuse(ReasonLaunchFailed, "pty size: %v", err)
		}
	}
	// The terminal is the agent's, as login(1) leaves it.
	if err := slave.Chown(int(aUID), -1); err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "pty owner: %v", err)
	}
	groups := append([]uint32{}, s.cfg.Agent.Groups...) // non-nil: setgroups is always called
	cmd := &exec.Cmd{
		Path:   argv[0],
		Args:   append([]string(nil), argv...),
		Env:    env,
		Dir:    dir,
		Stdin:  slave,
		Stdout: slave,
		Stderr: slave,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:     true,
			Setctty:    true,
			Ctty:       0, // the child's stdin, the PTY slave
			Credential: &syscall.Credential{Uid: aUID, Gid: aGID, Groups: groups},
		},
	}
	if err := cmd.Start(); err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "start %s: %v", req.Connector, err)
	}
	pid := cmd.Process.Pid
	// Not yet waited for, so /proc/<pid> exists (a zombie at worst) and names this child.
	st, err := ReadProcStat(pid)
	if err != nil {
		_ = unix.Kill(-pid, unix.SIGKILL)
		_ = cmd.Wait()
		return Child{}, nil, refuse(ReasonLaunchFailed, "reading the child's start time: %v", err)
	}
	s.mu.Lock()
	s.children[pid] = st.StartTime
	s.names[req.Name] = pid
	started = true
	s.mu.Unlock()
	go func() {
		// Wait for the exit without reaping (WNOWAIT), forget the child, then reap: until the
		// reap the pid stays a zombie, so signal can never reach a process that reused it.
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		s.mu.Lock()
		delete(s.children, pid)
		if s.names[req.Name] == pid {
			delete(s.names, req.Name)
		}
		s.mu.Unlock()
		err := cmd.Wait()
		s.log.Info("launcher: agent exited", "agent", req.Name, "pid", pid, "status", fmt.Sprint(err))
	}()
	ok = true
	return Child{Pid: pid, StartTime: st.StartTime, Dir: dir}, master, nil
}
