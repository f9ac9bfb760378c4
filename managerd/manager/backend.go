package manager

import (
	"context"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/managerd/internal/api"
	managerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/manager/v1"
)

// Backend is the manager as ManagerService serves it, for a host that drives it in process (no
// peer-uid gate: the host is the caller). Its errors are *Refusal for a refused request.
func (m *Manager) Backend() Backend { return backend{m} }

type backend struct{ m *Manager }

var _ api.Backend = backend{}

func (b backend) Spawn(ctx context.Context, req *managerv1.SpawnRequest) (*managerv1.Agent, error) {
	return b.m.spawn(ctx, req)
}

func (b backend) Stop(ctx context.Context, name string) (*managerv1.StopResponse, error) {
	a, err := b.m.lookup(name)
	if err != nil {
		return nil, err
	}
	return b.m.stopAgent(ctx, a)
}

func (b backend) List(context.Context) ([]*managerv1.Agent, error) {
	m := b.m
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*managerv1.Agent, 0, len(m.agents))
	for _, a := range m.agents {
		out = append(out, m.view(a))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (b backend) Inspect(_ context.Context, name string) (*managerv1.InspectResponse, error) {
	m := b.m
	a, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := &managerv1.InspectResponse{
		Agent: m.view(a), AllowSubscribe: a.allowSub, AllowPublish: a.allowPub, Capabilities: a.caps,
		Durables: a.durables, Renewal: m.renewal(a), SpawnPhases: a.phases.proto(),
	}
	if a.dir != "" {
		r.LaunchMaterialPath = a.dir + "/launch-material"
	}
	return r, nil
}

func (b backend) Terminal(name string) (api.Terminal, error) {
	m := b.m
	a, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	t, st := a.term, a.state
	m.mu.Unlock()
	if t == nil {
		return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_AGENT_EXITED, "agent %q has no terminal yet", name)
	}
	if st == managerv1.ProcessState_PROCESS_STATE_EXITED {
		return nil, api.Refuse(codes.FailedPrecondition, managerv1.Reason_REASON_AGENT_EXITED, "agent %q has exited", name)
	}
	return agentTerminal{Terminal: t, a: a}, nil
}

func (b backend) Status(context.Context) (*managerv1.StatusResponse, error) {
	m := b.m
	m.sig.mu.Lock()
	sig := &managerv1.SignerState{Reachable: m.sig.reachable, LastError: m.sig.lastErr}
	if !m.sig.lastContact.IsZero() {
		sig.LastContact = timestamppb.New(m.sig.lastContact)
	}
	m.sig.mu.Unlock()
	reg := m.registrationStatus()
	m.mu.Lock()
	defer m.mu.Unlock()
	released := m.shut != nil && isClosed(m.shut.done) && m.shut.err == nil
	r := &managerv1.StatusResponse{
		Space: m.cfg.Space, InstanceId: m.cfg.InstanceID, Lease: leaseState(m.lease, released), Signer: sig,
		Connectors: append([]string(nil), m.cfg.Connectors...), Agents: uint32(len(m.agents)),
		Capacity: uint32(m.cfg.Capacity), ShuttingDown: m.shutting, Registration: reg,
	}
	for _, a := range m.agents {
		if a.renew.failures > 0 {
			r.RenewalDebt = append(r.RenewalDebt, &managerv1.AgentRenewal{Name: a.name, Renewal: m.renewal(a)})
		}
	}
	sort.Slice(r.RenewalDebt, func(i, j int) bool { return r.RenewalDebt[i].Name < r.RenewalDebt[j].Name })
	if m.rail != nil {
		if _, exp := m.rail.Current(); !exp.IsZero() {
			r.Supervisor = &managerv1.Renewal{ExpiresAt: timestamppb.New(exp)}
		}
	}
	return r, nil
}

func (b backend) Shutdown(ctx context.Context, withAgents bool) (*managerv1.ShutdownResponse, error) {
	// A remote managerd admits it only when its authority authorizes the caller (admin.go).
	if err := b.m.authorizeAdmin(ctx, "Shutdown"); err != nil {
		return nil, err
	}
	return b.m.Shutdown(ctx, withAgents)
}

// lookup finds a named agent or refuses AGENT_UNKNOWN.
func (m *Manager) lookup(name string) (*agent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.agents[name]
	if !ok {
		return nil, api.Refuse(codes.NotFound, managerv1.Reason_REASON_AGENT_UNKNOWN, "no agent %q", name)
	}
	return a, nil
}

// agentTerminal adds the process's exit to its terminal.
type agentTerminal struct {
	Terminal
	a *agent
}

func (t agentTerminal) Exited() <-chan struct{} { return t.a.exited }

// ExitCode is -1: managerd is not the agent's parent (the launcher reaps it), so it knows that
// the process ended, not how.
func (agentTerminal) ExitCode() int32 { return -1 }

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
