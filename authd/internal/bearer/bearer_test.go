package bearer_test

import (
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cotalgo/cotal/authd/internal/bearer"
	"github.com/cotalgo/cotal/authd/internal/bearer/bearertest"
	"github.com/cotalgo/cotal/authd/internal/ledger"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	testSpace = "alpha"
	owner     = "u_aaaaaaaaaaaaaaaaaaaaaaaaaa"
	owner2    = "u_bbbbbbbbbbbbbbbbbbbbbbbbbb"
	uid       = "lifecycle0000000000000000001"
)

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// signerEnv is a real signerd and authd's client of it.
type signerEnv struct {
	s      *signerdtest.Signer
	client *signerclient.Client
}

func startSigner(t *testing.T, spaces ...string) *signerEnv {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: spaces})
	c, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindAuthd, testSpace),
		ServerID: "spiffe://" + signerdtest.TrustDomain + "/signerd"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &signerEnv{s: s, client: c}
}

func (e *signerEnv) sign(t *testing.T, edit func(*signerv1.SignBearerRequest)) string {
	t.Helper()
	req := &signerv1.SignBearerRequest{Space: testSpace, Owner: owner, Actor: "laptop", Scope: []string{"spawn"},
		LifecycleUid: uid, Ttl: durationpb.New(600 * time.Second)}
	if edit != nil {
		edit(req)
	}
	resp, err := e.client.API().SignBearer(ctxT(t), req)
	if err != nil {
		t.Fatalf("SignBearer: %v", err)
	}
	return resp.GetToken()
}

