package service

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/authority"
	"github.com/cotalgo/cotal/pkg/dlvclient"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// footprint is the stock authority.Footprint of the prepare-retirement writer: the ACL fence and
// the footprint removal each on a one-shot deprovisioner credential signerd mints for authd's
// identity (policy: deprovisioner for any owner), pinned to the lifecycle (and its member
// channels), key in memory only; the inventory is deliveryd's lifecycleMemberships on the plane
// connection as local.authd, the one delivery-admin op that principal may ask.
type footprint struct {
	s     *Service
	names space.Names
	opts  []nats.Option
}

var _ authority.Footprint = (*footprint)(nil)

// footprint is the authority's Footprint for space n; opts are the broker options the one-shot
// connections add (RuntimeOptions.NatsOptions).
func (s *Service) footprint(n space.Names, opts []nats.Option) *footprint {
	return &footprint{s: s, names: n, opts: opts}
}

func (f *footprint) config() provision.Config {
	return provision.Config{Signer: f.s.signer, Space: f.s.cfg.Space, NatsURL: strings.Join(f.s.cfg.Brokers, ","), NatsOptions: f.opts}
}

func (f *footprint) Fence(ctx context.Context, owner, actor, uid string) (provision.Fence, error) {
	return provision.RunFenceLifecycleACL(ctx, f.config(), owner, actor, uid)
}

func (f *footprint) Inventory(ctx context.Context, owner, actor, uid string) (dlvclient.Inventory, error) {
	return dlvclient.LifecycleMemberships(ctx, f.s.dataNC, f.names, profiles.AuthPlaneOwner, profiles.AuthPlaneActor, owner, actor, uid)
}

func (f *footprint) Deprovision(ctx context.Context, owner, actor, uid string, memberChannels []string) (provision.Result, error) {
	return provision.RunDeprovisionAgent(ctx, f.config(), owner, actor, uid, memberChannels)
}
