package service

// The enrollment writer's provisioner (issue 25 item 4): an enrolled managed agent's durables and
// ACL row are made on this authd's own one-shot provisioner credential and removed on a one-shot
// deprovisioner credential pinned to the lifecycle, both minted through signerd
// (pkg/provision's Run forms; the policies let authd mint both for any owner).

import (
	"context"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/pkg/provision"
)

// brokerProvisioner is authority.Provisioner on pkg/provision.
type brokerProvisioner struct{ cfg provision.Config }

var _ authority.Provisioner = brokerProvisioner{}

// newProvisioner is the provisioner of this authd: its signer client, its brokers and the
// host's broker options (TLS, say).
func (s *Service) newProvisioner(natsOpts []nats.Option) brokerProvisioner {
	return brokerProvisioner{cfg: provision.Config{Signer: s.signer, Space: s.cfg.Space, NatsURL: strings.Join(s.cfg.Brokers, ","),
		NatsOptions: slices.Clone(natsOpts)}}
}

// ProvisionAgent is provision.RunProvisionAgent on a credential minted for spawnerOwner.spawnerActor.
func (p brokerProvisioner) ProvisionAgent(ctx context.Context, spawnerOwner, spawnerActor string, a provision.Agent) error {
	cfg := p.cfg
	cfg.Owner, cfg.Actor = spawnerOwner, spawnerActor
	_, err := provision.RunProvisionAgent(ctx, cfg, a)
	return err
}

// DeprovisionAgent is the one call of pkg/provision's deprovisioning, undoing an enrollment that
// failed: its agent never connected, so it joined no channel and holds no members row; only its
// durables and ACL row are removed.
func (p brokerProvisioner) DeprovisionAgent(ctx context.Context, owner, actor, uid string) error {
	_, err := provision.RunDeprovisionAgent(ctx, p.cfg, owner, actor, uid, nil)
	return err
}

// enrollPublicURL is the public face's base URL as the face will publish it
// (exchange.CheckPublicURL), "" without a public face; known before the face starts, so the
// authority built first can answer it.
func (s *Service) enrollPublicURL() string {
	if s.cfg.PublicListen == "" {
		return ""
	}
	u, err := exchange.CheckPublicURL(s.cfg.PublicURL)
	if err != nil {
		return "" // the face refuses to start with it: start fails before any enrollment
	}
	return u
}
