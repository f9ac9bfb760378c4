package provision_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const spaceName = "alpha"

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func names(t *testing.T) space.Names {
	t.Helper()
	n, err := space.NewNames(spaceName)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// provisionerJS connects to b with a provisioner credential minted from the profile matrix.
func provisionerJS(t *testing.T, b *testkit.Broker) jetstream.JetStream {
	t.Helper()
	tok, kp := b.Space(spaceName).MintUser(t, profiles.Provisioner, profiles.Params{}, 0)
	nc, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// watcher connects a test-only user of the data account that may do anything, signed here with
// the data signing key: it sees the account's JetStream advisories, which no profile may.
func watcher(t *testing.T, b *testkit.Broker) *nats.Conn {
	t.Helper()
	sp := b.Space(spaceName)
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	inbox, _ := space.InboxPrefix(pub)
	uc := jwt.NewUserClaims(pub)
	uc.IssuerAccount = sp.Trust.DataAccountPublicKey()
	uc.Expires = time.Now().Add(time.Hour).Unix()
	skp, err := sp.Signing.DataSigning.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer skp.Wipe()
	tok, err := uc.Encode(skp)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := b.Connect(t, tok, kp, nats.CustomInboxPrefix(inbox))
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// planNames lists Plan's item names in order.
func planNames(t *testing.T) []string {
	t.Helper()
	items, err := provision.Plan(names(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range items {
		out = append(out, it.Name)
	}
	return out
}

// TestRunWithSignerdCredential provisions a space through a provisioner credential minted by a
// real signerd, twice: the first run creates every stream and bucket with upstream's
// configuration and the durable default class, the second creates and writes nothing.
func TestRunWithSignerdCredential(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{spaceName}})
	url := s.StartBroker(t)
	signer, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, "managerd", spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { signer.Close() })
	cfg := provision.Config{Signer: signer, Space: spaceName, NatsURL: url}

	first, err := provision.Run(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("first run: %v", err)
	}
	if got, want := strings.Join(first.Created, ","), strings.Join(planNames(t), ","); got != want || len(first.Verified) != 0 {
		t.Fatalf("first run created %s (verified %v), want %s", got, first.Verified, want)
	}
	if !first.DefaultsWritten || first.DeliveryClass != provision.ClassDurable {
		t.Fatalf("first run defaults: written %v class %q", first.DefaultsWritten, first.DeliveryClass)
	}

	second, err := provision.Run(testCtx(t), cfg)
	if err != nil {
		t.Fatalf("second run: %v", err)
	}
	if len(second.Created) != 0 || second.DefaultsWritten || len(second.Verified) != len(planNames(t)) || second.DeliveryClass != provision.ClassDurable {
		t.Fatalf("second run: %+v", second)
	}

	t.Run("ok/the broker holds upstream's numbers", func(t *testing.T) {
		// Read back with the delivery daemon's own credential, which the streams are for.
		n := names(t)
		dc, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, "deliveryd", spaceName)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dc.Close() })
		rail, err := signerclient.NewRail(signerclient.RailConfig{Client: dc, Space: spaceName, Profile: signerv1.Profile_PROFILE_DELIVERY, NatsURL: url})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rail.Close)
		if err := rail.Start(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(url, rail.NatsOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		ctx := testCtx(t)
		for _, c := range []struct {
			stream string
			check  func(jetstream.StreamConfig) bool
		}{
			{n.InboxStream(), func(c jetstream.StreamConfig) bool {
				return c.Duplicates == 2*time.Hour && c.MaxMsgsPerSubject == 1000 && c.Discard == jetstream.DiscardOld
			}},
			{n.DLVStream(), func(c jetstream.StreamConfig) bool { return c.Duplicates == 2*time.Hour }},
			{n.ChatStream(), func(c jetstream.StreamConfig) bool { return c.AllowDirect && c.MaxMsgsPerSubject == 1000 }},
			{"KV_cotal_delivery_alpha", func(c jetstream.StreamConfig) bool { return c.MaxAge == 30*time.Second }},
		} {
			st, err := js.Stream(ctx, c.stream)
			if err != nil {
				t.Fatalf("%s: %v", c.stream, err)
			}
			if !c.check(st.CachedInfo().Config) {
				t.Fatalf("%s config %+v", c.stream, st.CachedInfo().Config)
			}
		}
		kv, err := js.KeyValue(ctx, "cotal_channels_alpha")
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, space.ChannelDefaultsKey)
		if err != nil || string(e.Value()) != `{"deliveryClass":"durable"}` {
			t.Fatalf("defaults entry: %v %v", e, err)
		}
	})
}

