package trust_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/trust"
)

func newBroker(t *testing.T, name string) (*trust.Broker, *trust.OperatorIdentity) {
	t.Helper()
	b, op, err := trust.NewBroker(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(op.Wipe)
	return b, op
}

func userPub(t *testing.T) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func newSpace(t *testing.T, b *trust.Broker, op *trust.OperatorIdentity, name string) (*trust.Space, *trust.SpaceIdentity, *trust.SpaceSigning) {
	t.Helper()
	sp, id, sg, err := trust.NewSpace(b, op, name, []string{userPub(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(id.Wipe)
	t.Cleanup(sg.Wipe)
	return sp, id, sg
}

func pubOf(t *testing.T, s *creds.Seed) string {
	t.Helper()
	pub, err := s.Public()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

func TestNewBroker(t *testing.T) {
	b, op := newBroker(t, "dev box")
	if err := op.Verify(b); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	oc, err := jwt.DecodeOperatorClaims(b.OperatorJWT())
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case oc.Name != "cotal-dev_box":
		t.Errorf("operator name %q, want cotal-dev_box", oc.Name)
	case !oc.StrictSigningKeyUsage:
		t.Errorf("StrictSigningKeyUsage is off")
	case oc.Subject != pubOf(t, op.Operator) || oc.Issuer != oc.Subject:
		t.Errorf("operator JWT not self-signed by the identity key")
	case len(oc.SigningKeys) != 1 || oc.SigningKeys[0] != pubOf(t, op.OperatorSigning):
		t.Errorf("operator signing keys %v, want the signing seed's key", oc.SigningKeys)
	case oc.SystemAccount != b.SystemAccountPublicKey() || oc.SystemAccount != pubOf(t, op.SystemAccount):
		t.Errorf("system account %s does not match", oc.SystemAccount)
	}
	sc, err := jwt.DecodeAccountClaims(b.SystemAccountJWT())
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case sc.Name != trust.SystemAccountName:
		t.Errorf("system account name %q", sc.Name)
	case sc.Issuer != pubOf(t, op.OperatorSigning):
		t.Errorf("system account signed by %s, want the operator signing key", sc.Issuer)
	case sc.Limits.IsJSEnabled():
		t.Errorf("system account has JetStream enabled")
	}
	if got := b.OperatorSigningKeys(); !slices.Equal(got, []string{pubOf(t, op.OperatorSigning)}) {
		t.Errorf("OperatorSigningKeys() = %v", got)
	}
}

func TestOperatorIdentityVerify(t *testing.T) {
	b, op := newBroker(t, "a")
	_, other := newBroker(t, "b")
	tests := []struct {
		name string
		id   *trust.OperatorIdentity
		role string
	}{
		{"fail/nil", nil, "operator identity"},
		{"fail/identity and signing swapped", &trust.OperatorIdentity{Operator: op.OperatorSigning, OperatorSigning: op.Operator, SystemAccount: op.SystemAccount}, "operator identity"},
		{"fail/other broker's signing key", &trust.OperatorIdentity{Operator: op.Operator, OperatorSigning: other.OperatorSigning, SystemAccount: op.SystemAccount}, "operator signing"},
		{"fail/account seed as operator", &trust.OperatorIdentity{Operator: op.SystemAccount, OperatorSigning: op.OperatorSigning, SystemAccount: op.SystemAccount}, "operator identity"},
		{"fail/missing system seed", &trust.OperatorIdentity{Operator: op.Operator, OperatorSigning: op.OperatorSigning}, "system account identity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ke *trust.KeyMismatchError
			if err := tt.id.Verify(b); !errors.As(err, &ke) || ke.Role != tt.role {
				t.Fatalf("Verify = %v, want *KeyMismatchError for %s", err, tt.role)
			}
		})
	}
}

func TestLoadBroker(t *testing.T) {
	b, op := newBroker(t, "a")
	other, _ := newBroker(t, "b")
	t.Run("ok/round trip", func(t *testing.T) {
		got, err := trust.LoadBroker(b.OperatorJWT(), b.SystemAccountJWT())
		if err != nil {
			t.Fatal(err)
		}
		if got.OperatorPublicKey() != b.OperatorPublicKey() || got.SystemAccountPublicKey() != b.SystemAccountPublicKey() || got.Name() != b.Name() {
			t.Fatalf("loaded broker differs")
		}
		if err := op.Verify(got); err != nil {
			t.Fatalf("identity does not verify against the loaded broker: %v", err)
		}
	})
	t.Run("fail/system account of another broker", func(t *testing.T) {
		_, err := trust.LoadBroker(b.OperatorJWT(), other.SystemAccountJWT())
		var fe *trust.ForeignAccountError
		if !errors.As(err, &fe) || fe.Account != other.SystemAccountPublicKey() || fe.Operator != b.OperatorPublicKey() {
			t.Fatalf("err = %v, want *ForeignAccountError", err)
		}
	})
	t.Run("fail/system account signed by the operator identity key", func(t *testing.T) {
		sc := jwt.NewAccountClaims(b.SystemAccountPublicKey())
		sc.Name = "SYS"
		kp, err := op.Operator.KeyPair()
		if err != nil {
			t.Fatal(err)
		}
		defer kp.Wipe()
		tok, err := sc.Encode(kp)
		if err != nil {
			t.Fatal(err)
		}
		var fe *trust.ForeignAccountError
		if _, err := trust.LoadBroker(b.OperatorJWT(), tok); !errors.As(err, &fe) {
			t.Fatalf("err = %v, want *ForeignAccountError (strict signing key usage)", err)
		}
	})
	t.Run("fail/operator not self-signed", func(t *testing.T) {
		oc, err := jwt.DecodeOperatorClaims(b.OperatorJWT())
		if err != nil {
			t.Fatal(err)
		}
		kp, err := op.OperatorSigning.KeyPair()
		if err != nil {
			t.Fatal(err)
		}
		defer kp.Wipe()
		tok, err := oc.Encode(kp)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := trust.LoadBroker(tok, b.SystemAccountJWT()); err == nil || !strings.Contains(err.Error(), "self-signed") {
			t.Fatalf("err = %v, want a self-signed refusal", err)
		}
	})
	t.Run("fail/garbage", func(t *testing.T) {
		if _, err := trust.LoadBroker("eyJnot.a.jwt", b.SystemAccountJWT()); err == nil {
			t.Fatal("accepted a garbage operator JWT")
		}
		if _, err := trust.LoadBroker(b.OperatorJWT(), b.OperatorJWT()); err == nil {
			t.Fatal("accepted the operator JWT as the system account")
		}
	})
}

func TestNewSpace(t *testing.T) {
	b, op := newBroker(t, "box")
	cu := userPub(t)
	sp, id, sg, err := trust.NewSpace(b, op, "my space", []string{cu})
	if err != nil {
		t.Fatal(err)
	}
	if err := id.Verify(sp); err != nil {
		t.Fatalf("SpaceIdentity.Verify: %v", err)
	}
	if err := sg.Verify(sp); err != nil {
		t.Fatalf("SpaceSigning.Verify: %v", err)
	}
	opSigning := pubOf(t, op.OperatorSigning)

	dc, err := jwt.DecodeAccountClaims(sp.DataAccountJWT())
	if err != nil {
		t.Fatal(err)
	}
	js := dc.Limits.JetStreamLimits
	switch {
	case sp.Name() != "my space" || sp.Token() != "my_space" || dc.Name != "my_space":
		t.Errorf("names %q/%q/%q", sp.Name(), sp.Token(), dc.Name)
	case dc.Issuer != opSigning:
		t.Errorf("data account signed by %s, want operator signing key", dc.Issuer)
	case dc.Subject != pubOf(t, id.DataAccount) || sp.DataAccountPublicKey() != dc.Subject:
		t.Errorf("data account key mismatch")
	case !slices.Equal(sp.DataSigningKeys(), []string{pubOf(t, sg.DataSigning)}) || !dc.SigningKeys.Contains(pubOf(t, sg.DataSigning)):
		t.Errorf("data signing keys %v", sp.DataSigningKeys())
	case js.MemoryStorage != -1 || js.DiskStorage != -1 || js.Streams != -1 || js.Consumer != -1 || !dc.Limits.IsJSEnabled():
		t.Errorf("data account JetStream limits %+v, want unlimited", js)
	case dc.Authorization.IsEnabled():
		t.Errorf("data account has external authorization")
	}

	ac, err := jwt.DecodeAccountClaims(sp.AuthAccountJWT())
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case ac.Name != "AUTH_my_space" || sp.AuthAccountName() != ac.Name:
		t.Errorf("callout account name %q", ac.Name)
	case ac.Issuer != opSigning:
		t.Errorf("callout account signed by %s", ac.Issuer)
	case ac.Subject != pubOf(t, id.AuthAccount) || sp.AuthAccountPublicKey() != ac.Subject:
		t.Errorf("callout account key mismatch")
	case !slices.Equal(sp.AuthSigningKeys(), []string{pubOf(t, sg.AuthSigning)}):
		t.Errorf("callout signing keys %v", sp.AuthSigningKeys())
	case slices.Contains(sp.AuthSigningKeys(), pubOf(t, sg.DataSigning)):
		t.Errorf("callout account shares the data signing key")
	case ac.Limits.IsJSEnabled():
		t.Errorf("callout account has JetStream")
	case !slices.Equal(ac.Authorization.AuthUsers, jwt.StringList{cu}) || !slices.Equal(sp.CalloutUsers(), []string{cu}):
		t.Errorf("auth users %v", ac.Authorization.AuthUsers)
	case !slices.Equal(ac.Authorization.AllowedAccounts, jwt.StringList{dc.Subject}):
		t.Errorf("allowed accounts %v", ac.Authorization.AllowedAccounts)
	case ac.Authorization.XKey != pubOf(t, sg.XKey) || sp.XKey() != ac.Authorization.XKey:
		t.Errorf("xkey mismatch")
	}
}

func TestNewSpaceRefusals(t *testing.T) {
	b, op := newBroker(t, "box")
	_, otherOp := newBroker(t, "other")
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	accPub, _ := akp.PublicKey()
	u := userPub(t)
	tests := []struct {
		name  string
		op    *trust.OperatorIdentity
		space string
		users []string
		want  any
	}{
		{"fail/no callout users", op, "s", nil, &trust.SpaceError{}},
		{"fail/account key as callout user", op, "s", []string{accPub}, &trust.SpaceError{}},
		{"fail/garbage callout user", op, "s", []string{"UNOTAKEY"}, &trust.SpaceError{}},
		{"fail/duplicate callout user", op, "s", []string{u, u}, &trust.SpaceError{}},
		{"fail/empty space name", op, "", []string{u}, nil},
		{"fail/operator of another broker", otherOp, "s", []string{u}, &trust.KeyMismatchError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, id, sg, err := trust.NewSpace(b, tt.op, tt.space, tt.users)
			if err == nil || sp != nil || id != nil || sg != nil {
				t.Fatalf("NewSpace = %v, %v", sp, err)
			}
			switch tt.want.(type) {
			case *trust.SpaceError:
				var se *trust.SpaceError
				if !errors.As(err, &se) || se.Space != tt.space {
					t.Fatalf("err = %v, want *SpaceError", err)
				}
			case *trust.KeyMismatchError:
				var ke *trust.KeyMismatchError
				if !errors.As(err, &ke) {
					t.Fatalf("err = %v, want *KeyMismatchError", err)
				}
			}
		})
	}
}

