package dlvclient

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/space"
)

const invUID = "uidaaaaaaaaaaaaaaaaaaaaaaa"

// TestDecodeInventoryReply: an answer is accepted only for the asked lifecycle with a list of
// distinct concrete channels; complete:false comes back with ErrIncomplete and what was seen; a
// refusal carries deliveryd's reason; anything else is ErrBadReply. (LifecycleMemberships
// against a real deliveryd responder is tested in deliveryd/internal/ctl.)
func TestDecodeInventoryReply(t *testing.T) {
	head := `{"ok":true,"data":{"owner":"local","actor":"a1","lifecycleUid":"` + invUID + `",`
	t.Run("ok/complete", func(t *testing.T) {
		got, err := DecodeInventoryReply([]byte(head+`"channels":["general","team.backend"],"complete":true}}`), "local", "a1", invUID)
		if err != nil || !got.Complete || strings.Join(got.Channels, " ") != "general team.backend" || got.Owner != "local" || got.Actor != "a1" {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("ok/none", func(t *testing.T) {
		got, err := DecodeInventoryReply([]byte(head+`"channels":[],"complete":true}}`), "local", "a1", invUID)
		if err != nil || !got.Complete || len(got.Channels) != 0 {
			t.Fatalf("%+v, %v", got, err)
		}
	})
	t.Run("fail/incomplete", func(t *testing.T) {
		got, err := DecodeInventoryReply([]byte(head+`"channels":["general"],"complete":false}}`), "local", "a1", invUID)
		if !errors.Is(err, ErrIncomplete) || got.Complete || strings.Join(got.Channels, " ") != "general" {
			t.Fatalf("%+v, %v; want ErrIncomplete with general", got, err)
		}
	})
	t.Run("fail/refused", func(t *testing.T) {
		_, err := DecodeInventoryReply([]byte(`{"ok":false,"error":"local.authd may ask only lifecycleMemberships"}`), "local", "a1", invUID)
		var re *RefusedError
		if !errors.As(err, &re) || re.Op != "lifecycleMemberships" || re.Message != "local.authd may ask only lifecycleMemberships" {
			t.Fatalf("%v", err)
		}
	})
	for name, body := range map[string]string{
		"fail/other-lifecycle":   `{"ok":true,"data":{"owner":"local","actor":"a2","lifecycleUid":"` + invUID + `","channels":[],"complete":true}}`,
		"fail/other-uid":         `{"ok":true,"data":{"owner":"local","actor":"a1","lifecycleUid":"uidbbbbbbbbbbbbbbbbbbbbbbb","channels":[],"complete":true}}`,
		"fail/no-channels":       head + `"complete":true}}`,
		"fail/no-complete":       head + `"channels":[]}}`,
		"fail/pattern-channel":   head + `"channels":["team.>"],"complete":true}}`,
		"fail/repeated-channel":  head + `"channels":["general","general"],"complete":true}}`,
		"fail/channels-not-list": head + `"channels":"general","complete":true}}`,
		"fail/no-data":           `{"ok":true}`,
		"fail/no-ok":             `{"data":{}}`,
		"fail/not-object":        `[]`,
		"fail/too-long":          `{"ok":false,"error":"` + strings.Repeat("x", MaxInventoryReplyBytes) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeInventoryReply([]byte(body), "local", "a1", invUID); !errors.Is(err, ErrBadReply) {
				t.Fatalf("%v, want ErrBadReply", err)
			}
		})
	}
}

// TestInventoryRefusesLocally: an invalid target or caller is refused before anything is sent
// (the nil connection is never touched).
func TestInventoryRefusesLocally(t *testing.T) {
	n, err := space.NewNames("alpha")
	if err != nil {
		t.Fatal(err)
	}
	var nc *nats.Conn
	for name, args := range map[string][5]string{
		"fail/uid":          {"local", "authd", "local", "a1", "not a uid"},
		"fail/actor":        {"local", "authd", "local", "a.1", invUID},
		"fail/owner-empty":  {"local", "authd", "", "a1", invUID},
		"fail/caller-actor": {"local", "a.b", "local", "a1", invUID},
		"fail/caller-empty": {"", "authd", "local", "a1", invUID},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := LifecycleMemberships(context.Background(), nc, n, args[0], args[1], args[2], args[3], args[4]); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