// TestEnsureSecondRunChangesNothing proves the second run sends no create, update or KV write:
// the account's stream advisories and the channels, records and auth buckets' subjects, watched
// from before the first run, show nothing between the second run and a sentinel the watcher makes after it.
func TestEnsureSecondRunChangesNothing(t *testing.T) {
	b := testkit.StartBroker(t, spaceName)
	n := names(t)
	w := watcher(t, b)
	var mu sync.Mutex
	var seen []string
	record := func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, m.Subject)
	}
	for _, subj := range []string{"$JS.EVENT.ADVISORY.STREAM.>", "$KV.cotal_channels_alpha.>", "$KV.cotal_records_alpha.>", "$KV.cotal_auth_alpha.>"} {
		if _, err := w.Subscribe(subj, record); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	wjs, _ := jetstream.New(w)
	sentinel := func(name string) int {
		t.Helper()
		if _, err := wjs.CreateStream(testCtx(t), jetstream.StreamConfig{Name: name, Subjects: []string{"sentinel." + name}}); err != nil {
			t.Fatal(err)
		}
		var at int
		testkit.Eventually(t, 5*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			for i, s := range seen {
				if s == "$JS.EVENT.ADVISORY.STREAM.CREATED."+name {
					at = i
					return nil
				}
			}
			return fmt.Errorf("no advisory for %s yet", name)
		})
		return at
	}

	js := provisionerJS(t, b)
	if _, err := provision.Ensure(testCtx(t), js, n, provision.Options{}); err != nil {
		t.Fatal(err)
	}
	before := sentinel("SENTINEL1")
	mu.Lock()
	var created int
	for _, s := range seen[:before] {
		if strings.HasPrefix(s, "$JS.EVENT.ADVISORY.STREAM.CREATED.") {
			created++
		}
	}
	mu.Unlock()
	mu.Lock()
	recordsCreated := false
	for _, s := range seen[:before] {
		recordsCreated = recordsCreated || s == "$JS.EVENT.ADVISORY.STREAM.CREATED.KV_cotal_records_alpha"
	}
	mu.Unlock()
	if !recordsCreated {
		t.Fatalf("first run did not create the records bucket: %v", seen)
	}
	if created != len(planNames(t)) {
		t.Fatalf("first run: %d create advisories, want %d: %v", created, len(planNames(t)), seen)
	}

	rep, err := provision.Ensure(testCtx(t), js, n, provision.Options{})
	if err != nil {
		t.Fatal(err)
	}
	after := sentinel("SENTINEL2")
	mu.Lock()
	between := append([]string(nil), seen[before+1:after]...)
	mu.Unlock()
	if len(between) != 0 || len(rep.Created) != 0 || rep.DefaultsWritten {
		t.Fatalf("second run changed something: %v (report %+v)", between, rep)
	}
}

