package profiles

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
)

// mxFuzzValues are the raw values a fuzz case draws its parameters from.
type mxFuzzValues struct {
	owner, actor, uid, role, ch1, ch2, ch3, capw, nonce string
	// ep is the service endpoint, drawn from the ch3 value (no profile takes both a channel
	// list and an endpoint).
	ep string
}

// params builds Params holding exactly the fields in include.
func (v mxFuzzValues) params(include field) Params {
	var p Params
	if include&fOwner != 0 {
		p.Owner = v.owner
	}
	if include&fActor != 0 {
		p.Actor = v.actor
	}
	if include&fUID != 0 {
		p.LifecycleUID = v.uid
	}
	if include&fRole != 0 {
		p.Role = v.role
	}
	if include&fSubscribe != 0 {
		p.Subscribe = []string{v.ch1}
	}
	if include&fAllowSubscribe != 0 {
		p.AllowSubscribe = []string{v.ch1, v.ch2}
	}
	if include&fAllowPublish != 0 {
		p.AllowPublish = []string{v.ch2, v.ch3}
	}
	if include&fCapabilities != 0 {
		p.Capabilities = []string{v.capw}
	}
	if include&fInboxNonce != 0 {
		p.InboxNonce = v.nonce
	}
	if include&fTarget != 0 {
		// The target's owner is the caller's (the only target Build accepts); its actor is
		// drawn from the role value, its uid from the uid value.
		p.Target = &RetirementTarget{Owner: v.owner, Actor: v.role, LifecycleUID: v.uid}
	}
	if include&fServiceEndpoint != 0 {
		p.ServiceEndpoint = v.ep
	}
	if include&fInstanceID != 0 {
		p.InstanceID = v.uid
	}
	if include&fMemberChannels != 0 {
		p.MemberChannels = []string{v.ch2, v.ch3}
	}
	return p
}

// canonical replaces every caller value with a fixed valid one, keeping which channels are equal
// to which and where a channel pattern's wildcard tokens are, so its build has the shape the
// profile and the caller's patterns give those fields.
func (v mxFuzzValues) canonical() mxFuzzValues {
	ch := map[string]string{}
	for _, c := range []string{v.ch1, v.ch2, v.ch3} {
		if _, ok := ch[c]; !ok {
			toks := strings.Split(c, ".")
			for i, t := range toks {
				if t != "*" && t != ">" {
					toks[i] = fmt.Sprintf("c%d", len(ch))
				}
			}
			ch[c] = strings.Join(toks, ".")
		}
	}
	// An empty value is an unset field (params skips it), so it stays empty.
	keep := func(v, fixed string) string {
		if v == "" {
			return ""
		}
		return fixed
	}
	actor := keep(v.actor, "act")
	if strings.HasPrefix(v.actor, "manager_serve_") {
		actor = "manager_serve_" + strings.Repeat("i", 26) // the one actor shape a retirement requester takes
	}
	owner := keep(v.owner, "own")
	if space.ValidateDerivedOwner(v.owner) == nil {
		owner = "u_" + strings.Repeat("o", 26) // the owner shape service-serve takes
	}
	// An endpoint accepted by the grammar has no wildcard, and its token is one subject token,
	// so any valid endpoint has the shape of the fuzzed one.
	return mxFuzzValues{
		owner: owner, actor: actor, uid: keep(v.uid, strings.Repeat("u", 26)), role: keep(v.role, "role"),
		ch1: ch[v.ch1], ch2: ch[v.ch2], ch3: ch[v.ch3], capw: v.capw, nonce: mxFuzzNonce(owner, "act", v.nonce),
		ep: keep(v.ep, "ep"),
	}
}

// mxFuzzNonce is the canonical nonce: none when none was fuzzed, else one bound to the canonical
// principal, as an accepted fuzzed nonce is bound to the fuzzed one.
func mxFuzzNonce(owner, actor, fuzzed string) string {
	if fuzzed == "" {
		return ""
	}
	if owner == "" {
		// Only a profile with a fixed principal (auth-plane's local.authd) accepts a nonce
		// without an Owner parameter: it is bound to that principal.
		owner, actor = AuthPlaneOwner, AuthPlaneActor
	}
	n, err := space.BoundInboxNonce(owner, actor, "nonce_00")
	if err != nil {
		panic(err)
	}
	return n
}

// mxCheckRow fails unless the permission row s is non-empty printable-ASCII tokens with '*' and
// '>' only as whole tokens and '>' only last; with queueOK (a subscribe list) it also takes the
// "<subject> <queue>" form, whose queue must be one printable token without wildcards.
func mxCheckRow(t *testing.T, s string, queueOK bool) {
	t.Helper()
	if subj, queue, ok := strings.Cut(s, " "); ok && queueOK {
		if queue == "" || strings.ContainsAny(queue, " *>.") {
			t.Fatalf("row %q has a malformed queue %q", s, queue)
		}
		s = subj
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f {
			t.Fatalf("subject %q has byte %q", s, c)
		}
	}
	toks := strings.Split(s, ".")
	for i, tok := range toks {
		if tok == "" {
			t.Fatalf("subject %q has an empty token", s)
		}
		if tok == ">" && i != len(toks)-1 {
			t.Fatalf("subject %q has '>' before the end", s)
		}
		if tok != "*" && tok != ">" && strings.ContainsAny(tok, "*>") {
			t.Fatalf("subject %q has a partial wildcard %q", s, tok)
		}
	}
}

