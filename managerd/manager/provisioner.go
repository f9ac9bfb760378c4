package manager

import (
	"context"
	"strings"

	"github.com/cotalgo/cotal/pkg/provision"
)

// oneShot provisions through pkg/provision with a one-shot credential per call, minted by
// signerd for a key held only in memory: a provisioner to create an agent's durables and ACL row
// (rolled back by a deprovisioner if a step fails), a deprovisioner pinned to exactly that
// lifecycle to remove them.
type oneShot struct{ m *Manager }

func (o *oneShot) config() provision.Config {
	return provision.Config{Signer: o.m.signer, Space: o.m.cfg.Space, NatsURL: strings.Join(o.m.cfg.Brokers, ","), NatsOptions: o.m.opts.NatsOptions}
}

func (o *oneShot) Provision(ctx context.Context, a AgentSpec) ([]string, error) {
	p, err := provision.RunProvisionAgent(ctx, o.config(), provision.Agent{
		Owner: a.Owner, Actor: a.Actor, LifecycleUID: a.LifecycleUID, Role: a.Role, AllowSubscribe: a.AllowSubscribe,
	})
	if err != nil {
		return nil, err
	}
	return p.Durables(), nil
}

func (o *oneShot) Deprovision(ctx context.Context, owner, actor, uid string) ([]string, error) {
	return provision.RunDeprovisionAgent(ctx, o.config(), owner, actor, uid)
}