// TestEnsureRefusesAnotherConfig covers streams, buckets and the defaults entry that exist in a
// shape other than Plan's: each is reported, naming it and the differing fields, and left as it was.
func TestEnsureRefusesAnotherConfig(t *testing.T) {
	tests := []struct {
		name   string
		before func(t *testing.T, js jetstream.JetStream)
		check  func(t *testing.T, js jetstream.JetStream, rep *provision.Report, err error)
	}{
		{"fail/INBOX with the default dedup window",
			func(t *testing.T, js jetstream.JetStream) {
				mustCreate(t, js, jetstream.StreamConfig{Name: "INBOX_alpha", Subjects: []string{"cotal.alpha.dinbox.>"}, MaxMsgsPerSubject: 1000})
			},
			func(t *testing.T, js jetstream.JetStream, _ *provision.Report, err error) {
				wantMismatch(t, err, "INBOX_alpha", "duplicate_window")
				st, _ := js.Stream(testCtx(t), "INBOX_alpha")
				if d := st.CachedInfo().Config.Duplicates; d != 2*time.Minute {
					t.Fatalf("INBOX_alpha changed: dedup window %v", d)
				}
			}},
		{"fail/delivery bucket with a 60 s TTL",
			func(t *testing.T, js jetstream.JetStream) {
				if _, err := js.CreateKeyValue(testCtx(t), jetstream.KeyValueConfig{Bucket: "cotal_delivery_alpha", TTL: time.Minute}); err != nil {
					t.Fatal(err)
				}
			},
			func(t *testing.T, js jetstream.JetStream, _ *provision.Report, err error) {
				wantMismatch(t, err, "cotal_delivery_alpha", "max_age", "duplicate_window")
				if !strings.Contains(err.Error(), "max_age is 1m0s, want 30s") {
					t.Fatalf("error does not give both values: %v", err)
				}
			}},
		{"fail/CHAT capturing another subject",
			func(t *testing.T, js jetstream.JetStream) {
				c := planItem(t, "CHAT_alpha")
				c.Subjects = []string{"cotal.alpha.chat.*.*.general"}
				mustCreate(t, js, c)
			},
			func(t *testing.T, _ jetstream.JetStream, _ *provision.Report, err error) {
				wantMismatch(t, err, "CHAT_alpha", "subjects")
			}},
		{"fail/defaults entry that is not JSON",
			func(t *testing.T, js jetstream.JetStream) { putDefaults(t, js, "durable please") },
			func(t *testing.T, js jetstream.JetStream, _ *provision.Report, err error) {
				var de *provision.DefaultsError
				if !errors.As(err, &de) || de.Key != "=defaults" {
					t.Fatalf("err = %v, want a DefaultsError", err)
				}
				if got := getDefaults(t, js); got != "durable please" {
					t.Fatalf("defaults changed to %q", got)
				}
			}},
		{"fail/defaults entry with an unknown class",
			func(t *testing.T, js jetstream.JetStream) { putDefaults(t, js, `{"deliveryClass":"sometimes"}`) },
			func(t *testing.T, _ jetstream.JetStream, _ *provision.Report, err error) {
				var de *provision.DefaultsError
				if !errors.As(err, &de) {
					t.Fatalf("err = %v, want a DefaultsError", err)
				}
			}},
		{"ok/defaults entry naming live keeps it",
			func(t *testing.T, js jetstream.JetStream) { putDefaults(t, js, `{"deliveryClass":"live"}`) },
			func(t *testing.T, js jetstream.JetStream, rep *provision.Report, err error) {
				if err != nil || rep.DefaultsWritten || rep.DeliveryClass != provision.ClassLive {
					t.Fatalf("err %v report %+v", err, rep)
				}
				if got := getDefaults(t, js); got != `{"deliveryClass":"live"}` {
					t.Fatalf("defaults changed to %s", got)
				}
			}},
		{"ok/defaults entry without a class gets one and keeps the rest",
			func(t *testing.T, js jetstream.JetStream) { putDefaults(t, js, `{"replay":false}`) },
			func(t *testing.T, js jetstream.JetStream, rep *provision.Report, err error) {
				if err != nil || !rep.DefaultsWritten || rep.DeliveryClass != provision.ClassDurable {
					t.Fatalf("err %v report %+v", err, rep)
				}
				var d map[string]any
				if err := json.Unmarshal([]byte(getDefaults(t, js)), &d); err != nil || d["replay"] != false || d["deliveryClass"] != "durable" {
					t.Fatalf("defaults now %v (%v)", d, err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := testkit.StartBroker(t, spaceName)
			js := provisionerJS(t, b)
			tt.before(t, js)
			rep, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{})
			tt.check(t, js, rep, err)
		})
	}
}

// TestEnsureReplicaMismatch: a space made with one replica and ensured again with three is a
// mismatch naming num_replicas with both values, and the stream keeps its one replica.
func TestEnsureReplicaMismatch(t *testing.T) {
	b := testkit.StartBroker(t, spaceName)
	js := provisionerJS(t, b)
	if _, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	_, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{Replicas: 3})
	wantMismatch(t, err, "CHAT_alpha", "num_replicas")
	if !strings.Contains(err.Error(), "num_replicas is 1, want 3") {
		t.Fatalf("error does not give both counts: %v", err)
	}
	st, err := js.Stream(testCtx(t), "CHAT_alpha")
	if err != nil || st.CachedInfo().Config.Replicas != 1 {
		t.Fatalf("CHAT_alpha changed: %v", err)
	}
}

