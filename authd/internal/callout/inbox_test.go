package callout

import (
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestCalloutInboxTakeover is issue 20 item 1 on the real broker: a client holding a valid bearer
// presents, as its connection name, the inbox token of someone else, hoping for the grant
// _INBOX_<that token>.>. Every such name is refused with a signed refusal, whoever it names;
// the client's own bound nonce is granted, and the grant reaches no other inbox.
func TestCalloutInboxTakeover(t *testing.T) {
	e := startEnv(t, envOptions{})
	e.grant(t, row("laptop"))
	victimRow := row("victim")
	victimRow.Owner = owner2
	e.grant(t, victimRow)
	attackTok, _ := e.bearerFor(t, row("laptop"), time.Minute, nil)
	victimTok, _ := e.bearerFor(t, victimRow, time.Minute, nil)

	// The victims: a minted credential's key (public: audit lines, Inspect, logs) and a callout
	// client of another principal, whose nonce travels in the reply subject of its requests.
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	mintedKey, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	victimNonce := nonceFor(t, victimTok)
	victim, err := e.connect(t, victimTok, victimNonce)
	if err != nil {
		t.Fatalf("victim connect: %v", err)
	}
	sameTag, err := space.BoundInboxNonce(owner, "victim", "attacker-0001")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, nonce string }{
		{"fail/a minted credential's user key", mintedKey},
		{"fail/another principal's callout nonce", victimNonce},
		{"fail/a nonce bound to another actor of the same owner", sameTag},
		{"fail/an unbound random nonce", newNonce()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := e.connectInbox(t, attackTok, tc.nonce, "_INBOX_"+tc.nonce)
			wantDenied(t, c, err)
			if got := e.rec.refusal(tc.nonce); got != refuseNonce {
				t.Fatalf("refusal signed for %s: %q, want %q", tc.nonce, got, refuseNonce)
			}
		})
	}
	t.Run("ok/own bound nonce is granted and reaches no other inbox", func(t *testing.T) {
		c, err := e.connect(t, attackTok, nonceFor(t, attackTok))
		if err != nil {
			t.Fatalf("connect with the own bound nonce: %v", err)
		}
		subject := "_INBOX_" + victimNonce + ".x"
		if _, err := c.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		c.waitError(t, testkit.SubscribeViolation(subject))
	})
	victim.noErrors(t)
}
