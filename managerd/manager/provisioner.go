package manager

import (
	"context"
	"strings"

	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// oneShot provisions through pkg/provision with a one-shot credential per call, minted by
// signerd for a key held only in memory: a provisioner to create an agent's durables and ACL row
// (rolled back by a deprovisioner if a step fails), a deprovisioner pinned to exactly that
// lifecycle (and its membership rows on the agent's concrete read channels) to remove them.
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

func (o *oneShot) Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (provision.Result, error) {
	return provision.RunDeprovisionAgent(ctx, o.config(), owner, actor, uid, memberChannels)
}

// memberChannels names the channels whose membership rows an agent's teardown purges: the
// concrete channels of its launch's read lists (subscribe, then allow_subscribe), in that order,
// without repeats. A pattern names no row key and is skipped: a row on a channel only a pattern
// covers stays for deliveryd's fan-out writer, which closes a departed lifecycle's rows. At most
// provision.MaxMemberChannels are named; truncated reports whether some were left out.
func memberChannels(lists ...[]string) (chans []string, truncated bool) {
	seen := map[string]bool{}
	for _, l := range lists {
		for _, ch := range l {
			if seen[ch] || space.ValidateChannel(ch) != nil {
				continue
			}
			if len(chans) == provision.MaxMemberChannels {
				return chans, true
			}
			seen[ch] = true
			chans = append(chans, ch)
		}
	}
	return chans, false
}
