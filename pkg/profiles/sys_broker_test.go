package profiles_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// connzReply is the part of a $SYS CONNZ answer these tests read.
type connzReply struct {
	Data struct {
		Connections []struct {
			Cid uint64 `json:"cid"`
		} `json:"connections"`
	} `json:"data"`
	Error *struct {
		Description string `json:"description"`
	} `json:"error"`
}

// TestBrokerSystemProfiles proves the two $SYS profiles on the broker: the membership observer
// lists the connections of its space's data account and hears its CONNECT and DISCONNECT events
// and nothing else; the connection evictor kicks a connection by id and nothing else.
func TestBrokerSystemProfiles(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	sp := b.Space(brokerSpace)
	must := mustOf(t)
	acct := sp.Trust.DataAccountPublicKey()
	connz := must(space.SysAccountConnz(acct))

	obs := connectAs(t, b, principal{profiles.MembershipObserver, none})
	events := make(chan string, 16)
	for _, subj := range []string{must(space.SysAccountConnect(acct)), must(space.SysAccountDisconnect(acct))} {
		if _, err := obs.Subscribe(subj, func(m *nats.Msg) { events <- m.Subject }); err != nil {
			t.Fatal(err)
		}
	}
	if err := obs.Flush(); err != nil {
		t.Fatal(err)
	}
	agent := connectAs(t, b, principal{profiles.Agent, agentO1})
	cid, err := agent.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	waitEvent := func(want string) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case got := <-events:
				if got == want {
					return
				}
			case <-deadline:
				t.Fatalf("no %s event", want)
			}
		}
	}
	t.Run("ok/observer hears connect and lists the account", func(t *testing.T) {
		waitEvent(must(space.SysAccountConnect(acct)))
		msg, err := obs.Request(connz, []byte(`{}`), 5*time.Second)
		if err != nil {
			t.Fatalf("CONNZ: %v", err)
		}
		var r connzReply
		if err := json.Unmarshal(msg.Data, &r); err != nil || r.Error != nil {
			t.Fatalf("CONNZ answer %s: %v", msg.Data, err)
		}
		found := false
		for _, c := range r.Data.Connections {
			found = found || c.Cid == cid
		}
		if !found {
			t.Fatalf("CONNZ lists no cid %d: %s", cid, msg.Data)
		}
	})
	t.Run("fail/observer reaches nothing else", func(t *testing.T) {
		for _, subj := range []string{
			must(space.SysAccountConnz(sp.Trust.AuthAccountPublicKey())),
			"$SYS.REQ.SERVER.PING.CONNZ",
			must(space.SysKick(agent.ConnectedServerId())),
		} {
			o := connectAs(t, b, principal{profiles.MembershipObserver, none})
			if err := o.Publish(subj, []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			wantViolation(t, b, o, testkit.PublishViolation(subj))
		}
		for _, subj := range []string{"$SYS.ACCOUNT.*.CONNECT", must(space.SysAccountConnect(sp.Trust.AuthAccountPublicKey())), "$SYS.>"} {
			o := connectAs(t, b, principal{profiles.MembershipObserver, none})
			if _, err := o.SubscribeSync(subj); err != nil {
				t.Fatal(err)
			}
			wantViolation(t, b, o, testkit.SubscribeViolation(subj))
		}
	})
	t.Run("fail/evictor reaches nothing but KICK", func(t *testing.T) {
		ev := connectAs(t, b, principal{profiles.ConnectionEvictor, none})
		if err := ev.Publish(connz, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, b, ev, testkit.PublishViolation(connz))
		ev2 := connectAs(t, b, principal{profiles.ConnectionEvictor, none})
		subj := must(space.SysAccountDisconnect(acct))
		if _, err := ev2.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, b, ev2, testkit.SubscribeViolation(subj))
		if !agent.IsConnected() {
			t.Fatal("agent lost its connection to a refused request")
		}
	})
	t.Run("ok/evictor kicks a connection by id", func(t *testing.T) {
		ev := connectAs(t, b, principal{profiles.ConnectionEvictor, none})
		msg, err := ev.Request(must(space.SysKick(agent.ConnectedServerId())), fmt.Appendf(nil, `{"cid":%d}`, cid), 5*time.Second)
		if err != nil {
			t.Fatalf("KICK: %v", err)
		}
		var r connzReply
		if err := json.Unmarshal(msg.Data, &r); err != nil || r.Error != nil {
			t.Fatalf("KICK answer %s: %v", msg.Data, err)
		}
		testkit.Eventually(t, 5*time.Second, func() error {
			if agent.IsConnected() {
				return fmt.Errorf("agent still connected")
			}
			return nil
		})
		waitEvent(must(space.SysAccountDisconnect(acct)))
	})
}
