package profiles_test

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// Issue 24 item 6 on the broker: a service-serve credential hears its own endpoint instance's
// requests and answers on their reply family, and nothing else.

const (
	// svcOwner is a derived owner; svcEndpoint's key token is billing_api-v2.
	svcOwner    = "u_abcdefghijklmnopqrstuvwxyz"
	svcEndpoint = "billing.api-v2"
	svcTok      = "billing_api-v2"
	svcIID      = "ssssssssssssssssssssssssss"
	svcIID2     = "tttttttttttttttttttttttttt"
)

// serviceServeS1 serves instance svcIID of svcEndpoint for svcOwner.
var serviceServeS1 = profiles.Params{Owner: svcOwner, ServiceEndpoint: svcEndpoint, InstanceID: svcIID}

// TestServiceServeBroker: the instance's credential receives a request on
// cotal.<t>.sep.<epTok>.<iid>.<op> and its answer on cotal.<t>.sep.reply.<epTok>.<iid>.<op>
// reaches the caller; the broker refuses it another instance's or endpoint's serve and reply
// subjects, any inbox, JetStream, chat and KV, and its own serve family as a publisher.
func TestServiceServeBroker(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	tok, kp := b.Space(brokerSpace).MintUnlimited(t)
	caller, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatal(err)
	}
	svc := principal{profiles.ServiceServe, serviceServeS1}
	serve := must(n.ServiceServe(svcTok, svcIID))
	reply := must(n.ServiceReply(svcTok, svcIID))
	request, answer := leaf(serve), leaf(reply)

	t.Run("ok/serves its instance and answers on its reply family", func(t *testing.T) {
		nc := connectAs(t, b, svc)
		requests := subscribe(t, nc, serve)
		answers := subscribe(t, caller, reply)
		if err := caller.Publish(request, []byte("req")); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, requests, request, "req")
		if err := nc.Publish(answer, []byte("ans")); err != nil {
			t.Fatal(err)
		}
		expectMsg(t, answers, answer, "ans")
		if errs := append(b.AsyncErrors(nc), b.AsyncErrors(caller)...); len(errs) != 0 {
			t.Fatalf("broker errors: %v", errs)
		}
	})

	other := must(n.ServiceServe(svcTok, svcIID2))
	otherEp := must(n.ServiceServe("billing", svcIID))
	for _, tt := range []struct {
		name, op, subject string
	}{
		{"fail/sub another instance's requests", "sub", other},
		{"fail/sub another endpoint's requests", "sub", otherEp},
		{"fail/sub every instance of its endpoint", "sub", "cotal." + brokerSpace + ".sep." + svcTok + ".>"},
		{"fail/sub every service request", "sub", "cotal." + brokerSpace + ".sep.>"},
		{"fail/sub its own answers", "sub", reply},
		{"fail/sub another instance's answers", "sub", must(n.ServiceReply(svcTok, svcIID2))},
		{"fail/sub an inbox", "sub", "_INBOX.>"},
		{"fail/sub a nonce inbox", "sub", "_INBOX_" + svcOwner + ".>"},
		{"fail/sub jetstream", "sub", "$JS.>"},
		{"fail/sub chat", "sub", must(n.ChatRead("general"))},
		{"fail/pub another instance's answer", "pub", leaf(must(n.ServiceReply(svcTok, svcIID2)))},
		{"fail/pub another endpoint's answer", "pub", leaf(must(n.ServiceReply("billing", svcIID)))},
		{"fail/pub a request to itself", "pub", request},
		{"fail/pub a request to another instance", "pub", leaf(other)},
		{"fail/pub an inbox", "pub", "_INBOX.x"},
		{"fail/pub jetstream info", "pub", space.JSAPIInfo},
		{"fail/pub jetstream stream list", "pub", "$JS.API.STREAM.LIST"},
		{"fail/pub a kv write", "pub", must(n.KV(space.Auth, "sep.name."+svcTok))},
		{"fail/pub chat", "pub", must(n.Chat(svcOwner, "svc_"+svcIID, "general"))},
	} {
		t.Run(tt.name, func(t *testing.T) { wantRefused(t, b, svc, tt.op, tt.subject) })
	}
}

// leaf is one subject of a family "<prefix>.>": <prefix>.invoke.
func leaf(family string) string { return strings.TrimSuffix(family, ">") + "invoke" }
