package testkit

import (
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// SentinelJWT is a test sentinel: a user JWT for a fresh user key, signed by a fresh account key,
// a bearer token when bearer is set (a space's sentinel is one). It returns the JWT and the
// user's seed (a throwaway: a bearer JWT needs no nonce signature).
func SentinelJWT(tb testing.TB, bearer bool) (string, []byte) {
	tb.Helper()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		tb.Fatal(err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		tb.Fatal(err)
	}
	upub, err := ukp.PublicKey()
	if err != nil {
		tb.Fatal(err)
	}
	uc := jwt.NewUserClaims(upub)
	uc.BearerToken = bearer
	tok, err := uc.Encode(akp)
	if err != nil {
		tb.Fatal(err)
	}
	seed, err := ukp.Seed()
	if err != nil {
		tb.Fatal(err)
	}
	return tok, seed
}

// SentinelCreds is SentinelJWT as creds text (the JWT and the throwaway seed), the form authd's
// enrollment answers a sentinel in.
func SentinelCreds(tb testing.TB, bearer bool) string {
	tb.Helper()
	tok, seed := SentinelJWT(tb, bearer)
	b, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}
