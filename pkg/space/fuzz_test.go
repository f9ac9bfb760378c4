package space

import (
	"strings"
	"testing"
)

// checkShape fails unless s is made of non-empty printable-ASCII tokens, with '*' exactly at the
// token indexes in stars, '>' exactly as the last token when gtLast, and no wildcard elsewhere.
func checkShape(t *testing.T, what, s string, stars []int, gtLast bool) {
	t.Helper()
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			t.Fatalf("%s: %q has byte %q", what, s, c)
		}
	}
	toks := strings.Split(s, ".")
	isStar := map[int]bool{}
	for _, i := range stars {
		isStar[i] = true
	}
	for i, tok := range toks {
		switch {
		case isStar[i]:
			if tok != "*" {
				t.Fatalf("%s: %q token %d = %q, want *", what, s, i, tok)
			}
		case gtLast && i == len(toks)-1:
			if tok != ">" {
				t.Fatalf("%s: %q last token = %q, want >", what, s, tok)
			}
		default:
			if tok == "" || strings.ContainsAny(tok, "*>") {
				t.Fatalf("%s: %q token %d = %q is empty or has a wildcard", what, s, i, tok)
			}
		}
	}
}

// FuzzNames proves that for any inputs every builder either refuses or returns a name whose only
// wildcards are the ones its doc comment promises.
func FuzzNames(f *testing.F) {
	f.Add("demo space", "local", "bob", tUID, "team.backend", "review", tNonce, uint64(1))
	f.Add("a", "*", ">", "", ".", "*", ">", uint64(0))
	f.Add("x\U0001F600y", "a.b", "a b", strings.Repeat("z", 33), "a..b", "a.b", "n n n n n", uint64(99))
	f.Add("s", "o", "a", tUID, "epgate.*.*", "r", tNonce, uint64(2))
	f.Add("\u00a0s", "u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "A", "0123456789abcdefghijklmnop", "c-1.d_2", "r-1", strings.Repeat("n", 120), uint64(1<<63))
	f.Fuzz(func(t *testing.T, spaceName, owner, actor, uid, channel, role, nonce string, gen uint64) {
		tok := Token(spaceName)
		if tok == "" || strings.Trim(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != "" {
			t.Fatalf("Token(%q) = %q", spaceName, tok)
		}
		if !strings.HasPrefix(Segment(spaceName), "space.") {
			t.Fatalf("Segment(%q) = %q", spaceName, Segment(spaceName))
		}
		n, err := NewNames(spaceName)
		if err != nil {
			return
		}
		concrete := func(what string, s string, err error) {
			t.Helper()
			if err == nil {
				checkShape(t, what, s, nil, false)
			}
		}
		pattern := func(what string, s string, err error, stars []int, gtLast bool) {
			t.Helper()
			if err == nil {
				checkShape(t, what, s, stars, gtLast)
			}
		}
		s, err := n.Chat(owner, actor, channel)
		concrete("Chat", s, err)
		s, err = n.Inst(owner, actor, actor, owner)
		concrete("Inst", s, err)
		s, err = n.Svc(role, owner, actor)
		concrete("Svc", s, err)
		s, err = n.CtlDelivery(owner, actor)
		concrete("CtlDelivery", s, err)
		s, err = n.CtlDeliveryReply(owner, actor, nonce)
		concrete("CtlDeliveryReply", s, err)
		s, err = n.CtlDeliveryAdmin(owner, actor)
		concrete("CtlDeliveryAdmin", s, err)
		s, err = n.CtlDeliveryAdminReply(owner, actor, nonce)
		concrete("CtlDeliveryAdminReply", s, err)
		s, err = n.Dinbox(owner, actor, uid)
		concrete("Dinbox", s, err)
		s, err = n.Dlv(owner, actor, uid)
		concrete("Dlv", s, err)
		s, err = n.LiveDelivery(owner, actor)
		concrete("LiveDelivery", s, err)
		s, err = n.LiveManager(owner, actor)
		concrete("LiveManager", s, err)
		for _, k := range append(BucketKinds(), BucketKind(role)) {
			s, err = n.KV(k, channel)
			concrete("KV", s, err)
			s, err = n.KVAll(k)
			pattern("KVAll", s, err, nil, true)
			// KVKeys keeps exactly the pattern's whole-token '*' wildcards (after $KV.<bucket>).
			var stars []int
			for i, tk := range strings.Split(channel, ".") {
				if tk == "*" {
					stars = append(stars, i+2)
				}
			}
			s, err = n.KVKeys(k, channel)
			pattern("KVKeys", s, err, stars, false)
			s, err = n.Bucket(k)
			concrete("Bucket", s, err)
		}
		for _, key := range []func() (string, error){
			func() (string, error) { return PrincipalKey(owner, actor) },
			func() (string, error) { return ACLKey(owner, actor, uid) },
			func() (string, error) { return MemberKey(channel, owner, actor, uid) },
			func() (string, error) { return ManagerLeaseKey(uid) },
		} {
			k, err := key()
			if err == nil {
				if err := ValidateKVKey(k); err != nil {
					t.Fatalf("key builder returned invalid key: %v", err)
				}
			}
		}

		s, err = n.ChatFrom(owner, actor)
		pattern("ChatFrom", s, err, nil, true)
		s, err = n.ChatRead(channel)
		pattern("ChatRead", s, err, []int{3, 4}, false)
		// The pattern builders give a valid filter, and equal the concrete ones on a channel.
		for _, b := range []struct {
			what     string
			grant    func() (string, error)
			concrete func() (string, error)
		}{
			{"ChatGrant", func() (string, error) { return n.ChatGrant(owner, actor, channel) }, func() (string, error) { return n.Chat(owner, actor, channel) }},
			{"ChatReadGrant", func() (string, error) { return n.ChatReadGrant(channel) }, func() (string, error) { return n.ChatRead(channel) }},
		} {
			g, gerr := b.grant()
			if gerr == nil {
				if err := ValidateFilter(g); err != nil {
					t.Fatalf("%s(%q) = %q, not a valid filter: %v", b.what, channel, g, err)
				}
			}
			if c, cerr := b.concrete(); cerr == nil && (gerr != nil || g != c) {
				t.Fatalf("%s(%q) = %q, %v; the concrete builder gave %q", b.what, channel, g, gerr, c)
			}
		}
		s, err = n.InstFrom(owner, actor)
		pattern("InstFrom", s, err, []int{3, 4}, false)
		s, err = n.InstTo(owner, actor)
		pattern("InstTo", s, err, nil, true)
		s, err = n.SvcFrom(owner, actor)
		pattern("SvcFrom", s, err, []int{3}, false)
		s, err = n.SvcServe(role)
		pattern("SvcServe", s, err, nil, true)
		s, err = n.CtlDeliveryTree(owner, actor)
		pattern("CtlDeliveryTree", s, err, nil, true)
		s, err = n.CtlDeliveryAdminTree(owner, actor)
		pattern("CtlDeliveryAdminTree", s, err, nil, true)
		pattern("ChatAll", n.ChatAll(), nil, nil, true)
		pattern("DinboxAny", n.DinboxAny(), nil, []int{3, 4, 5}, false)
		pattern("DlvAny", n.DlvAny(), nil, []int{3, 4, 5}, false)
		pattern("CtlDeliveryServe", n.CtlDeliveryServe(), nil, []int{4, 5}, false)
		pattern("CtlDeliveryReplyAny", n.CtlDeliveryReplyAny(), nil, []int{4, 5}, true)
		pattern("DeliveryLeaseAny", n.DeliveryLeaseAny(), nil, []int{3}, false)
		pattern("ManagerLeaseAny", n.ManagerLeaseAny(), nil, []int{3}, false)

		// Consumer and stream names are single JetStream tokens.
		for _, c := range []func() (string, error){
			func() (string, error) { return n.DlvConsumer(owner, actor, uid) },
			func() (string, error) { return n.DMConsumer(owner, actor, uid) },
			func() (string, error) { return n.ChatHistConsumer(owner, actor, uid) },
			func() (string, error) { return n.CatchupConsumer(owner, actor, uid, gen) },
			func() (string, error) { return n.SvcConsumer(role) },
			func() (string, error) { return n.BucketStream(BucketKind(role)) },
			func() (string, error) { return n.ChatStream(), nil },
		} {
			name, err := c()
			if err == nil {
				if err := validateJSName(KindConsumer, name); err != nil {
					t.Fatalf("consumer/stream builder returned invalid name: %v", err)
				}
			}
		}

		// JetStream API builders with hostile stream and consumer names.
		s, err = StreamInfo(owner)
		concrete("StreamInfo", s, err)
		s, err = ConsumerInfo(owner, actor)
		concrete("ConsumerInfo", s, err)
		s, err = ConsumerCreateAny(actor)
		pattern("ConsumerCreateAny", s, err, nil, true)
		s, err = ConsumerCreateNamed(owner, role)
		pattern("ConsumerCreateNamed", s, err, nil, true)
		s, err = Ack(owner, actor)
		pattern("Ack", s, err, nil, true)
		s, err = DirectGet(owner)
		concrete("DirectGet", s, err)
		s, err = DirectGetAny(role)
		pattern("DirectGetAny", s, err, nil, true)
		if read, err := n.ChatRead(channel); err == nil {
			s, err = ConsumerCreateFiltered(owner, actor, read)
			pattern("ConsumerCreateFiltered", s, err, []int{9, 10}, false)
		}
		s, err = InboxFilter(nonce)
		pattern("InboxFilter", s, err, nil, true)
	})
}