func (e *signerEnv) verifier(t *testing.T, now func() time.Time) *bearer.Verifier {
	t.Helper()
	c, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: e.client.API(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	v, err := bearer.NewVerifier(testSpace, c, now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func wantCheck(t *testing.T, err error, c bearer.Check) {
	t.Helper()
	var e *bearer.Error
	if !errors.As(err, &e) || e.Check != c {
		t.Fatalf("err = %v, want check %s", err, c)
	}
}

// Bearers really signed by signerd: the accepted shapes, and every check a signerd bearer can fail.
func TestVerifySignerdBearers(t *testing.T) {
	e := startSigner(t)
	v := e.verifier(t, nil)
	t.Run("ok/agent bearer", func(t *testing.T) {
		c, err := v.Verify(ctxT(t), e.sign(t, nil))
		if err != nil {
			t.Fatal(err)
		}
		if c.Owner != owner || c.Actor != "laptop" || c.LifecycleUID != uid || len(c.Scope) != 1 || c.Scope[0] != "spawn" || c.View != "" || c.ID == "" {
			t.Fatalf("claims = %+v", c)
		}
		if d := c.Expires.Sub(c.IssuedAt); d != 600*time.Second {
			t.Fatalf("lifetime %v", d)
		}
	})
	t.Run("ok/every optional claim", func(t *testing.T) {
		c, err := v.Verify(ctxT(t), e.sign(t, func(r *signerv1.SignBearerRequest) {
			r.Parent, r.CredentialId, r.View, r.Scope = owner2+".boss", "cred-1", "admin", []string{"admin", "spawn"}
		}))
		if err != nil {
			t.Fatal(err)
		}
		if c.Parent != owner2+".boss" || c.CredentialID != "cred-1" || c.View != "admin" {
			t.Fatalf("claims = %+v", c)
		}
	})
	t.Run("ok/no scope", func(t *testing.T) {
		c, err := v.Verify(ctxT(t), e.sign(t, func(r *signerv1.SignBearerRequest) { r.Scope = nil }))
		if err != nil || c.Scope == nil || len(c.Scope) != 0 {
			t.Fatalf("claims = %+v, %v", c, err)
		}
	})
	t.Run("fail/iat in the future", func(t *testing.T) {
		past := e.verifier(t, func() time.Time { return time.Now().Add(-time.Minute) })
		_, err := past.Verify(ctxT(t), e.sign(t, nil))
		wantCheck(t, err, bearer.CheckIssuedAt)
	})
	t.Run("fail/expired", func(t *testing.T) {
		later := e.verifier(t, func() time.Time { return time.Now().Add(601 * time.Second) })
		_, err := later.Verify(ctxT(t), e.sign(t, nil))
		wantCheck(t, err, bearer.CheckExpiry)
	})
	t.Run("fail/signature", func(t *testing.T) {
		tok := e.sign(t, nil)
		parts := strings.Split(tok, ".")
		payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
		payload = []byte(strings.Replace(string(payload), `"laptop"`, `"laptoq"`, 2))
		forged := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + parts[2]
		_, err := v.Verify(ctxT(t), forged)
		wantCheck(t, err, bearer.CheckSignature)
	})
	t.Run("fail/kid of another space", func(t *testing.T) {
		other := startSigner(t, testSpace)
		_, err := v.Verify(ctxT(t), other.sign(t, nil))
		wantCheck(t, err, bearer.CheckKID)
	})
	// Service tokens share the issuer key (GetJWKS publishes it) and so verify under it: only
	// their typ keeps them from passing as user bearers.
	for _, kind := range []signerv1.ServiceCredentialKind{signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_ACCESS, signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL} {
		t.Run("fail/service token "+kind.String(), func(t *testing.T) {
			resp, err := e.client.API().SignServiceCredential(ctxT(t), &signerv1.SignServiceCredentialRequest{
				Space: testSpace, Kind: kind, Owner: owner, Witness: "w_" + strings.Repeat("a", 52), Endpoint: "billing.api",
				InstanceId: uid, Root: "r_" + strings.Repeat("a", 26), Ttl: durationpb.New(time.Minute),
				NotAfter: timestamppb.New(time.Now().Add(time.Hour)),
			})
			if err != nil {
				t.Fatalf("SignServiceCredential: %v", err)
			}
			_, err = v.Verify(ctxT(t), resp.GetToken())
			wantCheck(t, err, bearer.CheckHeader)
		})
	}
	t.Run("fail/format", func(t *testing.T) {
		for _, tok := range []string{"", "a.b", "a.b.c.d", strings.Repeat("a", bearer.MaxTokenBytes+1)} {
			_, err := v.Verify(ctxT(t), tok)
			wantCheck(t, err, bearer.CheckFormat)
		}
	})
}

// Hand-signed bearers for every check signerd would never sign a violation of.
func TestVerifyHandSigned(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { return now }
	k := bearertest.NewKey(t)
	cache, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: bearertest.NewJWKS(k.JWK), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	v, err := bearer.NewVerifier(testSpace, cache, clock)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range bearertest.Cases(t, k, bearertest.Principal{Space: testSpace, Owner: owner, Owner2: owner2, Actor: "laptop", UID: uid, Now: now}) {
		t.Run(tc.Name, func(t *testing.T) {
			c, err := v.Verify(ctxT(t), tc.Token)
			if tc.Want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.Owner != owner || c.KID != k.JWK.Kid {
					t.Fatalf("claims = %+v", c)
				}
				return
			}
			wantCheck(t, err, tc.Want)
		})
	}
}

func TestCacheRefetch(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	k1, k2 := bearertest.NewKey(t), bearertest.NewKey(t)
	fake := bearertest.NewJWKS(k1.JWK)
	c, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: fake, Now: clock, MinRefetch: 10 * time.Second, MaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	if _, err := c.Key(ctx, k1.JWK.Kid); err != nil || fake.Count() != 1 {
		t.Fatalf("first lookup: %v after %d fetches", err, fake.Count())
	}
	if _, err := c.Key(ctx, k1.JWK.Kid); err != nil || fake.Count() != 1 {
		t.Fatalf("cached lookup: %v after %d fetches", err, fake.Count())
	}
	// An unknown kid refetches once; a second unknown kid within MinRefetch does not.
	advance(10 * time.Second)
	if _, err := c.Key(ctx, "unknown"); !errors.Is(err, bearer.ErrUnknownKey) || fake.Count() != 2 {
		t.Fatalf("unknown kid: %v after %d fetches", err, fake.Count())
	}
	for range 5 {
		if _, err := c.Key(ctx, "unknown-2"); !errors.Is(err, bearer.ErrUnknownKey) {
			t.Fatal(err)
		}
	}
	if fake.Count() != 2 {
		t.Fatalf("unknown kids within MinRefetch made %d fetches, want 2", fake.Count())
	}
	// A rotated-in key is found after the interval, by the one refetch its kid triggers.
	fake.Set([]*signerv1.JWK{k2.JWK, k1.JWK}, nil)
	advance(10 * time.Second)
	if _, err := c.Key(ctx, k2.JWK.Kid); err != nil || fake.Count() != 3 {
		t.Fatalf("rotated key: %v after %d fetches", err, fake.Count())
	}
	// A retired key stops verifying once the set is older than MaxAge.
	fake.Set([]*signerv1.JWK{k2.JWK}, nil)
	advance(time.Minute)
	if _, err := c.Key(ctx, k1.JWK.Kid); !errors.Is(err, bearer.ErrUnknownKey) {
		t.Fatalf("retired key after MaxAge: %v", err)
	}
	// signerd unreachable: a stale set is kept, an unknown kid stays unknown.
	fake.Set(nil, errors.New("unavailable"))
	advance(time.Minute)
	if _, err := c.Key(ctx, k2.JWK.Kid); err != nil {
		t.Fatalf("stale key while signerd is down: %v", err)
	}
}

func TestCacheRefusesBadJWKS(t *testing.T) {
	good := bearertest.NewKey(t).JWK
	for _, tc := range []struct {
		name string
		keys []*signerv1.JWK
	}{
		{"fail/empty", nil},
		{"fail/kid not thumbprint", []*signerv1.JWK{{Kty: "OKP", Crv: "Ed25519", X: good.X, Kid: "mine", Alg: "EdDSA", Use: "sig"}}},
		{"fail/wrong kty", []*signerv1.JWK{{Kty: "EC", Crv: "Ed25519", X: good.X, Kid: good.Kid, Alg: "EdDSA", Use: "sig"}}},
		{"fail/wrong alg", []*signerv1.JWK{{Kty: "OKP", Crv: "Ed25519", X: good.X, Kid: good.Kid, Alg: "ES256", Use: "sig"}}},
		{"fail/short x", []*signerv1.JWK{{Kty: "OKP", Crv: "Ed25519", X: "AAAA", Kid: bearer.Thumbprint("AAAA"), Alg: "EdDSA", Use: "sig"}}},
		{"fail/duplicate kid", []*signerv1.JWK{good, good}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := bearer.NewCache(bearer.CacheConfig{Space: testSpace, Signer: bearertest.NewJWKS(tc.keys...)})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Refresh(ctxT(t)); err == nil {
				t.Fatal("Refresh accepted a bad JWKS")
			}
			if _, err := c.Key(ctxT(t), good.Kid); !errors.Is(err, bearer.ErrUnknownKey) {
				t.Fatalf("Key = %v", err)
			}
		})
	}
}

// The kid signerd publishes is the thumbprint this package computes (RFC 7638), and the cache
// takes signerd's real JWKS.
func TestSignerdJWKS(t *testing.T) {
	e := startSigner(t)
	resp, err := e.client.API().GetJWKS(ctxT(t), &signerv1.GetJWKSRequest{Space: testSpace})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetKeys()) != 1 || resp.GetKeys()[0].GetKid() != bearer.Thumbprint(resp.GetKeys()[0].GetX()) {
		t.Fatalf("JWKS = %v", resp.GetKeys())
	}
}

// TestScopeCapMatchesLedger: the ledger caps a row's capability words at what one bearer carries,
// so that every granted row exchanges (ledger.Row.BearerScope); the two caps must stay equal.
func TestScopeCapMatchesLedger(t *testing.T) {
	if bearer.MaxScopes != ledger.MaxCapabilities {
		t.Fatalf("bearer.MaxScopes %d != ledger.MaxCapabilities %d", bearer.MaxScopes, ledger.MaxCapabilities)
	}
}
