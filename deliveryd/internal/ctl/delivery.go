package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/plane3"
	"github.com/cotalgo/cotal/pkg/space"
)

// ctl.delivery ops.
const (
	OpDurableJoin     = "durableJoin"
	OpDurableLeave    = "durableLeave"
	OpListMemberships = "listMemberships"
	OpReadHistory     = "readHistory"
)

// Reasons durableJoin reports durable:false.
const (
	ReasonEvicted    = "activation catch-up window partially evicted by retention"
	ReasonSuperseded = "activation superseded by a concurrent leave or rejoin"
)

// catchupInactive is how long the broker keeps an abandoned catch-up consumer (upstream 30 s).
const catchupInactive = 30 * time.Second

// JoinResult is durableJoin's data.
type JoinResult struct {
	Durable      bool   `json:"durable"`
	Generation   uint64 `json:"generation"`
	LifecycleUID string `json:"lifecycleUid"`
	Reason       string `json:"reason,omitempty"`
}

// LeaveResult is durableLeave's data.
type LeaveResult struct {
	Channel     string `json:"channel"`
	AlreadyLeft bool   `json:"alreadyLeft,omitempty"`
}

// delivery dispatches one ctl.delivery request of an authenticated caller.
func (r *Responders) delivery(ctx context.Context, c Caller, req Request) Reply {
	switch req.Op {
	case OpDurableJoin:
		return r.durableJoin(ctx, c, req.Args)
	case OpDurableLeave:
		return r.durableLeave(ctx, c, req.Args)
	case OpListMemberships:
		return r.listMemberships(ctx, c, req.Args)
	case OpReadHistory:
		return refuse("readHistory: not supported by this delivery daemon")
	default:
		return refuse("op %q not supported on the delivery control service", req.Op)
	}
}

// channelArg is the op's concrete channel argument (upstream checkDurableChannelArg).
func channelArg(op string, args map[string]json.RawMessage) (string, error) {
	ch, _, err := argString(args, "channel")
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	ch = strings.TrimSpace(ch)
	if ch == "" {
		return "", fmt.Errorf("%s: channel must be a non-blank string", op)
	}
	if err := space.ValidateChannel(ch); err != nil {
		return "", fmt.Errorf("%s: %q must be a concrete channel: %v", op, ch, err)
	}
	return ch, nil
}

// uidArg is the op's required lifecycleUid argument.
func uidArg(op string, args map[string]json.RawMessage) (string, error) {
	uid, _, err := argString(args, "lifecycleUid")
	if err == nil && uid == "" {
		err = errors.New("is required")
	}
	if err == nil {
		err = space.ValidateUID(uid)
	}
	if err != nil {
		return "", fmt.Errorf("%s: lifecycleUid: %v", op, err)
	}
	return uid, nil
}

func (r *Responders) memberKey(channel string, lc plane3.Lifecycle) (string, error) {
	return space.MemberKey(channel, lc.Owner, lc.Actor, lc.UID)
}