func TestSpaceSigningVerify(t *testing.T) {
	b, op := newBroker(t, "box")
	sp, id, sg := newSpace(t, b, op, "one")
	_, _, sg2 := newSpace(t, b, op, "two")
	tests := []struct {
		name string
		sg   *trust.SpaceSigning
		role string
	}{
		{"fail/nil", nil, "space signing"},
		{"fail/other space's data key", &trust.SpaceSigning{DataSigning: sg2.DataSigning, AuthSigning: sg.AuthSigning, XKey: sg.XKey}, "data signing"},
		{"fail/data identity seed as signing key", &trust.SpaceSigning{DataSigning: id.DataAccount, AuthSigning: sg.AuthSigning, XKey: sg.XKey}, "data signing"},
		{"fail/data and callout keys swapped", &trust.SpaceSigning{DataSigning: sg.AuthSigning, AuthSigning: sg.DataSigning, XKey: sg.XKey}, "data signing"},
		{"fail/other space's xkey", &trust.SpaceSigning{DataSigning: sg.DataSigning, AuthSigning: sg.AuthSigning, XKey: sg2.XKey}, "callout xkey"},
		{"fail/operator seed as xkey", &trust.SpaceSigning{DataSigning: sg.DataSigning, AuthSigning: sg.AuthSigning, XKey: op.OperatorSigning}, "callout xkey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ke *trust.KeyMismatchError
			if err := tt.sg.Verify(sp); !errors.As(err, &ke) || ke.Role != tt.role {
				t.Fatalf("Verify = %v, want *KeyMismatchError for %s", err, tt.role)
			}
			if seedPattern.MatchString(ke.Error()) {
				t.Fatalf("error %q quotes a seed", ke)
			}
		})
	}
	var ke *trust.KeyMismatchError
	if err := (&trust.SpaceIdentity{DataAccount: id.AuthAccount, AuthAccount: id.DataAccount}).Verify(sp); !errors.As(err, &ke) {
		t.Fatalf("swapped SpaceIdentity verified: %v", err)
	}
}