func TestEnsureRefusesBadInput(t *testing.T) {
	b := testkit.StartBroker(t, spaceName)
	js := provisionerJS(t, b)
	for _, r := range []int{-1, 6} {
		if _, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{Replicas: r}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("replicas %d", r)) {
			t.Fatalf("fail/replicas %d: err = %v", r, err)
		}
	}
	if _, err := js.Stream(testCtx(t), "CHAT_alpha"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("a refused replica count created CHAT_alpha (err %v)", err)
	}
	if _, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{DeliveryClass: "eventual"}); err == nil || !strings.Contains(err.Error(), `"eventual"`) {
		t.Fatalf("fail/unknown class: err = %v", err)
	}
	if _, err := provision.Ensure(testCtx(t), js, space.Names{}, provision.Options{}); !errors.Is(err, space.ErrZeroNames) {
		t.Fatalf("fail/zero names: err = %v", err)
	}
	if _, err := provision.Run(testCtx(t), provision.Config{Space: spaceName, Owner: "o"}); err == nil {
		t.Fatal("fail/owner without actor: no error")
	}
}

func mustCreate(t *testing.T, js jetstream.JetStream, c jetstream.StreamConfig) {
	t.Helper()
	if _, err := js.CreateStream(testCtx(t), c); err != nil {
		t.Fatalf("create %s: %v", c.Name, err)
	}
}

