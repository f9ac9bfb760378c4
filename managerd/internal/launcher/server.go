package launcher

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// owns, signal the agent uids' process groups, and empty the agent's capability bounding set
// (CAP_SETPCAP, in the trampoline).
var requiredCaps = []struct {
	bit  uint
	name string
}{
	{unix.CAP_CHOWN, "CAP_CHOWN"},
	{unix.CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"},
	{unix.CAP_FOWNER, "CAP_FOWNER"},
	{unix.CAP_KILL, "CAP_KILL"},
	{unix.CAP_SETGID, "CAP_SETGID"},
	{unix.CAP_SETPCAP, "CAP_SETPCAP"},
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

	cgParent string // the agents' cgroups are made here

	mu       sync.Mutex
	children map[int]*childRec // pid → its record, until its cgroup is proven empty
	names    map[string]int    // agent name → its child's pid (0 while launching)
	freeUIDs []uint32          // the range's free uids, least recently released first

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
	if err := checkRangeFree(cfg.Agents, "/etc/passwd", "/etc/group"); err != nil {
		return nil, err
	}
	if euid := uint32(os.Geteuid()); cfg.Agents.Contains(euid) {
		return nil, fmt.Errorf("launcher: agents: the range %d-%d holds the launcher's own uid %d", *cfg.Agents.UIDFirst, cfg.Agents.Last(), euid)
	}
	cgParent, err := prepareCgroupParent(cfg.CgroupParent)
	if err != nil {
		return nil, err
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	drained, err := drainLeftovers(dctx, cgParent, cfg.Agents)
	dcancel()
	if err != nil {
		return nil, err
	}
	for _, d := range drained {
		log.Warn("launcher: killed a predecessor's agent cgroup before serving", "cgroup", d)
	}
	s := &Server{cfg: cfg, log: log, rootFD: -1, sem: make(chan struct{}, maxConcurrent), cgParent: cgParent,
		children: map[int]*childRec{}, names: map[string]int{}, done: make(chan struct{})}
	for u := uint64(*cfg.Agents.UIDFirst); u <= uint64(cfg.Agents.Last()); u++ {
		s.freeUIDs = append(s.freeUIDs, uint32(u))
	}
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
	log.Info("launcher listening", "socket", cfg.Socket, "manager_uid", *cfg.Manager.UID,
		"agent_uids", fmt.Sprintf("%d-%d", *cfg.Agents.UIDFirst, cfg.Agents.Last()), "cgroup_parent", cgParent)
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
			s.kill(child)
			log.Warn("launcher: killed an agent whose caller did not take it", "agent", req.Name, "pid", child.Pid)
		}
	}
}

// childRec is what the launcher keeps of an agent it started, until its cgroup is proven empty.
type childRec struct {
	start  uint64
	name   string
	uid    uint32
	cg     string // its cgroup
	exited bool   // the leader has exited (it stays a zombie until the cgroup is proven empty)
}

// kill ends a child that nobody took: every process of its cgroup.
func (s *Server) kill(c Child) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rec, ok := s.children[c.Pid]; ok && rec.start == c.StartTime {
		_ = killCgroup(rec.cg)
	}
}

// signal acts on a child this launcher started and has not released, named by pid and start time:
// TERM goes to its process group (while the leader lives), KILL to every process of its cgroup
// (cgroup.kill: a descendant that left the group or session too), PROBE only answers whether the
// child is still held. A child is held until its whole cgroup is proven empty, so CHILD_UNKNOWN is
// the proof Terminate waits for.
func (s *Server) signal(req *wireRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock() // held across kill: the reaper cannot reap the leader (and its pid be reused) meanwhile
	rec, ok := s.children[req.Pid]
	if !ok || rec.start != req.StartTime {
		return refuse(ReasonChildUnknown, "pid %d with start time %d is not a child of this launcher that may still run", req.Pid, req.StartTime)
	}
	switch req.Signal {
	case "KILL":
		if err := killCgroup(rec.cg); err != nil {
			return refuse(ReasonLaunchFailed, "cgroup.kill: %v", err)
		}
	case "TERM":
		if rec.exited {
			return nil // its reaper is killing the rest of the cgroup
		}
		if err := unix.Kill(-req.Pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
			return refuse(ReasonLaunchFailed, "kill: %v", err)
		}
	}
	return nil
}

// replaceMaterial rewrites the launch material of a child this launcher started whose leader
// has not exited, named by pid and start time: a new file in the child's directory (opened
// through the agent root's descriptor, no symbolic link followed), the agent's and 0600, renamed
// over launch-material. s.mu is held throughout, so the child cannot be released and its name
// launched again meanwhile (a late renewal never overwrites a successor's material).
func (s *Server) replaceMaterial(req *wireRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.children[req.Pid]
	if !ok || rec.start != req.StartTime {
		return refuse(ReasonChildUnknown, "pid %d with start time %d is not a running child of this launcher", req.Pid, req.StartTime)
	}
	if rec.exited {
		return refuse(ReasonChildUnknown, "pid %d has exited", req.Pid)
	}
	dfd, err := s.openAgentDir(rec.name)
	if err != nil {
		return refuse(ReasonLaunchFailed, "agent directory: %v", err)
	}
	defer unix.Close(dfd)
	if err := writeFileAt(dfd, materialName, req.Material, int(rec.uid), int(rec.uid), 0o600); err != nil {
		return refuse(ReasonLaunchFailed, "launch material: %v", err)
	}
	return nil
}

