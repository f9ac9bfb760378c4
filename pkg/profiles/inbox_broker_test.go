package profiles_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// inboxParams holds valid parameters for every data-account profile; the test fails when a
// profile is added without a row here.
var inboxParams = map[profiles.Name]profiles.Params{
	profiles.Agent:               agentO1,
	profiles.Supervisor:          supervisorM1,
	profiles.Provisioner:         none,
	profiles.Deprovisioner:       {Owner: "o2", Actor: "a2", LifecycleUID: uid},
	profiles.Delivery:            none,
	profiles.Observer:            none,
	profiles.Admin:               {Owner: "o1", Actor: "a1"},
	profiles.Operator:            {Owner: "o1", Actor: "a1"},
	profiles.Probe:               none,
	profiles.MembershipRW:        none,
	profiles.AuthPlane:           none,
	profiles.RetirementRequester: retirementRequesterM1,
	profiles.ServiceServe:        serviceServeS1,
	profiles.RemoteManager:       remoteManagerR1,
}

// TestBrokerNoInboxTakeover is the broker's word on issue 20 item 1: no credential of any
// data-account profile, minted (inbox on its own user key) or granted on the callout path (inbox
// on a nonce bound to its principal), may subscribe to another credential's reply inbox: not to a
// minted credential's _INBOX_<user key> (user keys are public) and not to another principal's
// callout nonce (it travels in every reply subject that principal sends).
func TestBrokerNoInboxTakeover(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	victimKP, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	victimKey, err := victimKP.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	victimNonce, err := space.BoundInboxNonce("o2", "a2", "victim-nonce-0001")
	if err != nil {
		t.Fatal(err)
	}
	ownNonce, err := space.BoundInboxNonce("o1", "a1", "attacker-0001")
	if err != nil {
		t.Fatal(err)
	}
	type attacker struct {
		name   string
		prof   profiles.Name
		params profiles.Params
	}
	var attackers []attacker
	for _, p := range profiles.All() {
		if p.Account() != profiles.AccountData {
			continue
		}
		params, ok := inboxParams[p]
		if !ok {
			t.Fatalf("profile %s has no row in inboxParams", p)
		}
		attackers = append(attackers, attacker{"minted " + string(p), p, params})
	}
	callout := agentO1
	callout.InboxNonce = ownNonce
	attackers = append(attackers, attacker{"callout agent", profiles.Agent, callout},
		attacker{"callout admin", profiles.Admin, profiles.Params{Owner: "o1", Actor: "a1", InboxNonce: ownNonce}})

	for _, a := range attackers {
		for _, target := range []struct{ what, subject string }{
			{"a minted credential's inbox", "_INBOX_" + victimKey + ".reply"},
			{"another principal's callout inbox", "_INBOX_" + victimNonce + ".reply"},
		} {
			t.Run("fail/"+a.name+" subscribes to "+target.what, func(t *testing.T) {
				nc := connectAs(t, b, principal{a.prof, a.params})
				if _, err := nc.SubscribeSync(target.subject); err != nil {
					t.Fatal(err)
				}
				err := b.WaitAsyncError(t, nc, testkit.SubscribeViolation(target.subject))
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Fatalf("broker error %v is not a permissions violation", err)
				}
			})
		}
	}
	// The inbox the grant does carry works: a request over it is answered.
	t.Run("ok/callout agent's own bound inbox carries replies", func(t *testing.T) {
		nc := connectAs(t, b, principal{profiles.Agent, callout})
		if _, err := nc.Subscribe(nc.NewRespInbox(), func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if errs := b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("own inbox refused: %v", errs)
		}
	})
}