// aclRows reads the live ACL rows whose keys match filter (a key or a <principal>.* pattern)
// through a watch, an ordered consumer the stream leader serves, so a row written before the
// read is seen.
func (r *Responders) aclRows(ctx context.Context, filter string) (keys []string, values [][]byte, err error) {
	w, err := r.acl.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, nil, fmt.Errorf("read ACL rows: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, nil, errors.New("read ACL rows: watch closed")
			}
			if e == nil {
				return keys, values, nil
			}
			keys, values = append(keys, e.Key()), append(values, e.Value())
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// liveLifecycle resolves the caller's single live ACL row (upstream readAclForAlias): none is
// "not provisioned", two or more are refused rather than guessed.
func (r *Responders) liveLifecycle(ctx context.Context, c Caller) (plane3.Lifecycle, plane3.ACL, error) {
	keys, values, err := r.aclRows(ctx, c.Principal()+".*")
	if err != nil {
		return plane3.Lifecycle{}, plane3.ACL{}, err
	}
	switch len(keys) {
	case 0:
		return plane3.Lifecycle{}, plane3.ACL{}, refusal(fmt.Sprintf("durableJoin: no read ACL on record for %s (not provisioned for durable delivery)", c.Principal()))
	case 1:
	default:
		return plane3.Lifecycle{}, plane3.ACL{}, refusal(fmt.Sprintf("durableJoin: %s has %d live lifecycle rows; at most one may be live per alias, refusing to guess", c.Principal(), len(keys)))
	}
	lc, ok := plane3.ParseACLKey(keys[0])
	acl, valid := plane3.DecodeACL(values[0])
	if !ok || lc.Principal() != c.Principal() || !valid {
		return plane3.Lifecycle{}, plane3.ACL{}, refusal(fmt.Sprintf("durableJoin: the ACL row of %s does not decode", c.Principal()))
	}
	return lc, acl, nil
}

// fenced reports whether lc's ACL row, read now, grants no reads: present with an empty read
// list (pkg/provision's FenceLifecycleACL, the first step of a retirement's teardown) or gone
// (the teardown removed it). A row that does not decode is not a fence (an unknown row, never
// a known "reads nothing").
func (r *Responders) fenced(ctx context.Context, lc plane3.Lifecycle) (bool, error) {
	key, err := space.ACLKey(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return false, err
	}
	keys, values, err := r.aclRows(ctx, key)
	if err != nil {
		return false, err
	}
	if len(keys) == 0 {
		return true, nil
	}
	acl, ok := plane3.DecodeACL(values[len(values)-1])
	return ok && len(acl.AllowSubscribe) == 0, nil
}

// removeFenced removes lc's own membership row on channel, by revision CAS (a lost race
// re-reads; the row may be gone already, which is the aim), and answers the refusal a join of a
// fenced lifecycle gets. A retirement's teardown fences the ACL row before it reads the
// lifecycleMemberships inventory, so a join that committed its row after that read removes the
// row itself: the inventory, and so the teardown, may never see it.
func (r *Responders) removeFenced(ctx context.Context, channel string, lc plane3.Lifecycle) error {
	key, err := r.memberKey(channel, lc)
	if err != nil {
		return err
	}
	for range casAttempts {
		// The raw entry, not store.read: a row that does not decode is removed too.
		e, err := r.members.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return refusal(fmt.Sprintf("%s: the read ACL of %s.%s is fenced (it reads nothing: the lifecycle is retiring); it keeps no membership on %q",
				OpDurableJoin, lc.Principal(), lc.UID, channel))
		}
		if err != nil {
			return fmt.Errorf("read member row %s: %w", key, err)
		}
		if !r.mayAct() {
			return ErrQuiesced
		}
		err = r.members.kv.Purge(ctx, key, jetstream.LastRevision(e.Revision()))
		switch {
		case err == nil:
			r.log.Info("durableJoin: removed the membership row of a fenced lifecycle", "key", key)
		case !wrongLastSeq(err):
			return fmt.Errorf("remove member row %s: %w", key, err)
		}
		// Re-read: gone now, unless a concurrent join wrote the row again.
	}
	return fmt.Errorf("members CAS exhausted retries removing %s", key)
}