// agentDir makes (or adopts) <agent_root>/<name> relative to the root descriptor, refusing a
// symbolic link, and sets it to uid:manager 0750. It returns an open descriptor on it. created
// says whether this call made it.
func (s *Server) agentDir(name string, uid uint32) (fd int, created bool, err error) {
	err = unix.Mkdirat(s.rootFD, name, 0o700)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, false, err
	}
	created = err == nil
	fd, err = s.openAgentDir(name)
	if err == nil {
		if err = s.ownAgentDir(fd, int(uid)); err != nil {
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

// openAgentDir opens <agent_root>/<name> through the root's descriptor, refusing a symbolic link.
func (s *Server) openAgentDir(name string) (int, error) {
	return unix.Openat(s.rootFD, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
}

// ownAgentDir gives the agent directory open at fd to uid and managerd's group, 0750.
func (s *Server) ownAgentDir(fd, uid int) error {
	if err := unix.Fchown(fd, uid, int(*s.cfg.Manager.GID)); err != nil {
		return err
	}
	return unix.Fchmod(fd, agentDirMode)
}

// parkAgentDir is the release of an agent's directory once the agent is proven gone: its launch
// material (a credential still valid until it expires) is removed and the directory goes back to
// the launcher's uid (launcher:manager 0750), so that whoever is given this uid next cannot enter
// it. A later launch of the name gives it to that agent's uid.
func (s *Server) parkAgentDir(name string) error {
	fd, err := s.openAgentDir(name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := s.ownAgentDir(fd, os.Geteuid()); err != nil {
		return err
	}
	if err := unix.Unlinkat(fd, materialName, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// takeUID hands out the least recently released uid of the range whose cgroup it can make (one
// that exists belongs to a process not yet proven gone, or to another launcher: skipped). It
// returns the uid and an open descriptor on its new cgroup. s.mu must not be held.
func (s *Server) takeUID() (uint32, string, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range len(s.freeUIDs) {
		uid := s.freeUIDs[0]
		s.freeUIDs = s.freeUIDs[1:]
		dir := cgroupDir(s.cgParent, uid)
		fd, err := makeCgroup(dir)
		if err == nil {
			return uid, dir, fd, nil
		}
		s.freeUIDs = append(s.freeUIDs, uid) // not free after all: try it again later
		if !errors.Is(err, unix.EEXIST) {
			return 0, "", -1, refuse(ReasonLaunchFailed, "agent cgroup %s: %v", dir, err)
		}
		s.log.Warn("launcher: an agent uid's cgroup exists already; skipped", "uid", uid, "cgroup", dir)
	}
	return 0, "", -1, refuse(ReasonUIDsExhausted, "every uid of agents (%d-%d) is held by an agent not yet proven gone", *s.cfg.Agents.UIDFirst, s.cfg.Agents.Last())
}

// releaseUID returns a uid whose cgroup is proven empty and removed to the end of the free list.
// s.mu must be held.
func (s *Server) releaseUID(uid uint32) { s.freeUIDs = append(s.freeUIDs, uid) }

// launch starts one agent on a new PTY and returns the child and the PTY master. One name has
// at most one agent from this launcher at a time (NAME_IN_USE): a second would overwrite the
// first's launch material.
func (s *Server) launch(req *Request) (Child, *os.File, error) {
	s.mu.Lock()
	if _, ok := s.names[req.Name]; ok {
		// A name is held until its agent's cgroup is proven empty.
		s.mu.Unlock()
		return Child{}, nil, refuse(ReasonNameInUse, "agent %q is launching, running, or not yet proven gone", req.Name)
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
	uid, cg, cgFD, err := s.takeUID()
	if err != nil {
		return Child{}, nil, err
	}
	defer unix.Close(cgFD)
	ok := false
	defer func() {
		if ok {
			return
		}
		// Nothing of a failed launch runs in its cgroup any more (the trampoline failed, or
		// never started): drain it to be sure, and free the uid only once it is gone.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := drainCgroup(ctx, cg); err != nil {
			s.log.Error("launcher: a failed launch's cgroup is not proven empty; its uid stays held", "uid", uid, "err", err)
			return
		}
		s.mu.Lock()
		s.releaseUID(uid)
		s.mu.Unlock()
	}()
	argv := s.cfg.Connectors[req.Connector].Argv
	dir := filepath.Join(s.cfg.AgentRoot, req.Name)
	dfd, created, err := s.agentDir(req.Name, uid)
	if err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "agent directory: %v", err)
	}
	defer unix.Close(dfd)
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
		} else {
			_ = s.parkAgentDir(req.Name)
		}
	}()

	env := []string{"PATH=" + s.cfg.Path, "HOME=" + dir}
	for _, k := range sortedKeys(req.Env) {
		env = append(env, k+"="+req.Env[k])
	}
	if req.Material != nil {
		if err := writeFileAt(dfd, materialName, req.Material, int(uid), int(uid), 0o600); err != nil {
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
	// The terminal is the agent's, as login(1) leaves it: no other agent uid may open it.
	if err := slave.Chown(int(uid), -1); err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "pty owner: %v", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "status pipe: %v", err)
	}
	defer statusR.Close()
	// The trampoline (this binary, TrampolineArg) runs as root in the agent's cgroup (it is born
	// there: CLONE_INTO_CGROUP), session and terminal, drops every privilege and execs argv.
	targs := append([]string{"cotal-agent", TrampolineArg, strconv.FormatUint(uint64(uid), 10), strconv.FormatUint(uint64(uid), 10), "--"}, argv...)
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       targs,
		Env:        env,
		Dir:        dir,
		Stdin:      slave,
		Stdout:     slave,
		Stderr:     slave,
		ExtraFiles: []*os.File{statusW}, // fd 3 in the trampoline: statusFD
		SysProcAttr: &syscall.SysProcAttr{
			Setsid:      true,
			Setctty:     true,
			Ctty:        0, // the child's stdin, the PTY slave
			UseCgroupFD: true,
			CgroupFD:    cgFD,
		},
	}
	err = cmd.Start()
	statusW.Close()
	if err != nil {
		return Child{}, nil, refuse(ReasonLaunchFailed, "start %s: %v", req.Connector, err)
	}
	pid := cmd.Process.Pid
	startTime, err := readTrampolineStatus(statusR)
	if err != nil {
		_ = killCgroup(cg)
		_ = cmd.Wait()
		return Child{}, nil, refuse(ReasonLaunchFailed, "start %s: %v", req.Connector, err)
	}
	rec := &childRec{start: startTime, name: req.Name, uid: uid, cg: cg}
	s.mu.Lock()
	s.children[pid] = rec
	s.names[req.Name] = pid
	started = true
	s.mu.Unlock()
	go s.reap(cmd, pid, rec)
	ok = true
	return Child{Pid: pid, StartTime: startTime, Dir: dir, UID: uid}, master, nil
}

// readTrampolineStatus reads the trampoline's start time, then its status until EOF: EOF alone
// means the connector was exec'd; anything else is why it was not.
func readTrampolineStatus(r *os.File) (uint64, error) {
	_ = r.SetReadDeadline(time.Now().Add(connTimeout))
	var b [8]byte
	n, err := io.ReadFull(r, b[:])
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	if n < 8 {
		if len(msg) == 0 {
			msg = b[:n]
		}
		return 0, fmt.Errorf("the agent's trampoline reported no start time (%v): %s", err, msg)
	}
	if len(msg) > 0 {
		return 0, errors.New(strings.ToValidUTF8(string(msg), "?"))
	}
	st := binary.BigEndian.Uint64(b[:])
	if st == 0 {
		return 0, errors.New("the agent's trampoline reported start time 0")
	}
	return st, nil
}

// reap waits for the leader's exit without reaping it (WNOWAIT), then kills whatever is left of
// its cgroup and waits until cgroup.events proves it empty, removes the cgroup, parks the agent's
// directory, forgets the child and frees its name and uid, and only then reaps the leader: until
// the reap its pid stays a zombie, so a signal can never reach a process that reused it, and
// Child.Gone (no such pid) implies the whole cgroup is gone.
func (s *Server) reap(cmd *exec.Cmd, pid int, rec *childRec) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	s.mu.Lock()
	rec.exited = true
	s.mu.Unlock()
	// The agent's life is its leader's: what it left running (a daemonised descendant) holds
	// its credential, so it goes too. Proven empty before anything is released; a cgroup that
	// does not empty (a process stuck in the kernel) keeps its uid and name held.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := drainCgroup(ctx, rec.cg)
		cancel()
		if err == nil {
			break
		}
		s.log.Error("launcher: an agent's cgroup is not proven empty; its uid and name stay held", "agent", rec.name, "uid", rec.uid, "err", err)
	}
	if err := s.parkAgentDir(rec.name); err != nil {
		s.log.Warn("launcher: parking an agent's directory", "agent", rec.name, "err", err)
	}
	s.mu.Lock()
	delete(s.children, pid)
	if s.names[rec.name] == pid {
		delete(s.names, rec.name)
	}
	s.releaseUID(rec.uid)
	s.mu.Unlock()
	err := cmd.Wait()
	s.log.Info("launcher: agent exited; its cgroup is empty and its uid free", "agent", rec.name, "pid", pid, "uid", rec.uid, "status", fmt.Sprint(err))
}
