// Package plane3 holds what deliveryd's fan-out writer and trusted reader share: the rows they
// read (membership and ACL records, upstream members.ts and acls.ts), the inbox entry they pass
// through INBOX_<t> (upstream Plane3Entry), the eligibility and ACL rules, the dedup message ids,
// and the parsing of the subjects they consume. Every decoder here reads bytes another party
// wrote and refuses what it does not understand.
package plane3

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// Reasons an entry was routed (upstream Plane3Entry.reason).
const (
	ReasonDurable = "durable-channel"
	ReasonMention = "live-mention"
)

// Delivery classes (upstream DeliveryClass).
const (
	ClassDurable = "durable"
	ClassLive    = "live"
)

// Defaults shared by both loops.
const (
	// AckWait is the ack_wait of fanout and reader: 15 s, half the lease TTL, where upstream has
	// 60 s, so that what a killed deliveryd held is deliverable again before its successor can
	// hold the lease; a live holder's long pass sends progress acks instead (Keeper, progress.go).
	AckWait = 15 * time.Second
	// ReaderMaxAckPending bounds the reader's in-flight entries (upstream DINBOX_MAX_ACK_PENDING).
	ReaderMaxAckPending = 1000
	// NakDelay is the redelivery delay after a missing ACL row or a failed publish.
	NakDelay = 2 * time.Second
	// MaxDeliveries is the reader's ceiling (upstream READER_MAX_REDELIVERIES): an entry delivered
	// this many times without success is terminated.
	MaxDeliveries = 10
	// MaxBodyBytes bounds any body these loops decode.
	MaxBodyBytes = 1 << 20
)

// ErrBadRecord matches every record or entry the decoders refuse.
var ErrBadRecord = errors.New("plane3: undecodable record")

// Lifecycle names one agent incarnation: owner, actor and lifecycle UID.
type Lifecycle struct{ Owner, Actor, UID string }

// Principal is the dot form owner.actor.
func (l Lifecycle) Principal() string { return l.Owner + "." + l.Actor }

// Member is a durable-membership row (upstream MembershipRecord). Cursors are CHAT sequences.
type Member struct {
	Channel        string  `json:"channel"`
	Owner          string  `json:"owner"`
	LifecycleUID   string  `json:"lifecycleUid"`
	State          string  `json:"state"`
	JoinCursor     uint64  `json:"joinCursor"`
	LeaveCursor    *uint64 `json:"leaveCursor,omitempty"`
	Generation     uint64  `json:"generation"`
	Activated      bool    `json:"activated"`
	WriterIdentity string  `json:"writerIdentity"`
	UpdatedAt      int64   `json:"updatedAt"`
}

// Membership states (upstream MembershipRecord.state): an open durable membership, and a
// tombstone whose leaveCursor closes the backstop. deliveryd/internal/ctl writes both (its
// StateActive and StateTombstone are these); the fan-out writer writes the tombstone of a
// departed lifecycle (Member.Depart).
const (
	StateActive    = "durable-active"
	StateTombstone = "live-confirmed"
)

// Depart is the row closed for a lifecycle that has left the space: deprovisioned, so it has no
// ACL row, no dlv_ durable and can never be delivered to again. It is a tombstone with an empty
// interval (leaveCursor = joinCursor), so no entry of it, routed or already in an inbox, is
// eligible any more and the reader drops each at its first delivery instead of retrying it. The
// row and its generation stay rather than being deleted: a rejoin of the same key (the same
// lifecycle provisioned again) moves on to generation+1, so its copies' dedup ids never repeat
// ones still inside INBOX's and DLV's dedup window, and every later write is a revision CAS
// against a row that exists. ok is false when m is already closed so (nothing to write).
func (m Member) Depart(writer string, now int64) (Member, bool) {
	if m.LeaveCursor != nil && *m.LeaveCursor <= m.JoinCursor && m.State == StateTombstone {
		return m, false
	}
	leave := m.JoinCursor
	m.State, m.LeaveCursor, m.WriterIdentity, m.UpdatedAt = StateTombstone, &leave, writer, now
	return m, true
}

// Eligible is upstream's durableEligible: the member receives CHAT message seq when
// joinCursor < seq <= leaveCursor (no upper bound while open). It does not look at Activated,
// which reports completeness, not delivery.
func (m Member) Eligible(seq uint64) bool {
	if seq <= m.JoinCursor {
		return false
	}
	return m.LeaveCursor == nil || seq <= *m.LeaveCursor
}