// mxShapes is the sorted multiset of wildcard positions of a list: for each subject, the
// indexes of its '*' tokens and whether it ends in '>'.
func mxShapes(list []string) []string {
	out := make([]string, 0, len(list))
	for _, s := range list {
		var sb strings.Builder
		toks := strings.Split(s, ".")
		for i, tok := range toks {
			if tok == "*" {
				fmt.Fprintf(&sb, "%d*,", i)
			}
		}
		if toks[len(toks)-1] == ">" {
			sb.WriteString(">")
		}
		out = append(out, sb.String())
	}
	sort.Strings(out)
	return out
}

// FuzzBuild shows that no parameters produce a malformed subject or a wildcard in a place neither
// the profile nor a channel pattern put one: every accepted build has exactly the wildcard shape of
// the same build with fixed, known-good values (each channel's literal tokens replaced, its
// wildcard tokens kept), and yields claims that validate.
func FuzzBuild(f *testing.F) {
	good := mxFuzzValues{"local", "bob", mxUID, "review", "general", "team.backend", "general", CapSpawn, "", "general"}
	for i := range All() {
		f.Add("demo space", uint8(i), uint16(0), uint16(0), good.owner, good.actor, good.uid, good.role, good.ch1, good.ch2, good.ch3, good.capw, good.nonce)
	}
	f.Add("x", uint8(1), uint16(0), uint16(0), "a.b", "*", ">", "r.>", "team.>", "*", "a..b", "root", ">>>>>>>>")
	f.Add("demo space", uint8(0), uint16(0), uint16(0), "local", "bob", mxUID, "review", "team.*", "team.>", ">", CapSpawn, "")
	f.Add("\U0001F600", uint8(1), uint16(0), uint16(0xffff), "u_abcdefghijklmnopqrstuvwxyz", "A_1", strings.Repeat("9", 32), "r-1", "a-b.c_d", "a-b.c_d", "z", CapAdmin, "nonce-nonce")
	f.Add("s", uint8(3), uint16(fInboxNonce), uint16(fRole), "o", "a", mxUID, "r", "c", "c", "c", "run", "nonce_12")
	bound, err := space.BoundInboxNonce("o", "a", "nonce_12")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("s", uint8(0), uint16(0), uint16(0), "o", "a", mxUID, "r", "c", "c", "c", "run", bound)
	f.Add("s", uint8(slices.Index(All(), RetirementRequester)), uint16(0), uint16(0), "o", "manager_serve_"+mxIID, mxUID, "bob", "c", "c", "c", "run", "")
	f.Add("s", uint8(slices.Index(All(), ServiceServe)), uint16(0), uint16(0), "u_abcdefghijklmnopqrstuvwxyz", "", mxSvcIID, "", "c", "c", mxEndpoint, "", "")
	f.Add("s", uint8(slices.Index(All(), ServiceServe)), uint16(0), uint16(fActor|fInboxNonce), "u_abcdefghijklmnopqrstuvwxyz", "svc_x", mxSvcIID, "", "c", "c", "a.*", "", "n")
	k := mxKeys(f)
	f.Fuzz(func(t *testing.T, spaceName string, pidx uint8, drop, extra uint16,
		owner, actor, uid, role, ch1, ch2, ch3, capw, nonce string) {
		all := All()
		name := all[int(pidx)%len(all)]
		r := matrix[name]
		include := (r.accepts &^ field(drop)) | (field(extra) &^ r.accepts)
		v := mxFuzzValues{owner, actor, uid, role, ch1, ch2, ch3, capw, nonce, ch3}
		s, err := Build(spaceName, name, v.params(include))
		if err != nil {
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Profile != name || pe.Field == "" {
				t.Fatalf("refusal is not a *ParamError naming the field: %v", err)
			}
			return
		}
		lists := [][]string{s.Pub.Allow, s.Pub.Deny, s.Sub.Allow, s.Sub.Deny}
		for i, l := range lists {
			for _, subj := range l {
				mxCheckRow(t, subj, i == 2)
			}
		}
		c, err := Build("space", name, v.canonical().params(include))
		if err != nil {
			t.Fatalf("canonical build refused where the fuzzed one was accepted: %v", err)
		}
		for i, cl := range [][]string{c.Pub.Allow, c.Pub.Deny, c.Sub.Allow, c.Sub.Deny} {
			if got, want := mxShapes(lists[i]), mxShapes(cl); !reflect.DeepEqual(got, want) {
				t.Fatalf("list %d wildcard shape differs from the profile's own:\n got %v\nwant %v\nsubjects %v", i, got, want, lists[i])
			}
		}
		ttl, err := name.Lifetime().TTL(0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claims(k.userPub, k.acPub, mxNow, ttl); err != nil {
			t.Fatalf("Claims refused an accepted spec: %v", err)
		}
	})
}
