package server

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc/codes"
)

// TestCalloutClockSkewBoundary: a request is answered up to CalloutClockSkew (5 s) past its exp
// and refused after, on both paths that check it (a fresh open, and the opened claims a
// SignCalloutResponse takes from the cache). The nats-server stops waiting for the answer at
// exp itself, so the tolerance is only for the broker's and signerd's clocks disagreeing.
func TestCalloutClockSkewBoundary(t *testing.T) {
	if CalloutClockSkew != 5*time.Second {
		t.Fatalf("CalloutClockSkew = %v; docs/signerd.md documents 5 s", CalloutClockSkew)
	}
	skp, _ := nkeys.CreateServer()
	sid, _ := skp.PublicKey()
	xkp, _ := nkeys.CreateCurveKeys()
	xpub, _ := xkp.PublicKey()
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	exp := time.Unix(1_800_000_000, 0)
	ac := jwt.NewAuthorizationRequestClaims(apub)
	ac.Audience = calloutRequestAudience
	ac.UserNkey = upub
	ac.Server = jwt.ServerID{ID: sid, Name: "n", XKey: xpub}
	ac.ConnectOptions = jwt.ConnectOptions{Token: "t", Name: "nonce_123"}
	ac.Expires = exp.Unix()
	tok, err := ac.Encode(skp)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		now  time.Time
		ok   bool
	}{
		{"ok/before-exp", exp.Add(-time.Second), true},
		{"ok/at-exp", exp, true},
		{"ok/4s-past-exp", exp.Add(4 * time.Second), true},
		{"ok/exactly-the-skew-past-exp", exp.Add(5 * time.Second), true},
		{"fail/a-nanosecond-past-the-skew", exp.Add(5*time.Second + time.Nanosecond), false},
		{"fail/6s-past-exp", exp.Add(6 * time.Second), false},
		{"fail/59s-past-exp", exp.Add(59 * time.Second), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := verifyCalloutRequest([]byte(tok), xpub, apub, tc.now)
			if tc.ok {
				if err != nil || got == nil || got.UserNkey != upub {
					t.Fatalf("verifyCalloutRequest at exp%+v = %v, %v; want the claims", tc.now.Sub(exp), got, err)
				}
			} else {
				var r *refusal
				if got != nil || !errors.As(err, &r) || r.code != codes.InvalidArgument {
					t.Fatalf("verifyCalloutRequest at exp%+v = %v, %v; want INVALID_ARGUMENT", tc.now.Sub(exp), got, err)
				}
			}
			if expired := calloutRequestExpired(ac, tc.now); expired == tc.ok {
				t.Fatalf("calloutRequestExpired at exp%+v = %v", tc.now.Sub(exp), expired)
			}
		})
	}
}
