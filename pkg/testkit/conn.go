package testkit

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/profiles"
)

// MintUser builds a user of profile in s with profiles.Build(...).Claims(...) and signs it with
// the data signing key, the callout signing key for AUTH-account profiles, or the system
// account's signing key for the $SYS profiles (which get the space's data account). ttl zero asks for
// the profile's default lifetime (none for the sentinel). The user key is fresh, except for
// profiles.AuthCallout, which gets s.Callout: only a registered auth user bypasses the callout.
//
// Tests only: production minting is signerd's, which also applies caller policy and audit.
func (s *Space) MintUser(t testing.TB, profile profiles.Name, p profiles.Params, ttl time.Duration) (string, nkeys.KeyPair) {
	t.Helper()
	kp := s.Callout
	if profile != profiles.AuthCallout {
		var err error
		if kp, err = nkeys.CreateUser(); err != nil {
			t.Fatalf("testkit: %v", err)
		}
		t.Cleanup(kp.Wipe)
	}
	return s.MintUserKey(t, profile, p, ttl, kp), kp
}

// MintUserKey is MintUser for a caller-chosen user key pair (for example one a daemon under
// test generated). It returns the signed user JWT.
func (s *Space) MintUserKey(t testing.TB, profile profiles.Name, p profiles.Params, ttl time.Duration, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	if profile.Account() == profiles.AccountSystem && p.DataAccount == "" {
		// As signerd does: a $SYS user names the space's data account, never a caller's choice.
		p.DataAccount = s.Trust.DataAccountPublicKey()
	}
	spec, err := profiles.Build(s.Name, profile, p)
	if err != nil {
		t.Fatalf("testkit: build %s: %v", profile, err)
	}
	if ttl == 0 {
		if ttl, err = profile.Lifetime().TTL(0); err != nil {
			t.Fatalf("testkit: %v", err)
		}
	}
	issuer, signer := s.Trust.DataAccountPublicKey(), s.Signing.DataSigning
	switch profile.Account() {
	case profiles.AccountData:
	case profiles.AccountAuth:
		issuer, signer = s.Trust.AuthAccountPublicKey(), s.Signing.AuthSigning
	case profiles.AccountSystem:
		issuer, signer = s.broker.Trust.SystemAccountPublicKey(), s.broker.Operator.SystemSigning
	default:
		t.Fatalf("testkit: profile %s has no account", profile)
	}
	uc, err := spec.Claims(pub, issuer, time.Now(), ttl)
	if err != nil {
		t.Fatalf("testkit: claims %s: %v", profile, err)
	}
	skp, err := signer.KeyPair()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	defer skp.Wipe()
	tok, err := uc.Encode(skp)
	if err != nil {
		t.Fatalf("testkit: sign %s: %v", profile, err)
	}
	return tok
}

// Connect opens a TCP connection to b as the user userJWT/kp, without reconnects. When the
// JWT's first subscribe permission is a private inbox (_INBOX_<token>.>), the connection uses
// that inbox prefix so request/reply works; opts are applied after and can override it. The
// connection's asynchronous errors (permission violations above all) are recorded for
// AsyncErrors and WaitAsyncError. A connection that succeeds is closed at cleanup.
func (b *Broker) Connect(t testing.TB, userJWT string, kp nkeys.KeyPair, opts ...nats.Option) (*nats.Conn, error) {
	t.Helper()
	base := []nats.Option{
		nats.Name("testkit"),
		nats.UserJWT(func() (string, error) { return userJWT, nil }, kp.Sign),
		nats.NoReconnect(),
		nats.Timeout(10 * time.Second),
		nats.ErrorHandler(func(nc *nats.Conn, _ *nats.Subscription, err error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.errs[nc] = append(b.errs[nc], err)
		}),
	}
	if uc, err := jwt.DecodeUserClaims(userJWT); err == nil && len(uc.Sub.Allow) > 0 {
		if first := uc.Sub.Allow[0]; strings.HasPrefix(first, "_INBOX_") && strings.HasSuffix(first, ".>") {
			base = append(base, nats.CustomInboxPrefix(strings.TrimSuffix(first, ".>")))
		}
	}
	nc, err := nats.Connect(b.URL, append(base, opts...)...)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		nc.Close()
		b.mu.Lock()
		delete(b.errs, nc)
		b.mu.Unlock()
	})
	return nc, nil
}

// AsyncErrors returns the asynchronous errors recorded for nc so far.
func (b *Broker) AsyncErrors(nc *nats.Conn) []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]error(nil), b.errs[nc]...)
}

// WaitAsyncError waits (up to 5 s) until nc has recorded an asynchronous error whose text
// contains want, and fails t otherwise. Use it with PublishViolation or SubscribeViolation to
// prove the broker, not the client, refused an operation.
func (b *Broker) WaitAsyncError(t testing.TB, nc *nats.Conn, want string) error {
	t.Helper()
	var found error
	Eventually(t, 5*time.Second, func() error {
		// A flush makes the server process everything sent so far; its -ERR lines arrive
		// before the PONG.
		if err := nc.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			return err
		}
		for _, err := range b.AsyncErrors(nc) {
			if strings.Contains(err.Error(), want) {
				found = err
				return nil
			}
		}
		return fmt.Errorf("no async error containing %q yet; have %v", want, b.AsyncErrors(nc))
	})
	return found
}

// PublishViolation is the text the broker sends when a publish to subject is refused.
func PublishViolation(subject string) string {
	return fmt.Sprintf("Permissions Violation for Publish to %q", subject)
}

// SubscribeViolation is the text the broker sends when a subscription to subject is refused.
func SubscribeViolation(subject string) string {
	return fmt.Sprintf("Permissions Violation for Subscription to %q", subject)
}

// Eventually calls f every 10 ms until it returns nil, and fails t with f's last error if
// timeout passes first. It is the only way tests in this project wait.
func Eventually(t testing.TB, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("testkit: not true within %v: %v", timeout, err)
			return
		case <-tick.C:
		}
	}
}

// MintUnlimited mints a data-account user with no permission limits (the broker allows it all),
// signed by the data signing key, expiring in an hour. It stands in for what a test needs done
// outside any profile (seeding a foreign key in a bucket, say); a profile is proven with
// MintUser, never with this.
func (s *Space) MintUnlimited(t testing.TB) (string, nkeys.KeyPair) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	t.Cleanup(kp.Wipe)
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	uc := jwt.NewUserClaims(pub)
	uc.IssuerAccount = s.Trust.DataAccountPublicKey()
	uc.Expires = time.Now().Add(time.Hour).Unix()
	skp, err := s.Signing.DataSigning.KeyPair()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	defer skp.Wipe()
	tok, err := uc.Encode(skp)
	if err != nil {
		t.Fatalf("testkit: sign: %v", err)
	}
	return tok, kp
}