// wrongLastSeq reports whether err is a lost revision condition: "wrong last sequence", 10071,
// or 10164 from a replicated stream.
func wrongLastSeq(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func (r *Responders) durableJoin(ctx context.Context, c Caller, args map[string]json.RawMessage) Reply {
	channel, err := channelArg(OpDurableJoin, args)
	if err != nil {
		return refuse("%v", err)
	}
	lc, acl, err := r.liveLifecycle(ctx, c)
	if err != nil {
		return r.failed(OpDurableJoin, c, err)
	}
	if len(acl.AllowSubscribe) == 0 {
		// A fenced lifecycle (its teardown has begun) joins nothing and keeps no row.
		return r.failed(OpDurableJoin, c, r.removeFenced(ctx, channel, lc))
	}
	if !acl.Allows(channel) {
		return refuse("channel %q is not within your read ACL", channel)
	}
	res, err := r.join(ctx, channel, lc)
	if err != nil {
		return r.failed(OpDurableJoin, c, err)
	}
	return okReply(res)
}

// join is upstream's durableJoinFor for one lifecycle.
func (r *Responders) join(ctx context.Context, channel string, lc plane3.Lifecycle) (JoinResult, error) {
	key, err := r.memberKey(channel, lc)
	if err != nil {
		return JoinResult{}, err
	}
	if !r.mayAct() {
		return JoinResult{}, ErrQuiesced
	}
	cur, err := r.members.read(ctx, key)
	if err != nil {
		return JoinResult{}, err
	}
	open := cur != nil && cur.m.State == StateActive && cur.m.LeaveCursor == nil
	if open && cur.m.Activated {
		return JoinResult{Durable: true, Generation: cur.m.Generation, LifecycleUID: lc.UID}, nil
	}
	// A new join (no row, or a tombstone to supersede) takes the CHAT frontier and the next
	// generation; a retry of an incomplete activation re-runs catch-up over the same window.
	var joinCursor, generation uint64
	if open {
		joinCursor, generation = cur.m.JoinCursor, cur.m.Generation
	} else {
		if joinCursor, err = r.frontier(ctx); err != nil {
			return JoinResult{}, err
		}
		generation = 1
		if cur != nil {
			generation = cur.m.Generation + 1
		}
		// Committed activated:false: it routes in-interval at once, so nothing published during
		// the catch-up is lost; activated reports completeness only.
		base := plane3.Member{Channel: channel, Owner: lc.Principal(), LifecycleUID: lc.UID, State: StateActive,
			JoinCursor: joinCursor, Generation: generation, WriterIdentity: r.cfg.WriterIdentity}
		if r.beforeCommit != nil {
			r.beforeCommit()
		}
		if err := r.members.commit(ctx, key, base); err != nil {
			return JoinResult{}, err
		}
	}
	if r.afterCommit != nil {
		r.afterCommit()
	}
	// Read the ACL row again now that the row is committed: a teardown that fenced it and read
	// the inventory between this join's first ACL read and its commit did not see the row, so
	// the join removes it itself.
	if f, err := r.fenced(ctx, lc); err != nil || f {
		if err != nil {
			return JoinResult{}, err
		}
		return JoinResult{}, r.removeFenced(ctx, channel, lc)
	}
	res := JoinResult{Generation: generation, LifecycleUID: lc.UID}
	front, err := r.frontier(ctx)
	if err != nil {
		return JoinResult{}, err
	}
	fence := max(front, r.fanoutDelivered(ctx))
	evicted, err := r.catchUp(ctx, channel, lc, joinCursor, fence, generation)
	if err != nil {
		return JoinResult{}, err
	}
	if evicted {
		// This join can never be a complete backstop: close it at the fence so it stops routing,
		// unless a newer rejoin already won (then that one is the live row).
		if _, err := r.members.tombstone(ctx, key, fence, generation, r.cfg.WriterIdentity); err != nil && !errors.Is(err, ErrStale) {
			return JoinResult{}, err
		}
		res.Reason = ReasonEvicted
		return res, nil
	}
	ok, err := r.members.activate(ctx, key, generation, joinCursor)
	if err != nil {
		return JoinResult{}, err
	}
	if !ok {
		res.Reason = ReasonSuperseded
		return res, nil
	}
	res.Durable = true
	return res, nil
}

func (r *Responders) durableLeave(ctx context.Context, c Caller, args map[string]json.RawMessage) Reply {
	channel, err := channelArg(OpDurableLeave, args)
	if err != nil {
		return refuse("%v", err)
	}
	generation, err := argUint(args, "generation")
	if err != nil {
		return refuse("durableLeave: %v (fail-closed stale-leave guard)", err)
	}
	uid, err := uidArg(OpDurableLeave, args)
	if err != nil {
		return refuse("%v", err)
	}
	lc := plane3.Lifecycle{Owner: c.Owner, Actor: c.Actor, UID: uid}
	key, err := r.memberKey(channel, lc)
	if err != nil {
		return r.failed(OpDurableLeave, c, err)
	}
	// No ACL check: a leave follows a narrowed or revoked ACL, and must still close the row.
	leaveCursor, err := r.frontier(ctx)
	if err != nil {
		return r.failed(OpDurableLeave, c, err)
	}
	m, err := r.members.tombstone(ctx, key, leaveCursor, generation, r.cfg.WriterIdentity)
	if err != nil {
		return r.failed(OpDurableLeave, c, err)
	}
	if m == nil {
		return okReply(LeaveResult{Channel: channel, AlreadyLeft: true})
	}
	return okReply(LeaveResult{Channel: channel})
}

func (r *Responders) listMemberships(ctx context.Context, c Caller, args map[string]json.RawMessage) Reply {
	uid, err := uidArg(OpListMemberships, args)
	if err != nil {
		return refuse("%v", err)
	}
	// The bucket's last revision now is the index's barrier: a row written before this request
	// (by this daemon's join or leave, or another writer) is listed.
	last, err := r.membersLastSeq(ctx)
	if err != nil {
		return r.failed(OpListMemberships, c, err)
	}
	ms, err := r.idx.list(ctx, plane3.Lifecycle{Owner: c.Owner, Actor: c.Actor, UID: uid}, last)
	if err != nil {
		return r.failed(OpListMemberships, c, err)
	}
	return okReply(map[string]any{"memberships": ms})
}

// membersLastSeq is the members bucket's last revision now: the barrier the index must reach
// before a read of it is as fresh as a direct read of the bucket.
func (r *Responders) membersLastSeq(ctx context.Context) (uint64, error) {
	st, err := r.members.kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the members bucket's state: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return 0, fmt.Errorf("members bucket status is a %T", st)
	}
	return bs.StreamInfo().State.LastSeq, nil
}

