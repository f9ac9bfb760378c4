// Package api serves ManagerService (proto/cotal/manager/v1) for a Backend, on a Unix socket that
// admits only configured peer uids (SO_PEERCRED), or on any listener for in-process tests.
package api

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"

	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// Backend is what the service calls: managerd's Manager. Its methods return a *Refusal for a
// request refused with a reason; any other error is reported as INTERNAL without its text.
type Backend interface {
	Spawn(ctx context.Context, req *managerv1.SpawnRequest) (*managerv1.Agent, error)
	Stop(ctx context.Context, name string) (*managerv1.StopResponse, error)
	List(ctx context.Context) ([]*managerv1.Agent, error)
	Inspect(ctx context.Context, name string) (*managerv1.InspectResponse, error)
	// Terminal returns a running agent's terminal for Attach and Input.
	Terminal(name string) (Terminal, error)
	Status(ctx context.Context) (*managerv1.StatusResponse, error)
	Shutdown(ctx context.Context, withAgents bool) (*managerv1.ShutdownResponse, error)
}

// Terminal is one agent's PTY as the manager shares it among attach sessions.
type Terminal interface {
	// Attach subscribes to the output: snapshot is the recent output (at most the terminal's
	// snapshot size), out carries every later byte in order, and closes when the terminal ends
	// or the subscriber fell too far behind (then lagged reports true). detach unsubscribes.
	Attach() (snapshot []byte, out <-chan []byte, lagged func() bool, detach func(), err error)
	// Write sends keystrokes to the agent. It returns once the agent's terminal took them, or
	// when ctx is done (how many bytes it took, and ctx's error), so an agent that stopped
	// reading its input holds a caller no longer than that caller's deadline.
	Write(ctx context.Context, p []byte) (int, error)
	// Resize sets the terminal size.
	Resize(rows, cols uint16) error
	// Exited is closed once the agent's process has exited; ExitCode is then its code, or -1.
	Exited() <-chan struct{}
	ExitCode() int32
}

// Refusal is a request refused with a reason; the service sends it as Code with a
// google.rpc.ErrorInfo detail (domain ErrorDomain, reason the enum name without "REASON_").
type Refusal struct {
	Code    codes.Code
	Reason  managerv1.Reason
	Message string
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("managerd: %s: %s", r.Reason, r.Message)
}

// Refuse builds a *Refusal.
func Refuse(code codes.Code, reason managerv1.Reason, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// ErrorDomain is the google.rpc.ErrorInfo domain of every managerd refusal.
const ErrorDomain = "manager.cotal"