// DecodeMember reads a membership row; the key (ParseMemberKey) names its channel and lifecycle,
// and the row must agree with it.
func DecodeMember(key string, b []byte) (Member, Lifecycle, error) {
	channel, lc, ok := ParseMemberKey(key)
	if !ok {
		return Member{}, Lifecycle{}, fmt.Errorf("%w: member key %q", ErrBadRecord, key)
	}
	var m Member
	if len(b) > MaxBodyBytes || json.Unmarshal(b, &m) != nil {
		return Member{}, Lifecycle{}, fmt.Errorf("%w: member row %q", ErrBadRecord, key)
	}
	if m.Channel != channel || m.Owner != lc.Principal() || m.LifecycleUID != lc.UID {
		return Member{}, Lifecycle{}, fmt.Errorf("%w: member row %q names %s/%s.%s", ErrBadRecord, key, m.Channel, m.Owner, m.LifecycleUID)
	}
	return m, lc, nil
}

// ParseMemberKey splits <channel>/<owner>.<actor>.<uid>, checking every part with pkg/space.
func ParseMemberKey(key string) (string, Lifecycle, bool) {
	channel, rest, ok := strings.Cut(key, "/")
	if !ok || space.ValidateChannel(channel) != nil {
		return "", Lifecycle{}, false
	}
	lc, ok := ParseACLKey(rest)
	return channel, lc, ok
}

// ParseACLKey splits <owner>.<actor>.<uid>, checking every part with pkg/space.
func ParseACLKey(key string) (Lifecycle, bool) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return Lifecycle{}, false
	}
	lc := Lifecycle{parts[0], parts[1], parts[2]}
	if _, err := space.ACLKey(lc.Owner, lc.Actor, lc.UID); err != nil {
		return Lifecycle{}, false
	}
	return lc, true
}

// ACL is a lifecycle's read-ACL row (upstream AclRecord), the type managerd writes it with
// (pkg/provision.ACL): one definition for the writer and every reader here.
type ACL = provision.ACL

// DecodeACL reads an ACL row (provision.DecodeACL). A row that does not decode or lacks the
// allowSubscribe array is reported as not a row (upstream readAcl treats it as unknown, so the
// reader defers, never drops).
func DecodeACL(b []byte) (ACL, bool) { return provision.DecodeACL(b) }

// Entry is what the fan-out writer puts in a lifecycle's inbox and the trusted reader takes out
// (upstream Plane3Entry).
type Entry struct {
	Msg        json.RawMessage `json:"msg"`
	Channel    string          `json:"channel"`
	Seq        uint64          `json:"seq"`
	Reason     string          `json:"reason"`
	Generation uint64          `json:"generation"`
}

// EntryEncoder encodes the inbox entries of one chat message, one per lifecycle it is routed to,
// sharing the encoding of everything but reason and generation: the body is not re-encoded for
// every member. Encode returns exactly what json.Marshal of the Entry returns, provided body is
// compact JSON as Message.Normalised returns it (FuzzEntryEncoder holds it to that).
type EntryEncoder struct {
	head []byte // {"msg":<body>,"channel":<channel>,"seq":<seq>,"reason":
}

// NewEntryEncoder prepares the entries of body (Normalised's output) on channel at CHAT seq.
func NewEntryEncoder(body json.RawMessage, channel string, seq uint64) EntryEncoder {
	ch, _ := json.Marshal(channel) // a string always marshals
	head := make([]byte, 0, len(body)+len(ch)+64)
	head = append(head, `{"msg":`...)
	head = append(head, body...)
	head = append(head, `,"channel":`...)
	head = append(head, ch...)
	head = append(head, `,"seq":`...)
	head = strconv.AppendUint(head, seq, 10)
	head = append(head, `,"reason":`...)
	return EntryEncoder{head: head}
}

// Encode is the entry for one lifecycle.
func (e EntryEncoder) Encode(reason string, generation uint64) []byte {
	r, _ := json.Marshal(reason)
	out := make([]byte, 0, len(e.head)+len(r)+32)
	out = append(out, e.head...)
	out = append(out, r...)
	out = append(out, `,"generation":`...)
	out = strconv.AppendUint(out, generation, 10)
	return append(out, '}')
}

// DecodeEntry reads an inbox entry strictly: a known reason, a valid channel, a positive CHAT
// sequence and a msg that is a JSON object. It returns the message id ("" when absent).
func DecodeEntry(b []byte) (Entry, string, error) {
	e, err := DecodeEntryHead(b)
	if err != nil {
		return Entry{}, "", err
	}
	m, err := DecodeMessage(e.Msg)
	if err != nil {
		return Entry{}, "", err
	}
	return e, m.ID, nil
}

