package launcher

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Client is managerd's side of the launcher socket.
type Client struct {
	// Socket is the launcher's socket path. Required.
	Socket string
	// TokenFile is the launcher's token file, re-read on every call (a restarted launcher writes
	// a new token). Required. It must be a regular file owned by this process's uid and not
	// readable by group or other.
	TokenFile string
}

// DefaultTimeout bounds a call whose context has no deadline.
const DefaultTimeout = 10 * time.Second

var _ SignalFunc = (*Client)(nil).Signal

// Launch asks the launcher to start an agent. It returns the child and the PTY master (the
// caller's to read, write and close; closing it hangs the agent's terminal up; it is pollable, so
// read deadlines work). A refusal is a *RefusedError.
func (c *Client) Launch(ctx context.Context, req Request) (Child, *os.File, error) {
	resp, master, err := c.call(ctx, wireRequest{Op: opLaunch, Request: req})
	if err != nil {
		return Child{}, nil, err
	}
	if resp.Child == nil || resp.Child.Pid <= 1 || resp.Child.StartTime == 0 {
		if master != nil {
			master.Close()
		}
		return Child{}, nil, errors.New("launcher: answer names no child")
	}
	if master == nil {
		return Child{}, nil, errors.New("launcher: answer carries no PTY master")
	}
	return *resp.Child, master, nil
}

// Signal asks the launcher to send sig to a child it started: SIGTERM to its process group,
// SIGKILL to every process of its cgroup; signal 0 is a probe, nil while the launcher still holds
// the child (some process of its cgroup may live) and a CHILD_UNKNOWN refusal once it has proven
// the cgroup empty. It is a SignalFunc, for Terminate.
func (c *Client) Signal(ctx context.Context, child Child, sig syscall.Signal) error {
	var name string
	switch sig {
	case 0:
		name = "PROBE"
	case syscall.SIGTERM:
		name = "TERM"
	case syscall.SIGKILL:
		name = "KILL"
	default:
		return fmt.Errorf("launcher: signal %v: only SIGTERM, SIGKILL and 0 (probe)", sig)
	}
	_, master, err := c.call(ctx, wireRequest{Op: opSignal, Pid: child.Pid, StartTime: child.StartTime, Signal: name})
	if master != nil {
		master.Close()
		return errors.New("launcher: a signal answer carried a descriptor")
	}
	return err
}

// ReplaceMaterial asks the launcher to replace the launch material of a child it started and has
// not reaped (named by pid and start time) with material, atomically: the agent reads either the
// old file or the new one, never a mix. It is how managerd, whose uid cannot write the agent's
// 0600 file, hands a renewed credential over. A child the launcher does not know, or that has
// exited, is refused CHILD_UNKNOWN.
func (c *Client) ReplaceMaterial(ctx context.Context, child Child, material []byte) error {
	if len(material) == 0 {
		return refuse(ReasonBadRequest, "replace_material needs the new material")
	}
	if len(material) > MaxMaterialBytes {
		return refuse(ReasonTooLarge, "material of %d bytes is over %d", len(material), MaxMaterialBytes)
	}
	_, master, err := c.call(ctx, wireRequest{Op: opReplace, Pid: child.Pid, StartTime: child.StartTime,
		Request: Request{Material: material}})
	if master != nil {
		master.Close()
		return errors.New("launcher: a replace_material answer carried a descriptor")
	}
	return err
}

// readToken reads the token file, refusing one another uid owns or others may read.
func (c *Client) readToken() (string, error) {
	f, err := os.OpenFile(c.TokenFile, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("launcher token: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", fmt.Errorf("launcher token: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o077 != 0 || st.Uid != uint32(os.Geteuid()) {
		return "", fmt.Errorf("launcher token: %s must be a regular file of this uid, mode 0600", c.TokenFile)
	}
	buf := make([]byte, 2*tokenBytes+2)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return "", fmt.Errorf("launcher token: %w", err)
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// call sends one request and reads the one answer, with any descriptor passed with it.
func (c *Client) call(ctx context.Context, req wireRequest) (*response, *os.File, error) {
	tok, err := c.readToken()
	if err != nil {
		return nil, nil, err
	}
	req.Token = tok
	body, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	defer clear(body) // it holds the token and the launch material
	if len(body) > MaxRequestBytes {
		return nil, nil, refuse(ReasonTooLarge, "request of %d bytes is over %d", len(body), MaxRequestBytes)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return nil, nil, fmt.Errorf("launcher: %w", err)
	}
	conn := nc.(*net.UnixConn)
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(frame(body)); err != nil {
		// The launcher may have answered (a refusal) and closed before reading everything.
		if resp, f, rerr := readResponse(conn); rerr == nil {
			return finish(resp, f)
		}
		return nil, nil, fmt.Errorf("launcher: send: %w", err)
	}
	resp, master, err := readResponse(conn)
	if err != nil {
		return nil, nil, err
	}
	return finish(resp, master)
}

func finish(resp *response, master *os.File) (*response, *os.File, error) {
	if !resp.OK {
		if master != nil {
			master.Close()
		}
		r := resp.Reason
		if r == "" {
			r = ReasonBadRequest
		}
		return nil, nil, &RefusedError{Reason: r, Message: resp.Message}
	}
	return resp, master, nil
}

// readResponse reads one response frame, collecting a descriptor passed with it (SCM_RIGHTS).
func readResponse(conn *net.UnixConn) (*response, *os.File, error) {
	var fds []int
	closeFDs := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	var data []byte
	buf := make([]byte, 4+MaxResponseBytes)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		need := 4
		if len(data) >= 4 {
			n := binary.BigEndian.Uint32(data[:4])
			if n > MaxResponseBytes {
				closeFDs()
				return nil, nil, fmt.Errorf("launcher: answer of %d bytes is over %d", n, MaxResponseBytes)
			}
			need = 4 + int(n)
		}
		if len(data) >= need {
			if len(data) > need {
				closeFDs()
				return nil, nil, errors.New("launcher: data after the answer")
			}
			break
		}
		n, oobn, _, _, err := conn.ReadMsgUnix(buf[:need-len(data)], oob)
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil {
				closeFDs()
				return nil, nil, perr
			}
		}
		data = append(data, buf[:n]...)
		if err != nil || n == 0 {
			closeFDs()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, fmt.Errorf("launcher: reading the answer: %w", err)
		}
	}
	var resp response
	if err := json.Unmarshal(data[4:], &resp); err != nil {
		closeFDs()
		return nil, nil, fmt.Errorf("launcher: answer: %w", err)
	}
	if len(fds) > 1 {
		closeFDs()
		return nil, nil, fmt.Errorf("launcher: answer carried %d descriptors", len(fds))
	}
	var f *os.File
	if len(fds) == 1 {
		unix.CloseOnExec(fds[0])
		// Non-blocking, so os.NewFile registers it with the poller: the caller can use read
		// deadlines and Close unblocks a reader.
		if err := unix.SetNonblock(fds[0], true); err != nil {
			closeFDs()
			return nil, nil, fmt.Errorf("launcher: PTY master: %w", err)
		}
		f = os.NewFile(uintptr(fds[0]), "launcher-pty-master")
	}
	return &resp, f, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("launcher: control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, fmt.Errorf("launcher: control message: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}
