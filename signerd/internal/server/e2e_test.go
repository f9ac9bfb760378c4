package server_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// brokerConn is a TCP connection to the test broker that records the broker's asynchronous
// errors, so a refusal is proven by the broker's own "Permissions Violation".
type brokerConn struct {
	*nats.Conn
	mu   sync.Mutex
	errs []error
}

// connectBroker connects as the user of cred, signing the nonce with kp. Credentials may only
// subscribe their own inbox, _INBOX_<user public key>.>, so the connection uses that prefix.
func connectBroker(t *testing.T, url string, cred *signerv1.Credential, kp nkeys.KeyPair) *brokerConn {
	t.Helper()
	bc := &brokerConn{}
	token := cred.GetJwt()
	nc, err := nats.Connect(url,
		nats.UserJWT(func() (string, error) { return token, nil }, kp.Sign),
		nats.CustomInboxPrefix("_INBOX_"+cred.GetUserPublicKey()),
		nats.NoReconnect(), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			bc.mu.Lock()
			defer bc.mu.Unlock()
			bc.errs = append(bc.errs, err)
		}))
	if err != nil {
		t.Fatalf("connect as %s: %v", cred.GetProfile(), err)
	}
	t.Cleanup(nc.Close)
	bc.Conn = nc
	return bc
}

// waitViolation waits until the broker has refused something with want in its error text.
func (bc *brokerConn) waitViolation(t *testing.T, want string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, func() error {
		if err := bc.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			return err
		}
		bc.mu.Lock()
		defer bc.mu.Unlock()
		for _, err := range bc.errs {
			if strings.Contains(err.Error(), want) {
				return nil
			}
		}
		return fmt.Errorf("no broker error containing %q yet; have %v", want, bc.errs)
	})
}

// noViolations asserts the broker has refused nothing on bc (after a round trip).
func (bc *brokerConn) noViolations(t *testing.T) {
	t.Helper()
	if err := bc.Flush(); err != nil {
		t.Fatal(err)
	}
	bc.mu.Lock()
	defer bc.mu.Unlock()
	if len(bc.errs) != 0 {
		t.Fatalf("broker errors: %v", bc.errs)
	}
}

// TestBrokerAcceptsMintedCredentials proves credentials minted through signerd on a broker that
// trusts only signerd's keys: what the profile grants works, and the broker itself refuses the
// rest.
func TestBrokerAcceptsMintedCredentials(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	url := s.StartBroker(t)
	names, err := space.NewNames("alpha")
	if err != nil {
		t.Fatal(err)
	}
	must := func(v string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	manager := dialAs(t, s, signerdtest.ID("managerd", "alpha"))
	deliveryd := dialAs(t, s, signerdtest.ID("deliveryd", "alpha"))
	mint := func(c signerv1.SignerServiceClient, profile signerv1.Profile, params *signerv1.ProfileParams) (*signerv1.Credential, nkeys.KeyPair) {
		t.Helper()
		kp, pub := newUser(t)
		resp, err := c.Mint(ctxT(t), &signerv1.MintRequest{Space: "alpha", Profile: profile, UserPublicKey: pub, Params: params})
		if err != nil {
			t.Fatalf("mint %v: %v", profile, err)
		}
		return resp.GetCredential(), kp
	}

	writerCred, writerKP := mint(manager, signerv1.Profile_PROFILE_AGENT,
		&signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid, AllowPublish: []string{"general"}})
	readerCred, readerKP := mint(manager, signerv1.Profile_PROFILE_AGENT,
		&signerv1.ProfileParams{Owner: "o2", Actor: "a2", LifecycleUid: uid, AllowSubscribe: []string{"general"}, Subscribe: []string{"general"}})
	deliveryCred, deliveryKP := mint(deliveryd, signerv1.Profile_PROFILE_DELIVERY, nil)
	writer := connectBroker(t, url, writerCred, writerKP)
	reader := connectBroker(t, url, readerCred, readerKP)
	delivery := connectBroker(t, url, deliveryCred, deliveryKP)

	t.Run("ok/agent-publishes-own-chat", func(t *testing.T) {
		sub, err := reader.SubscribeSync(must(names.ChatRead("general")))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := reader.Flush(); err != nil {
			t.Fatal(err)
		}
		subject := must(names.Chat("o1", "a1", "general"))
		if err := writer.Publish(subject, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("reader got nothing on %s: %v", subject, err)
		}
		if m.Subject != subject || string(m.Data) != "hello" {
			t.Fatalf("got %q on %s", m.Data, m.Subject)
		}
		writer.noViolations(t)
		reader.noViolations(t)
	})

	t.Run("fail/agent-publishes-other-principals-chat", func(t *testing.T) {
		subject := must(names.Chat("o2", "a2", "general"))
		if err := writer.Publish(subject, []byte("impersonation")); err != nil {
			t.Fatal(err)
		}
		writer.waitViolation(t, testkit.PublishViolation(subject))
	})

	t.Run("ok/delivery-subscribes-ctl-delivery", func(t *testing.T) {
		serve := names.CtlDeliveryServe()
		if !strings.HasSuffix(serve, "ctl.delivery.*.*") {
			t.Fatalf("CtlDeliveryServe = %q, want a ctl.delivery.*.* filter", serve)
		}
		sub, err := delivery.SubscribeSync(serve)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := delivery.Flush(); err != nil {
			t.Fatal(err)
		}
		subject := must(names.CtlDelivery("o1", "a1"))
		if err := writer.Publish(subject, []byte("join")); err != nil {
			t.Fatal(err)
		}
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("delivery got nothing on %s: %v", serve, err)
		}
		if m.Subject != subject {
			t.Fatalf("got a message on %s, want %s", m.Subject, subject)
		}
		delivery.noViolations(t)
	})

	t.Run("fail/delivery-publishes-chat", func(t *testing.T) {
		subject := must(names.Chat("o1", "a1", "general"))
		if err := delivery.Publish(subject, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		delivery.waitViolation(t, testkit.PublishViolation(subject))
	})
}
