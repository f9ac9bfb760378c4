package server_test

import (
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"google.golang.org/grpc/codes"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestCalloutCapturedRequestReplay: a captured authorization request no longer opens at a real
// signerd once CalloutClockSkew (5 s) has passed since its exp, on either callout RPC; a fresh
// one still does. Before, one opened for 60 s past its exp.
func TestCalloutCapturedRequestReplay(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha"}})
	authd := dial(t, s.Addr, s.ClientFor(t, mtls.KindAuthd, "alpha"))
	gs, err := authd.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	srv := newForgedServer(t)
	expAgo := func(d time.Duration) func(*jwt.AuthorizationRequestClaims) {
		return func(ac *jwt.AuthorizationRequestClaims) { ac.Expires = time.Now().Add(-d).Unix() }
	}

	t.Run("ok/a-request-at-its-exp-opens", func(t *testing.T) {
		sealed, user := srv.request(t, gs, newNonce(), expAgo(0))
		resp, err := authd.OpenCalloutRequest(ctxT(t), &signerv1.OpenCalloutRequestRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey})
		if err != nil || resp.GetUserNkey() != user {
			t.Fatalf("open = %v, %v; want user %s", resp.GetUserNkey(), err, user)
		}
	})
	for _, ago := range []time.Duration{15 * time.Second, 50 * time.Second} {
		sealed, _ := srv.request(t, gs, newNonce(), expAgo(ago))
		t.Run("fail/open-"+ago.String()+"-past-exp", func(t *testing.T) {
			resp, err := authd.OpenCalloutRequest(ctxT(t), &signerv1.OpenCalloutRequestRequest{Space: "alpha", SealedRequest: sealed, ServerXkey: srv.xkey})
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			wantNoCredential(t, resp)
		})
		t.Run("fail/sign-"+ago.String()+"-past-exp", func(t *testing.T) {
			resp, err := authd.SignCalloutResponse(ctxT(t), &signerv1.SignCalloutResponseRequest{Space: "alpha", SealedRequest: sealed,
				ServerXkey: srv.xkey, Decision: &signerv1.SignCalloutResponseRequest_Error{Error: "refused"}})
			wantRefusal(t, err, codes.InvalidArgument, "INVALID_ARGUMENT")
			wantNoCredential(t, resp)
		})
	}
}
