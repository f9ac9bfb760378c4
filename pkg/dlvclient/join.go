package dlvclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/space"
)

// The agent's side of deliveryd's ctl.delivery rail (reference/delivery.md §1.5): the request
// {op, args, from} goes to cotal.<t>.ctl.delivery.<owner>.<actor> with the reply subject
// <that>.reply.<nonce> (deliveryd answers nowhere else), and the answer is {ok, data?, error?}.

const (
	// DefaultJoinTimeout bounds a Join whose context has no deadline (upstream agents wait 30 s).
	DefaultJoinTimeout = 30 * time.Second
	// MaxReplyBytes bounds a control reply this package decodes.
	MaxReplyBytes = 64 << 10
	// opDurableJoin is deliveryd's op name.
	opDurableJoin = "durableJoin"
)

// JoinResult is durableJoin's answer. Durable false (with Reason) means the membership was not
// activated: retention evicted part of the catch-up window, or a concurrent leave or rejoin
// superseded it; the caller may join again.
type JoinResult struct {
	Durable      bool   `json:"durable"`
	Generation   uint64 `json:"generation"`
	LifecycleUID string `json:"lifecycleUid"`
	Reason       string `json:"reason,omitempty"`
}

// RefusedError is deliveryd's refusal of a control request, with its reason as sent (bounded and
// made valid UTF-8).
type RefusedError struct {
	Op      string
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("dlvclient: deliveryd refused %s: %s", e.Op, e.Message)
}

// ErrBadReply matches every reply DecodeJoinReply refuses.
var ErrBadReply = errors.New("dlvclient: not a control reply")

// Join asks deliveryd to make owner.actor a durable member of channel, as itself on nc (an agent
// credential of that principal: the broker lets only it publish the request and read the
// answer). uid is the agent's lifecycle uid; deliveryd resolves the caller's one live lifecycle
// from its ACL rows and the answer must name uid. It refuses locally, sending nothing, a channel
// that is not concrete or invalid names. Without a responder it fails fast with
// nats.ErrNoResponders; a refusal is a *RefusedError. ctx bounds the wait (DefaultJoinTimeout
// when it has no deadline).
func Join(ctx context.Context, nc *nats.Conn, n space.Names, owner, actor, uid, channel string) (JoinResult, error) {
	if err := space.ValidateChannel(channel); err != nil {
		return JoinResult{}, fmt.Errorf("dlvclient: join: %w", err)
	}
	if err := space.ValidateUID(uid); err != nil {
		return JoinResult{}, fmt.Errorf("dlvclient: join: %w", err)
	}
	subject, err := n.CtlDelivery(owner, actor)
	if err != nil {
		return JoinResult{}, fmt.Errorf("dlvclient: join: %w", err)
	}
	m, err := request(ctx, nc, subject, opDurableJoin, map[string]string{"channel": channel}, owner+"."+actor, DefaultJoinTimeout)
	if err != nil {
		return JoinResult{}, fmt.Errorf("dlvclient: join %s: %w", channel, err)
	}
	return DecodeJoinReply(m.Data, uid)
}

// DecodeJoinReply reads durableJoin's reply body: a JSON object of at most MaxReplyBytes with a
// boolean ok; ok false is a *RefusedError carrying error; ok true must carry data {durable,
// generation, lifecycleUid, reason?} whose lifecycleUid is uid (and generation is at least 1).
// Anything else is an error matching ErrBadReply.
func DecodeJoinReply(b []byte, uid string) (JoinResult, error) {
	data, err := decodeAnswer(b, MaxReplyBytes, opDurableJoin)
	if err != nil {
		return JoinResult{}, err
	}
	var res JoinResult
	dec := json.NewDecoder(bytes.NewReader(data))
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' || dec.Decode(&res) != nil {
		return JoinResult{}, fmt.Errorf("%w: data is not a join result", ErrBadReply)
	}
	if res.LifecycleUID != uid {
		return JoinResult{}, fmt.Errorf("%w: the join names lifecycle %.40q, not this agent's %s", ErrBadReply, res.LifecycleUID, uid)
	}
	if res.Generation == 0 {
		return JoinResult{}, fmt.Errorf("%w: generation 0", ErrBadReply)
	}
	return res, nil
}

// request sends one ctl request {op, args, from: {id: from}} on subject with a fresh reply inbox
// under it (subject.reply.<nonce>, the lane's reply family), and waits for the answer within ctx
// (timeout when ctx has no deadline). The reply subscription is made before the request is
// published on the same connection, so the answer cannot arrive first. No responder (an empty
// 503 status message) is nats.ErrNoResponders.
func request(ctx context.Context, nc *nats.Conn, subject, op string, args map[string]string, from string, timeout time.Duration) (*nats.Msg, error) {
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	reply := subject + ".reply." + hex.EncodeToString(nonce[:])
	body, err := json.Marshal(map[string]any{"op": op, "args": args, "from": map[string]string{"id": from}})
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: body}); err != nil {
		return nil, err
	}
	m, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, err
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return m, nil
}

// decodeAnswer reads a ctl answer's envelope: a JSON object of at most max bytes with a boolean
// ok. ok false is a *RefusedError for op carrying error (clipped to 300 bytes, valid UTF-8); ok
// true returns data for the caller's own closed decode. Anything else matches ErrBadReply.
func decodeAnswer(b []byte, max int, op string) (json.RawMessage, error) {
	if len(b) > max {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadReply, len(b))
	}
	var r struct {
		OK    *bool           `json:"ok"`
		Data  json.RawMessage `json:"data"`
		Error string          `json:"error"`
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' || json.Unmarshal(b, &r) != nil || r.OK == nil {
		return nil, fmt.Errorf("%w: not a JSON object with a boolean ok", ErrBadReply)
	}
	if !*r.OK {
		msg := r.Error
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		msg = strings.ToValidUTF8(msg, "?")
		if msg == "" {
			msg = "no reason given"
		}
		return nil, &RefusedError{Op: op, Message: msg}
	}
	return r.Data, nil
}