// encodeAccount signs ac with the broker's operator signing key (to craft malformed spaces).
func encodeAccount(t *testing.T, op *trust.OperatorIdentity, ac *jwt.AccountClaims) string {
	t.Helper()
	kp, err := op.OperatorSigning.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Wipe()
	tok, err := ac.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestLoadSpace(t *testing.T) {
	b, op := newBroker(t, "box")
	other, otherOp := newBroker(t, "other")
	sp, _, _ := newSpace(t, b, op, "one")
	foreign, _, _ := newSpace(t, other, otherOp, "one")
	sp2, _, _ := newSpace(t, b, op, "two")

	mutate := func(accountJWT string, f func(*jwt.AccountClaims)) string {
		ac, err := jwt.DecodeAccountClaims(accountJWT)
		if err != nil {
			t.Fatal(err)
		}
		f(ac)
		return encodeAccount(t, op, ac)
	}
	tests := []struct {
		name       string
		space      string
		data, auth string
		want       any
	}{
		{"ok/as created", "one", sp.DataAccountJWT(), sp.AuthAccountJWT(), nil},
		{"fail/foreign data account", "one", foreign.DataAccountJWT(), sp.AuthAccountJWT(), &trust.ForeignAccountError{}},
		{"fail/foreign callout account", "one", sp.DataAccountJWT(), foreign.AuthAccountJWT(), &trust.ForeignAccountError{}},
		{"fail/wrong space name", "two", sp.DataAccountJWT(), sp.AuthAccountJWT(), &trust.SpaceError{}},
		{"fail/callout account of another space", "one", sp.DataAccountJWT(), sp2.AuthAccountJWT(), &trust.SpaceError{}},
		{"fail/accounts swapped", "one", sp.AuthAccountJWT(), sp.DataAccountJWT(), &trust.SpaceError{}},
		{"fail/data account without JetStream", "one", mutate(sp.DataAccountJWT(), func(ac *jwt.AccountClaims) {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{}
		}), sp.AuthAccountJWT(), &trust.SpaceError{}},
		{"fail/data account with callout", "one", mutate(sp.DataAccountJWT(), func(ac *jwt.AccountClaims) {
			ac.EnableExternalAuthorization(userPub(t))
		}), sp.AuthAccountJWT(), &trust.SpaceError{}},
		{"fail/callout allows any account", "one", sp.DataAccountJWT(), mutate(sp.AuthAccountJWT(), func(ac *jwt.AccountClaims) {
			ac.Authorization.AllowedAccounts = jwt.StringList{jwt.AnyAccount}
		}), &trust.SpaceError{}},
		{"fail/callout without xkey", "one", sp.DataAccountJWT(), mutate(sp.AuthAccountJWT(), func(ac *jwt.AccountClaims) {
			ac.Authorization.XKey = ""
		}), &trust.SpaceError{}},
		{"fail/callout with JetStream", "one", sp.DataAccountJWT(), mutate(sp.AuthAccountJWT(), func(ac *jwt.AccountClaims) {
			ac.Limits.JetStreamLimits.DiskStorage = -1
		}), &trust.SpaceError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := trust.LoadSpace(b, tt.space, tt.data, tt.auth)
			switch tt.want.(type) {
			case nil:
				if err != nil || got.DataAccountPublicKey() != sp.DataAccountPublicKey() || got.XKey() != sp.XKey() {
					t.Fatalf("LoadSpace = %v", err)
				}
			case *trust.ForeignAccountError:
				var fe *trust.ForeignAccountError
				if !errors.As(err, &fe) || fe.Operator != b.OperatorPublicKey() {
					t.Fatalf("err = %v, want *ForeignAccountError", err)
				}
			case *trust.SpaceError:
				var se *trust.SpaceError
				if !errors.As(err, &se) || se.Space != tt.space {
					t.Fatalf("err = %v, want *SpaceError", err)
				}
			}
		})
	}
}
