package dlvclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/space"
)

// The footprint inventory on deliveryd's delivery-admin lane (issue 25): lifecycleMemberships
// {owner, actor, lifecycleUid} goes to cotal.<t>.ctl.delivery-admin.<caller owner>.<caller actor>
// with the reply subject <that>.reply.<nonce>. Only a supervisor credential (its own principal)
// and authd's auth-plane credential (local.authd) may send it.

const (
	// DefaultInventoryTimeout bounds a LifecycleMemberships whose context has no deadline.
	DefaultInventoryTimeout = 30 * time.Second
	// opLifecycleMemberships is deliveryd's op name.
	opLifecycleMemberships = "lifecycleMemberships"
	// MaxInventoryReplyBytes bounds an inventory reply this package decodes: a list of
	// channels may be as long as deliveryd's max_payload allows.
	MaxInventoryReplyBytes = 8 << 20
)

// Inventory is lifecycleMemberships' answer: the lifecycle asked about and the channel of every
// membership row it holds in the members bucket (sorted, each a concrete channel). Complete false
// means the list may miss rows; LifecycleMemberships then returns it with ErrIncomplete.
type Inventory struct {
	Owner        string   `json:"owner"`
	Actor        string   `json:"actor"`
	LifecycleUID string   `json:"lifecycleUid"`
	Channels     []string `json:"channels"`
	Complete     bool     `json:"complete"`
}

// ErrIncomplete is returned, with the channels deliveryd did see, when it could not list every
// row of the lifecycle (complete:false): a caller must not take the list for the whole footprint.
var ErrIncomplete = errors.New("dlvclient: deliveryd's membership inventory is incomplete")

// LifecycleMemberships asks deliveryd for the channels of every membership row of the lifecycle
// owner.actor.uid, as callerOwner.callerActor on nc (a credential of that principal that may send
// on the delivery-admin lane: a supervisor, or authd's auth-plane as local.authd). It refuses
// locally, sending nothing, names outside their pkg/space grammars. Without a responder it fails
// fast with nats.ErrNoResponders; a refusal is a *RefusedError; an answer with complete:false is
// returned with ErrIncomplete. ctx bounds the wait (DefaultInventoryTimeout when it has none).
func LifecycleMemberships(ctx context.Context, nc *nats.Conn, n space.Names, callerOwner, callerActor, owner, actor, uid string) (Inventory, error) {
	if err := space.ValidateOwner(owner); err != nil {
		return Inventory{}, fmt.Errorf("dlvclient: inventory: %w", err)
	}
	if err := space.ValidateActor(actor); err != nil {
		return Inventory{}, fmt.Errorf("dlvclient: inventory: %w", err)
	}
	if err := space.ValidateUID(uid); err != nil {
		return Inventory{}, fmt.Errorf("dlvclient: inventory: %w", err)
	}
	subject, err := n.CtlDeliveryAdmin(callerOwner, callerActor)
	if err != nil {
		return Inventory{}, fmt.Errorf("dlvclient: inventory: %w", err)
	}
	m, err := request(ctx, nc, subject, opLifecycleMemberships, map[string]string{"owner": owner, "actor": actor, "lifecycleUid": uid},
		callerOwner+"."+callerActor, DefaultInventoryTimeout)
	if err != nil {
		return Inventory{}, fmt.Errorf("dlvclient: inventory of %s.%s.%s: %w", owner, actor, uid, err)
	}
	return DecodeInventoryReply(m.Data, owner, actor, uid)
}

// DecodeInventoryReply reads lifecycleMemberships' reply body: a JSON object of at most
// MaxInventoryReplyBytes with a boolean ok; ok false is a *RefusedError carrying error; ok true
// must carry data {owner, actor, lifecycleUid, channels, complete} naming owner.actor.uid, with
// channels a list of distinct concrete channels. Anything else is an error matching ErrBadReply.
// An answer with complete false is returned with ErrIncomplete.
func DecodeInventoryReply(b []byte, owner, actor, uid string) (Inventory, error) {
	data, err := decodeAnswer(b, MaxInventoryReplyBytes, opLifecycleMemberships)
	if err != nil {
		return Inventory{}, err
	}
	var inv struct {
		Owner        string    `json:"owner"`
		Actor        string    `json:"actor"`
		LifecycleUID string    `json:"lifecycleUid"`
		Channels     *[]string `json:"channels"`
		Complete     *bool     `json:"complete"`
	}
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' || json.Unmarshal(data, &inv) != nil ||
		inv.Channels == nil || inv.Complete == nil {
		return Inventory{}, fmt.Errorf("%w: data is not an inventory {owner, actor, lifecycleUid, channels, complete}", ErrBadReply)
	}
	if inv.Owner != owner || inv.Actor != actor || inv.LifecycleUID != uid {
		return Inventory{}, fmt.Errorf("%w: the inventory names %.40q.%.40q.%.40q, not the asked %s.%s.%s",
			ErrBadReply, inv.Owner, inv.Actor, inv.LifecycleUID, owner, actor, uid)
	}
	seen := make(map[string]bool, len(*inv.Channels))
	for i, ch := range *inv.Channels {
		if err := space.ValidateChannel(ch); err != nil {
			return Inventory{}, fmt.Errorf("%w: channel %d is not a concrete channel: %v", ErrBadReply, i, err)
		}
		if seen[ch] {
			return Inventory{}, fmt.Errorf("%w: channel %d repeats %q", ErrBadReply, i, ch)
		}
		seen[ch] = true
	}
	out := Inventory{Owner: owner, Actor: actor, LifecycleUID: uid, Channels: *inv.Channels, Complete: *inv.Complete}
	if !out.Complete {
		return out, ErrIncomplete
	}
	return out, nil
}