// refusal is an error whose text is meant for the caller.
type refusal string

func (e refusal) Error() string { return string(e) }

// failed is the reply to an op that failed: a refusal or a stale write is told to the caller as
// it is; anything else (a broker or bucket failure) is logged and answered with a short reason,
// so internal detail stays in the log (STYLE 11).
func (r *Responders) failed(op string, c Caller, err error) Reply {
	var ref refusal
	switch {
	case errors.As(err, &ref):
		return refuse("%v", err)
	case errors.Is(err, ErrStale):
		return refuse("%s: %v", op, err)
	case errors.Is(err, ErrQuiesced):
		return refuse("%s: quiesced", op) // never sent: the fence stops the reply
	default:
		r.log.Warn("control op failed", "op", op, "principal", c.Principal(), "err", err)
		return refuse("%s: internal error, retry (the daemon logged the cause)", op)
	}
}

// frontier is CHAT's last sequence.
func (r *Responders) frontier(ctx context.Context) (uint64, error) {
	info, err := r.chat.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the CHAT frontier: %w", err)
	}
	return info.State.LastSeq, nil
}

// fanoutDelivered is the fanout consumer's delivered stream sequence, 0 without one: the fence's
// other bound (the shared fan-out cursor moves independently of the frontier).
func (r *Responders) fanoutDelivered(ctx context.Context) uint64 {
	c, err := r.js.Consumer(ctx, r.cfg.Names.ChatStream(), r.cfg.Names.FanoutConsumer())
	if err != nil {
		return 0
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0
	}
	return info.Delivered.Stream
}

// catchUp copies the channel's chat messages in (from, to] into the lifecycle's inbox as
// durable-channel entries of generation, exactly as the fan-out writer would have (same entry,
// same Nats-Msg-Id, so a racing fan-out copy collapses with it). It skips what the fan-out writer
// drops and the member's own posts. It reports whether retention evicted part of the window.
func (r *Responders) catchUp(ctx context.Context, channel string, lc plane3.Lifecycle, from, to, generation uint64) (bool, error) {
	mu := r.stripe(lc)
	mu.Lock()
	defer mu.Unlock()
	if to <= from {
		return false, nil
	}
	n := r.cfg.Names
	filter, err := n.ChatRead(channel)
	if err != nil {
		return false, err
	}
	name, err := n.CatchupConsumer(lc.Owner, lc.Actor, lc.UID, generation)
	if err != nil {
		return false, err
	}
	if evicted, err := r.evicted(ctx, filter, name, from); err != nil || evicted {
		return evicted, err
	}
	_ = r.js.DeleteConsumer(ctx, n.ChatStream(), name)
	cons, err := r.js.CreateConsumer(ctx, n.ChatStream(), jetstream.ConsumerConfig{
		Name: name, FilterSubject: filter, AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		InactiveThreshold: catchupInactive, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from + 1,
	})
	if err != nil {
		return false, fmt.Errorf("create %s on %s: %w", name, n.ChatStream(), err)
	}
	defer func() { _ = r.js.DeleteConsumer(context.WithoutCancel(ctx), n.ChatStream(), name) }()
	dinbox, err := n.Dinbox(lc.Owner, lc.Actor, lc.UID)
	if err != nil {
		return false, err
	}
	for done := false; !done; {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return false, fmt.Errorf("catch-up fetch: %w", err)
		}
		var acks []jetstream.PubAckFuture
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return false, err
			}
			seq := md.Sequence.Stream
			if seq > to {
				done = true
				break
			}
			out, ok := r.entry(m, channel, lc, seq, generation, dinbox)
			if !ok {
				continue
			}
			if !r.mayAct() {
				return false, ErrQuiesced
			}
			f, err := r.js.PublishMsgAsync(out)
			if err != nil {
				return false, fmt.Errorf("catch-up publish: %w", err)
			}
			acks = append(acks, f)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, jetstream.ErrNoMessages) {
			return false, fmt.Errorf("catch-up fetch: %w", err)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return false, fmt.Errorf("catch-up publish %s: %w", f.Msg().Subject, err)
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		if got == 0 {
			done = true
		}
	}
	// Eviction removes a subject's oldest first, so a window intact after the copy was intact
	// during it.
	return r.evicted(ctx, filter, name, from)
}