// DecodeEntryHead is DecodeEntry without the check of msg (DecodeMessage): for a reader that
// decodes each distinct msg once (a chat message's entries to N members carry the same bytes).
func DecodeEntryHead(b []byte) (Entry, error) {
	var e Entry
	if len(b) > MaxBodyBytes || json.Unmarshal(b, &e) != nil {
		return Entry{}, fmt.Errorf("%w: inbox entry", ErrBadRecord)
	}
	if e.Reason != ReasonDurable && e.Reason != ReasonMention {
		return Entry{}, fmt.Errorf("%w: reason %q", ErrBadRecord, e.Reason)
	}
	if space.ValidateChannel(e.Channel) != nil || e.Seq == 0 {
		return Entry{}, fmt.Errorf("%w: channel %q seq %d", ErrBadRecord, e.Channel, e.Seq)
	}
	return e, nil
}

// Message is what the loops read of a chat message; the rest of it is carried as it is.
type Message struct {
	ID       string
	From     string
	Mentions []string
	fields   map[string]json.RawMessage
}

// DecodeMessage reads a chat message: a JSON object whose id, if present, is a string, whose
// from.id, if present, is a string, and whose mentions, if present, are strings.
func DecodeMessage(b []byte) (Message, error) {
	var fields map[string]json.RawMessage
	if len(b) > MaxBodyBytes || json.Unmarshal(b, &fields) != nil || fields == nil {
		return Message{}, fmt.Errorf("%w: message is not a JSON object", ErrBadRecord)
	}
	m := Message{fields: fields}
	if raw, ok := fields["id"]; ok && json.Unmarshal(raw, &m.ID) != nil {
		return Message{}, fmt.Errorf("%w: message id", ErrBadRecord)
	}
	if raw, ok := fields["from"]; ok {
		var from struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(raw, &from) != nil {
			return Message{}, fmt.Errorf("%w: message from", ErrBadRecord)
		}
		m.From = from.ID
	}
	if raw, ok := fields["mentions"]; ok && json.Unmarshal(raw, &m.Mentions) != nil {
		return Message{}, fmt.Errorf("%w: message mentions", ErrBadRecord)
	}
	return m, nil
}

// Normalised is the message bound to its authenticated channel: channel set, to and toService
// removed (upstream fanOutMessage step 2).
func (m Message) Normalised(channel string) (json.RawMessage, error) {
	out := make(map[string]json.RawMessage, len(m.fields)+1)
	for k, v := range m.fields {
		if k != "to" && k != "toService" {
			out[k] = v
		}
	}
	ch, _ := json.Marshal(channel)
	out["channel"] = ch
	return json.Marshal(out)
}

// MsgID is the dedup id of one message's copy for one lifecycle and generation:
// <id>:<owner>.<actor>:<uid>:<generation>. A message without an id gets none (no dedup).
func MsgID(id string, lc Lifecycle, generation uint64) string {
	if id == "" {
		return ""
	}
	return id + ":" + lc.Principal() + ":" + lc.UID + ":" + strconv.FormatUint(generation, 10)
}

// ParseChat splits cotal.<t>.chat.<owner>.<actor>.<channel...> of space n. It refuses another
// space, another kind, bad tokens and an owner that is not a real principal owner ("local" or a
// derived u_ owner, upstream isPrincipalOwnerToken).
func ParseChat(n space.Names, subject string) (owner, actor, channel string, ok bool) {
	rest, found := strings.CutPrefix(subject, n.Prefix()+".chat.")
	if !found {
		return "", "", "", false
	}
	parts := strings.SplitN(rest, ".", 3)
	if len(parts) != 3 {
		return "", "", "", false
	}
	owner, actor, channel = parts[0], parts[1], parts[2]
	if space.ValidateOwner(owner) != nil || space.ValidateActor(actor) != nil || space.ValidateChannel(channel) != nil {
		return "", "", "", false
	}
	if owner != "local" && space.ValidateDerivedOwner(owner) != nil {
		return "", "", "", false
	}
	return owner, actor, channel, true
}

// ParseDinbox splits cotal.<t>.dinbox.<owner>.<actor>.<uid> of space n: exactly six tokens, each
// part valid.
func ParseDinbox(n space.Names, subject string) (Lifecycle, bool) {
	rest, found := strings.CutPrefix(subject, n.Prefix()+".dinbox.")
	if !found {
		return Lifecycle{}, false
	}
	return ParseACLKey(rest)
}

// ClassOf is a channel's delivery class in the channels bucket's mirror (synced by the caller),
// as upstream's deliveryClassFresh reads it: the channel's own entry, else the =defaults entry,
// else durable. An entry that does not decode counts as unset, as upstream's decode does.
func ClassOf(channels *Mirror, channel string) string {
	for _, key := range []string{channel, space.ChannelDefaultsKey} {
		r, ok := channels.Get(key)
		if !ok {
			continue
		}
		var cfg struct {
			DeliveryClass string `json:"deliveryClass"`
		}
		if json.Unmarshal(r.Value, &cfg) == nil && (cfg.DeliveryClass == ClassDurable || cfg.DeliveryClass == ClassLive) {
			return cfg.DeliveryClass
		}
	}
	return ClassDurable
}
