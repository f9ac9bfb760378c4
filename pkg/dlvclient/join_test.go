package dlvclient

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/space"
)

// TestDecodeJoinReply: an answer is accepted only for the asked lifecycle; a refusal carries
// deliveryd's reason; anything else is ErrBadReply. (Join against a real deliveryd responder is
// tested in deliveryd/internal/ctl, which may import deliveryd's test environment.)
func TestDecodeJoinReply(t *testing.T) {
	const uid = "uidaaaaaaaaaaaaaaaaaaaaaaa"
	res, err := DecodeJoinReply([]byte(`{"ok":true,"data":{"durable":true,"generation":3,"lifecycleUid":"`+uid+`"}}`), uid)
	if err != nil || !res.Durable || res.Generation != 3 || res.LifecycleUID != uid {
		t.Fatalf("ok reply: %+v, %v", res, err)
	}
	_, err = DecodeJoinReply([]byte(`{"ok":false,"error":"channel \"x\" is not within your read ACL"}`), uid)
	var re *RefusedError
	if !errors.As(err, &re) || re.Message != `channel "x" is not within your read ACL` {
		t.Fatalf("refusal: %v", err)
	}
	for name, body := range map[string]string{
		"fail/other-lifecycle": `{"ok":true,"data":{"durable":true,"generation":1,"lifecycleUid":"uidbbbbbbbbbbbbbbbbbbbbbbb"}}`,
		"fail/generation-0":    `{"ok":true,"data":{"durable":true,"generation":0,"lifecycleUid":"` + uid + `"}}`,
		"fail/no-data":         `{"ok":true}`,
		"fail/no-ok":           `{"data":{}}`,
		"fail/not-object":      `[]`,
		"fail/too-long":        `{"ok":false,"error":"` + strings.Repeat("x", MaxReplyBytes) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeJoinReply([]byte(body), uid); !errors.Is(err, ErrBadReply) {
				t.Fatalf("%v, want ErrBadReply", err)
			}
		})
	}
}

// TestJoinRefusesLocally: a channel pattern, an invalid channel or uid, or an invalid principal
// is refused before anything is sent (the nil connection is never touched).
func TestJoinRefusesLocally(t *testing.T) {
	n, err := space.NewNames("alpha")
	if err != nil {
		t.Fatal(err)
	}
	var nc *nats.Conn
	for name, args := range map[string][4]string{
		"fail/pattern":     {"local", "a1", "uidaaaaaaaaaaaaaaaaaaaaaaa", "team.*"},
		"fail/empty":       {"local", "a1", "uidaaaaaaaaaaaaaaaaaaaaaaa", ""},
		"fail/uid":         {"local", "a1", "not a uid", "general"},
		"fail/actor":       {"local", "a.1", "uidaaaaaaaaaaaaaaaaaaaaaaa", "general"},
		"fail/owner-empty": {"", "a1", "uidaaaaaaaaaaaaaaaaaaaaaaa", "general"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Join(context.Background(), nc, n, args[0], args[1], args[2], args[3]); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}
