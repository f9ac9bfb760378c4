package trust_test

import (
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/trust"
)

// TestLoadRefusesNonCanonicalKeys: every key read from the public JWT files is compared as a
// string later (signing keys, account subjects), so one spelled with CR or LF inside, which
// nkeys' own validators accept, is refused at load (finding 1 of issue 7, file side).
func TestLoadRefusesNonCanonicalKeys(t *testing.T) {
	b, op := newBroker(t, "a")
	resign := func(t *testing.T, seed *creds.Seed, c interface {
		Encode(nkeys.KeyPair) (string, error)
	}) string {
		t.Helper()
		kp, err := seed.KeyPair()
		if err != nil {
			t.Fatal(err)
		}
		defer kp.Wipe()
		tok, err := c.Encode(kp)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	extra, _ := akp.PublicKey()

	t.Run("fail/system-account-signing-key-with-lf", func(t *testing.T) {
		sc, err := jwt.DecodeAccountClaims(b.SystemAccountJWT())
		if err != nil {
			t.Fatal(err)
		}
		sc.SigningKeys.Add(extra[:10] + "\n" + extra[10:])
		_, err = trust.LoadBroker(b.OperatorJWT(), resign(t, op.OperatorSigning, sc))
		if err == nil || !strings.Contains(err.Error(), "canonical") {
			t.Fatalf("LoadBroker = %v, want a canonical-key refusal", err)
		}
	})
	t.Run("fail/operator-signing-key-with-cr", func(t *testing.T) {
		oc, err := jwt.DecodeOperatorClaims(b.OperatorJWT())
		if err != nil {
			t.Fatal(err)
		}
		okp, err := nkeys.CreateOperator()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := okp.PublicKey()
		oc.SigningKeys.Add(pub + "\r")
		_, err = trust.LoadBroker(resign(t, op.Operator, oc), b.SystemAccountJWT())
		if err == nil || !strings.Contains(err.Error(), "canonical") {
			t.Fatalf("LoadBroker = %v, want a canonical-key refusal", err)
		}
	})
	t.Run("ok/untouched", func(t *testing.T) {
		if _, err := trust.LoadBroker(b.OperatorJWT(), b.SystemAccountJWT()); err != nil {
			t.Fatal(err)
		}
	})
}