func planItem(t *testing.T, name string) jetstream.StreamConfig {
	t.Helper()
	items, err := provision.Plan(names(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Config.Name == name {
			return it.Config
		}
	}
	t.Fatalf("no plan item %s", name)
	return jetstream.StreamConfig{}
}

// putDefaults makes the channels bucket with Plan's config and writes the defaults entry.
func putDefaults(t *testing.T, js jetstream.JetStream, value string) {
	t.Helper()
	mustCreate(t, js, planItem(t, "KV_cotal_channels_alpha"))
	kv, err := js.KeyValue(testCtx(t), "cotal_channels_alpha")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(testCtx(t), space.ChannelDefaultsKey, []byte(value)); err != nil {
		t.Fatal(err)
	}
}

func getDefaults(t *testing.T, js jetstream.JetStream) string {
	t.Helper()
	kv, err := js.KeyValue(testCtx(t), "cotal_channels_alpha")
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(testCtx(t), space.ChannelDefaultsKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(e.Value())
}

func wantMismatch(t *testing.T, err error, name string, fields ...string) {
	t.Helper()
	var me *provision.MismatchError
	if !errors.As(err, &me) || !errors.Is(err, provision.ErrMismatch) {
		t.Fatalf("err = %v, want a MismatchError", err)
	}
	var got []string
	for _, f := range me.Fields {
		got = append(got, f.Field)
	}
	sort.Strings(got)
	sort.Strings(fields)
	if me.Name != name || strings.Join(got, ",") != strings.Join(fields, ",") {
		t.Fatalf("mismatch on %s fields %v, want %s fields %v", me.Name, got, name, fields)
	}
	if !strings.Contains(err.Error(), name) {
		t.Fatalf("error does not name %s: %v", name, err)
	}
}

// TestAuthBucketTakesPerKeyTTLs shows the auth bucket as provisioned carries what authd's plane
// claim needs although the bucket has no max_age: a key created with its own TTL expires on its
// own, and a key without one stays.
func TestAuthBucketTakesPerKeyTTLs(t *testing.T) {
	b := testkit.StartBroker(t, spaceName)
	if _, err := provision.Ensure(testCtx(t), provisionerJS(t, b), names(t), provision.Options{}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(watcher(t, b))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(testCtx(t), "cotal_auth_alpha")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(testCtx(t), "plane", []byte(`{"holder":"authd-1"}`), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatalf("create plane with a 1 s TTL: %v", err)
	}
	if _, err := kv.Put(testCtx(t), "gate.x", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := kv.Get(testCtx(t), "plane"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("plane still there: %v", err)
		}
		return nil
	})
	if _, err := kv.Get(testCtx(t), "gate.x"); err != nil {
		t.Fatalf("a key without a TTL expired too: %v", err)
	}
	if _, err := kv.Create(testCtx(t), "plane", []byte(`{"holder":"authd-2"}`), jetstream.KeyTTL(time.Minute)); err != nil {
		t.Fatalf("a successor cannot create plane after the expiry: %v", err)
	}
}

// TestStoreBuckets pins the two lifecycle-authority buckets Plan makes: the records store with
// limits retention, history one, no age, caps or TTLs, last in the plan; and the auth store with
// the configuration existing spaces were provisioned with (a change would refuse them).
func TestStoreBuckets(t *testing.T) {
	items, err := provision.Plan(names(t))
	if err != nil {
		t.Fatal(err)
	}
	kvStream := func(stream, bucket string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name: stream, Subjects: []string{"$KV." + bucket + ".>"},
			Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage,
			MaxConsumers: -1, MaxMsgs: -1, MaxBytes: -1, MaxMsgsPerSubject: 1, MaxMsgSize: -1,
			Discard: jetstream.DiscardNew, Replicas: 1, Duplicates: 2 * time.Minute,
			Compression: jetstream.NoCompression, AllowRollup: true, DenyDelete: true, AllowDirect: true,
		}
	}
	t.Run("ok/plan includes records with that config", func(t *testing.T) {
		last := items[len(items)-1]
		if last.Kind != provision.Bucket || last.Name != "cotal_records_alpha" {
			t.Fatalf("last item %s %s, want bucket cotal_records_alpha", last.Kind, last.Name)
		}
		want := kvStream("KV_cotal_records_alpha", "cotal_records_alpha")
		if d := provision.Compare(want, last.Config); len(d) != 0 {
			t.Fatalf("records config differs: %v", d)
		}
		c := last.Config
		if c.MaxAge != 0 || c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != 0 || c.MaxMsgsPerSubject != 1 || c.Retention != jetstream.LimitsPolicy || c.MaxBytes != -1 || c.MaxMsgs != -1 {
			t.Fatalf("records config %+v", c)
		}
	})
	t.Run("ok/auth bucket config unchanged", func(t *testing.T) {
		want := kvStream("KV_cotal_auth_alpha", "cotal_auth_alpha")
		want.AllowMsgTTL = true
		want.SubjectDeleteMarkerTTL = time.Hour
		if d := provision.Compare(want, planItem(t, "KV_cotal_auth_alpha")); len(d) != 0 {
			t.Fatalf("auth config differs: %v", d)
		}
	})
}

// TestEnsureAddsRecordsToAnExistingSpace provisions a space as it was before the records store
// (every item but cotal_records_<t>): a rerun creates only the records bucket, verifies every other
// item (the auth bucket among them) unchanged, and a third run creates nothing.
func TestEnsureAddsRecordsToAnExistingSpace(t *testing.T) {
	b := testkit.StartBroker(t, spaceName)
	js := provisionerJS(t, b)
	items, err := provision.Plan(names(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Name != "cotal_records_alpha" {
			mustCreate(t, js, it.Config)
		}
	}
	before, err := js.Stream(testCtx(t), "KV_cotal_auth_alpha")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rep.Created, ","); got != "cotal_records_alpha" || len(rep.Verified) != len(items)-1 {
		t.Fatalf("rerun created %q, verified %d of %d", got, len(rep.Verified), len(items)-1)
	}
	after, err := js.Stream(testCtx(t), "KV_cotal_auth_alpha")
	if err != nil {
		t.Fatal(err)
	}
	if d := provision.Compare(before.CachedInfo().Config, after.CachedInfo().Config); len(d) != 0 || !after.CachedInfo().Created.Equal(before.CachedInfo().Created) {
		t.Fatalf("auth bucket changed: %v", d)
	}
	rs, err := js.Stream(testCtx(t), "KV_cotal_records_alpha")
	if err != nil {
		t.Fatal(err)
	}
	if d := provision.Compare(items[len(items)-1].Config, rs.CachedInfo().Config); len(d) != 0 {
		t.Fatalf("records bucket as stored differs from Plan: %v", d)
	}
	third, err := provision.Ensure(testCtx(t), js, names(t), provision.Options{})
	if err != nil || len(third.Created) != 0 || len(third.Verified) != len(items) {
		t.Fatalf("third run: %+v %v", third, err)
	}
}