// entry is the inbox copy of one chat message, or false for one the fan-out writer drops.
func (r *Responders) entry(m jetstream.Msg, channel string, lc plane3.Lifecycle, seq, generation uint64, dinbox string) (*nats.Msg, bool) {
	owner, actor, ch, ok := plane3.ParseChat(r.cfg.Names, m.Subject())
	if !ok || ch != channel {
		return nil, false
	}
	msg, err := plane3.DecodeMessage(m.Data())
	sender := owner + "." + actor
	if err != nil || msg.From != sender || sender == lc.Principal() {
		return nil, false
	}
	body, err := msg.Normalised(channel)
	if err != nil {
		return nil, false
	}
	b, err := json.Marshal(plane3.Entry{Msg: body, Channel: channel, Seq: seq, Reason: plane3.ReasonDurable, Generation: generation})
	if err != nil {
		return nil, false
	}
	out := nats.NewMsg(dinbox)
	out.Data = b
	if id := plane3.MsgID(msg.ID, lc, generation); id != "" {
		out.Header.Set(jetstream.MsgIDHeader, id)
	}
	return out, true
}

// evicted reports whether retention removed a message of the channel after seq from: a subject
// at its per-subject cap whose oldest retained message is after from has dropped messages that
// may lie in the window (judged per subject, as upstream's channelDropped, so other channels'
// traffic does not count); with stream-wide limits, a first sequence past from+1 counts too.
func (r *Responders) evicted(ctx context.Context, filter, name string, from uint64) (bool, error) {
	info, err := r.chat.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return false, fmt.Errorf("read CHAT state: %w", err)
	}
	cfg, st := info.Config, info.State
	if (cfg.MaxMsgs > 0 || cfg.MaxBytes > 0 || cfg.MaxAge > 0) && st.FirstSeq > from+1 {
		return true, nil
	}
	if cfg.MaxMsgsPerSubject <= 0 {
		return false, nil
	}
	for subj, count := range st.Subjects {
		if count < uint64(cfg.MaxMsgsPerSubject) {
			continue
		}
		oldest, err := r.oldest(ctx, subj, name+"_p")
		if err != nil {
			return false, err
		}
		if oldest > from {
			return true, nil
		}
	}
	return false, nil
}

// oldest is the sequence of subject's oldest retained message (0 when it has none), read through
// a short-lived consumer: the delivery credential may create consumers on CHAT but not get
// messages from it.
func (r *Responders) oldest(ctx context.Context, subject, name string) (uint64, error) {
	stream := r.cfg.Names.ChatStream()
	_ = r.js.DeleteConsumer(ctx, stream, name)
	c, err := r.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Name: name, FilterSubject: subject, AckPolicy: jetstream.AckNonePolicy, MemoryStorage: true,
		InactiveThreshold: catchupInactive, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return 0, fmt.Errorf("create %s on %s: %w", name, stream, err)
	}
	defer func() { _ = r.js.DeleteConsumer(context.WithoutCancel(ctx), stream, name) }()
	b, err := c.FetchNoWait(1)
	if err != nil {
		return 0, err
	}
	m, ok := <-b.Messages()
	if !ok {
		return 0, nil
	}
	md, err := m.Metadata()
	if err != nil {
		return 0, err
	}
	return md.Sequence.Stream, nil
}
