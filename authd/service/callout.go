package service

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/callout"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// calloutPart is the callout side: the auth-callout credential for authd's registered callout
// user key (from the seed file, through the rail's provided-key option), its broker connection
// and the responder on it.
type calloutPart struct {
	r    *signerclient.Rail
	nc   *nats.Conn
	resp *callout.Responder
	// keys is the bearer JWKS cache the responder verifies with; the service endpoint doors
	// verify service tokens with it too.
	keys *bearer.Cache
}

func (c calloutPart) rail() *signerclient.Rail { return c.r }

// closeResponder stops answering: the responder unsubscribes and cancels and waits for the
// requests in flight. The connection and the rail stay for close.
func (c calloutPart) closeResponder() {
	if c.resp != nil {
		c.resp.Close()
	}
}

// close unsubscribes (waiting for requests in flight), closes the connection, then wipes the
// rail's key.
func (c calloutPart) close() {
	if c.resp != nil {
		c.resp.Close()
	}
	if c.nc != nil {
		c.nc.Close()
	}
	if c.r != nil {
		c.r.Close()
	}
}

// startCallout reads the callout seed (mode and owner checked by pkg/creds), starts the rail on
// it, connects, fetches the bearer JWKS once (a signerd that cannot serve it shows at start, not
// at the first connect) and starts the responder, which returns once its subscription is
// flushed. The responder's service arm checks service access bearers against the same JWKS
// and asks the lifecycle authority (CheckServe) before it grants service-serve. The seed is wiped once the rail has decoded its key. The responder lives until runCtx
// ends or close.
func startCallout(ctx, runCtx context.Context, s *Service, in RuntimeOptions, led *ledger.Ledger) (calloutPart, error) {
	var c calloutPart
	seed, err := creds.ReadSeedFile(s.cfg.CalloutSeed)
	if err != nil {
		return c, &StartError{Code: CodeConfig, Reason: "callout_seed refused", Err: err}
	}
	c.r, err = signerclient.NewRail(signerclient.RailConfig{
		Client: s.signer, Space: s.cfg.Space, Profile: signerv1.Profile_PROFILE_AUTH_CALLOUT,
		NatsURLs: s.cfg.Brokers, Logger: s.log, Now: in.Now, UserSeed: seed, OnRenewFailed: s.renewFailed("auth-callout"),
	})
	seed.Wipe()
	if err != nil {
		return c, &StartError{Code: CodeConfig, Reason: "callout rail refused", Err: err}
	}
	if err := c.r.Start(ctx); err != nil {
		return c, &StartError{Code: railCode(err), Reason: "no auth-callout credential for the registered callout user", Err: err}
	}
	if c.nc, err = connect(s.cfg, c.r, "authd-callout", s.connOptions("authd-callout", in.NatsOptions)); err != nil {
		return c, &StartError{Code: CodeBroker, Reason: "callout connection refused", Err: err}
	}
	jwks, err := bearer.NewCache(bearer.CacheConfig{Space: s.cfg.Space, Signer: s.signer.API(), Now: in.Now, Logger: s.log})
	if err != nil {
		return c, &StartError{Code: CodeConfig, Reason: "bearer JWKS cache refused", Err: err}
	}
	if err := jwks.Refresh(ctx); err != nil {
		return c, &StartError{Code: CodeSigner, Reason: "signerd did not serve the bearer JWKS", Err: err}
	}
	c.keys = jwks
	// The service arm asks the authority whether a service access bearer's registration, gate,
	// root, approval and name binding still stand. With service endpoints off, or without an
	// authority, there is no gate and every service connect is refused.
	var services callout.ServiceGate
	if s.authority != nil && s.cfg.ServiceEndpoints {
		services = s.authority
	}
	if c.resp, err = callout.New(callout.Config{
		Space: s.cfg.Space, Signer: s.signer, Ledger: led, JWKS: jwks, Lifecycle: s.authority.Store(), Services: services,
		AllowedServers: s.cfg.AllowedServers, MaxInFlight: s.cfg.MaxInFlight, Now: in.Now, Logger: s.log,
		OpenRate: s.cfg.CalloutOpens.Callout(), RefusalRate: s.cfg.CalloutRefusals.Callout(),
		Gate: s.gate.open, Warn: s.calloutWarn,
	}); err != nil {
		return c, &StartError{Code: CodeConfig, Reason: "callout responder refused", Err: err}
	}
	if err := c.resp.Start(runCtx, c.nc); err != nil {
		return c, &StartError{Code: CodeCallout, Reason: "callout subscription", Err: err}
	}
	return c, nil
}
