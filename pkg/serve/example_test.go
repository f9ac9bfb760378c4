package serve_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/serve"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// The example here is compiled, not run (it has no Output comment: it needs a running authd with
// service_endpoints on, an approved registration and a broker; authd/service
// TestServiceEndpointSequence runs the authority side, pkg/authclient TestRenewalSource the
// renewal source, and TestServeEndpoint the serving side). docs/service-endpoints.md quotes its
// lines, and docs/docs_test.go's TestGoFragments fails unless the quoted lines appear here in
// order.

// ExampleServeEndpoint serves one registered endpoint instance: the pinned authority's issuer and
// keys, the renewal source's first credential turned into a serving grant, and the endpoint
// bound on the broker with the source's bearers.
func ExampleServeEndpoint() {
	ctx := context.Background()
	var login func(ctx context.Context) (string, error) // the signed-in login's IdP token
	var reg serve.Registration                          // embedded: endpoint, instance, contract; Snapshot from the registered answer
	var sentinel string                                 // the space's sentinel JWT (GetSpace, or the public face's bundle)
	account, spaceName := "ADATAACCOUNT...", "demo"     // the data account and space the service registered in
	readyID := "ready-0001"                             // one ready requestId per witness, stored before it is sent
	ep, err := serveBilling(ctx, login, reg, sentinel, account, spaceName, readyID)
	fmt.Println(ep, err)
}

func serveBilling(ctx context.Context, login func(context.Context) (string, error), reg serve.Registration,
	sentinel, account, spaceName, readyID string) (*serve.Endpoint, error) {
	p, err := authclient.NewProvider(authclient.ProviderConfig{URL: "https://auth.example.com/tenant-a",
		Account: account, Space: spaceName, Login: login, Sentinel: sentinel})
	if err != nil {
		return nil, err
	}
	info, err := p.ServiceEndpointInfo(ctx) // GET <URL>/service-endpoint-authority
	if err != nil {
		return nil, err
	}
	auth, err := serve.ServeAuthenticityOf(info) // refuses an authority that publishes no issuer or keys
	if err != nil {
		return nil, err
	}
	witness := serviceaccess.WitnessOf(reg.Snapshot)
	src, err := p.ServiceEndpointRenewal(authclient.RenewalConfig{Dir: "/var/lib/billing/renewal",
		Witness: witness, Endpoint: reg.Endpoint, Instance: reg.Instance})
	if err != nil {
		return nil, err
	}
	cred, err := src.Credential(ctx) // the first pull activates on the signed-in login
	if err != nil {
		src.Close()
		return nil, err
	}
	grant, err := serve.AuthorizeGuestServeGrant(serve.GrantInput{AccountPublicKey: account,
		Result: cred, Registration: reg, Authenticity: auth})
	if err != nil {
		src.Close()
		var early *serve.ServiceAccessNotYetValidError
		if errors.As(err, &early) { // issued more than 5 s ahead of this clock: not a transport failure
			return nil, fmt.Errorf("check this host's clock: %w", err)
		}
		return nil, err
	}
	ready := func(ctx context.Context, access string) error {
		ans, err := p.ServiceEndpointAuthority(ctx, &serviceaccess.Request{Kind: serviceaccess.KindReady,
			Account: account, Space: spaceName, RequestID: readyID,
			Endpoint: reg.Endpoint, Instance: reg.Instance, Witness: witness},
			&serviceaccess.Proof{Kind: serviceaccess.ProofAccess, Token: access})
		if err != nil {
			return err
		}
		if ans.Kind != serviceaccess.AnswerReady {
			return fmt.Errorf("ready answered %s %s", ans.Kind, ans.Code)
		}
		return nil
	}
	ep, err := serve.ServeEndpoint(ctx, serve.EndpointOptions{
		URLs:   []string{"tls://nats.example.com:4222"},
		Bearer: src.Bearer, SentinelCreds: src.SentinelCreds, Grant: grant,
		Handler: func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) },
		Ready:   ready,
	})
	if err != nil {
		src.Close()
		return nil, err
	}
	return ep, nil // ep.Close(ctx), then src.Close(), to stop; ep.Done() and ep.Err() if it stops itself
}
