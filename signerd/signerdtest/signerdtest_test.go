package signerdtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestHarness proves the harness gives what its callers rely on: a signerd that answers the
// identities it issues certificates for, refuses the ones the policy does not know, and a broker
// that trusts exactly the accounts that signerd serves.
func TestHarness(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha", "beta"}})
	if got := signerdtest.ID(mtls.KindManagerd, "a.b"); got != "spiffe://cotal.local/managerd/a_b" {
		t.Fatalf("ID = %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	call := func(files mtls.ClientFiles, spaceName string) (*signerv1.GetSpaceResponse, error) {
		t.Helper()
		cfg, _, err := mtls.NewClientTLS(files, "localhost")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(s.Addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return signerv1.NewSignerServiceClient(conn).GetSpace(ctx, &signerv1.GetSpaceRequest{Space: spaceName})
	}

	_, spaces := s.Trust(t)
	if len(spaces) != 2 {
		t.Fatalf("Trust returned %d spaces, want 2", len(spaces))
	}
	for i, name := range []string{"alpha", "beta"} {
		resp, err := call(s.ClientFor(t, mtls.KindManagerd, name), name)
		if err != nil {
			t.Fatalf("ok/get-space %s: %v", name, err)
		}
		if resp.GetAccountPublicKey() != spaces[i].DataAccountPublicKey() {
			t.Fatalf("ok/get-space %s: account %s, broker trusts %s", name, resp.GetAccountPublicKey(), spaces[i].DataAccountPublicKey())
		}
	}
	if _, err := call(s.Client(t, "spiffe://cotal.local/stranger"), "alpha"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("fail/unknown-caller: %v, want PermissionDenied", err)
	}

	// A user JWT signed by nobody the broker trusts is refused over TCP: the broker is in
	// operator mode, not open.
	url := s.StartBroker(t)
	if !strings.HasPrefix(url, "nats://127.0.0.1:") {
		t.Fatalf("broker URL %q is not on loopback", url)
	}
	if nc, err := nats.Connect(url, nats.NoReconnect(), nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("fail/anonymous-connect: the broker accepted a connection without credentials")
	}
}

// TestDefaultPolicyDeliverydCredentials shows deliveryd may mint both of its credentials under
// DefaultPolicy, delivery and the membership feed's membership-rw, and that the broker accepts them.
func TestDefaultPolicyDeliverydCredentials(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	url := s.StartBroker(t)
	c, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindDeliveryd, "alpha")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, p := range []signerv1.Profile{signerv1.Profile_PROFILE_DELIVERY, signerv1.Profile_PROFILE_MEMBERSHIP_RW} {
		t.Run("ok/"+p.String(), func(t *testing.T) {
			rail, err := signerclient.NewRail(signerclient.RailConfig{Client: c, Space: "alpha", Profile: p, NatsURL: url})
			if err != nil {
				t.Fatal(err)
			}
			defer rail.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rail.Start(ctx); err != nil {
				t.Fatalf("mint and prove %s: %v", p, err)
			}
		})
	}
}
