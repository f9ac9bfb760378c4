package dlvclient_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/dlvclient"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

const (
	spaceName = "alpha"
	uid       = "abcdefghijklmnopqrstuvwxyz"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// env is a real signerd and broker with a provisioned space and o1.a1's dlv_ durable.
type env struct {
	s   *signerdtest.Signer
	url string
	n   space.Names
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{spaceName}})
	e := &env{s: s, url: s.StartBroker(t)}
	var err error
	if e.n, err = space.NewNames(spaceName); err != nil {
		t.Fatal(err)
	}
	if _, err := provision.Run(testCtx(t), provision.Config{Signer: e.signer(t, mtls.KindManagerd), Space: spaceName, NatsURL: e.url}); err != nil {
		t.Fatal(err)
	}
	pjs := e.js(t, mtls.KindManagerd, signerv1.Profile_PROFILE_PROVISIONER, nil)
	if err := provision.EnsureDlvDurable(testCtx(t), pjs, e.n, "o1", "a1", uid); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) signer(t *testing.T, kind string) *signerclient.Client {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: e.s.Addr, TLS: e.s.ClientFor(t, kind, spaceName)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// conn mints a credential of profile through signerd as caller kind and connects with it.
func (e *env) conn(t *testing.T, kind string, p signerv1.Profile, params *signerv1.ProfileParams) *nats.Conn {
	t.Helper()
	rail, err := signerclient.NewRail(signerclient.RailConfig{Client: e.signer(t, kind), Space: spaceName, Profile: p, Params: params, NatsURL: e.url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rail.Close)
	if err := rail.Start(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.url, rail.NatsOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (e *env) js(t *testing.T, kind string, p signerv1.Profile, params *signerv1.ProfileParams) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(e.conn(t, kind, p, params))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func agentParams() *signerv1.ProfileParams {
	return &signerv1.ProfileParams{Owner: "o1", Actor: "a1", LifecycleUid: uid,
		Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}, AllowPublish: []string{"general"}}
}

// publisher publishes to o1.a1's dlv subject as the delivery daemon does.
type publisher struct {
	t   *testing.T
	js  jetstream.JetStream
	dlv string
	n   int
}

func (e *env) publisher(t *testing.T) *publisher {
	t.Helper()
	dlv, err := e.n.Dlv("o1", "a1", uid)
	if err != nil {
		t.Fatal(err)
	}
	return &publisher{t: t, js: e.js(t, mtls.KindDeliveryd, signerv1.Profile_PROFILE_DELIVERY, nil), dlv: dlv}
}

// send stores one message with the given header value ("" for none) and body.
func (p *publisher) send(header, body string) {
	p.t.Helper()
	p.n++
	m := nats.NewMsg(p.dlv)
	if header != "" {
		m.Header.Set(dlvclient.FrameHeader, header)
	}
	m.Data = []byte(body)
	if _, err := p.js.PublishMsg(testCtx(p.t), m, jetstream.WithMsgID(fmt.Sprint("copy-", p.n))); err != nil {
		p.t.Fatalf("publish: %v", err)
	}
}

func frame(id, text string) string {
	return fmt.Sprintf(`{"version":1,"channel":"general","msg":{"id":%q,"from":{"id":"o2.a2"},"text":%q}}`, id, text)
}

// run starts the client and returns what the handler saw so far.
func run(t *testing.T, c *dlvclient.Client, h dlvclient.Handler) func() []dlvclient.Delivery {
	t.Helper()
	var mu sync.Mutex
	var got []dlvclient.Delivery
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(ctx context.Context, d dlvclient.Delivery) error {
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
			if h != nil {
				return h(ctx, d)
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return func() []dlvclient.Delivery {
		mu.Lock()
		defer mu.Unlock()
		return append([]dlvclient.Delivery(nil), got...)
	}
}

// settled waits until the durable has acked or terminated every stored message.
func settled(t *testing.T, js jetstream.JetStream, e *env, want uint64) {
	t.Helper()
	name, _ := e.n.DlvConsumer("o1", "a1", uid)
	c, err := js.Consumer(testCtx(t), e.n.DLVStream(), name)
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		ci, err := c.Info(testCtx(t))
		if err != nil {
			return err
		}
		if ci.AckFloor.Stream != want || ci.NumAckPending != 0 || ci.NumPending != 0 {
			return fmt.Errorf("ack floor %d pending %d/%d, want floor %d", ci.AckFloor.Stream, ci.NumAckPending, ci.NumPending, want)
		}
		return nil
	})
}

func ids(ds []dlvclient.Delivery) string {
	var out []string
	for _, d := range ds {
		out = append(out, d.ID)
	}
	return strings.Join(out, ",")
}

// TestClientWithAgentCredential runs the client on an agent credential minted by signerd against
// frames published with the delivery daemon's credential.
func TestClientWithAgentCredential(t *testing.T) {
	e := newEnv(t)
	p := e.publisher(t)
	ajs := e.js(t, mtls.KindManagerd, signerv1.Profile_PROFILE_AGENT, agentParams())
	c, err := dlvclient.New(testCtx(t), ajs, dlvclient.Config{Space: spaceName, Owner: "o1", Actor: "a1", LifecycleUID: uid, NakDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	failOnce := map[string]bool{"m5": true}
	var mu sync.Mutex
	got := run(t, c, func(_ context.Context, d dlvclient.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if failOnce[d.ID] {
			delete(failOnce, d.ID)
			return errors.New("not now")
		}
		return nil
	})

	p.send("1", frame("m1", "one"))
	p.send("1", frame("m2", "two"))
	p.send("1", frame("m1", "one again"))                                   // ok/duplicate id: acked, not handed over
	p.send("", frame("m3", "no header"))                                    // fail/no header: terminated
	p.send("2", frame("m4", "wrong header"))                                // fail/header value: terminated
	p.send("1", `{"version":2,"channel":"general","msg":{"id":"m6"}}`)      // fail/version: terminated
	p.send("1", `{"version":1,"channel":"a b","msg":{"id":"m7"}}`)          // fail/channel: terminated
	p.send("1", `not json`)                                                 // fail/body: terminated
	p.send("1", frame("m5", "handler fails once"))                          // ok/nak then redelivered
	p.send("1", `{"version":1,"channel":"general","msg":{"text":"no id"}}`) // ok/no id: handed over
	settled(t, ajs, e, uint64(p.n))

	if want := "m1,m2,m5,,m5"; ids(got()) != want {
		t.Fatalf("handed over %q, want %q", ids(got()), want)
	}
	if n := c.Duplicates(); n != 1 {
		t.Fatalf("Duplicates() = %d, want 1 (m1 again)", n)
	}
	first := got()[0]
	if first.Channel != "general" || !strings.Contains(string(first.Msg), `"text":"one"`) || first.Seq != 1 {
		t.Fatalf("first delivery %+v", first)
	}
}

// TestClientBindsOnly shows the agent cannot make a durable that managerd did not provision: New
// names the missing durable, and the broker refuses the agent's create.
func TestClientBindsOnly(t *testing.T) {
	e := newEnv(t)
	ajs := e.js(t, mtls.KindManagerd, signerv1.Profile_PROFILE_AGENT,
		&signerv1.ProfileParams{Owner: "o1", Actor: "a2", LifecycleUid: uid, Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}})
	_, err := dlvclient.New(testCtx(t), ajs, dlvclient.Config{Space: spaceName, Owner: "o1", Actor: "a2", LifecycleUID: uid})
	if err == nil || !strings.Contains(err.Error(), "dlv_o1-a2-"+uid) {
		t.Fatalf("fail/unprovisioned durable: err = %v", err)
	}
	cfg, _ := provision.DlvDurable(e.n, "o1", "a2", uid)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := ajs.CreateConsumer(ctx, e.n.DLVStream(), cfg); err == nil {
		t.Fatal("fail/agent creates its dlv durable: the broker allowed it")
	}
	for _, bad := range []dlvclient.Config{
		{Space: spaceName, Owner: "o.1", Actor: "a1", LifecycleUID: uid},
		{Space: spaceName, Owner: "o1", Actor: "a1", LifecycleUID: "short"},
		{Space: spaceName, Owner: "o1", Actor: "a1", LifecycleUID: uid, DedupSize: -1},
	} {
		if _, err := dlvclient.New(testCtx(t), ajs, bad); err == nil {
			t.Fatalf("fail/bad config %+v: no error", bad)
		}
	}
}

// sendGap stores a gap marker with the frame header, the given Cotal-Delivery-Gap values and body.
func (p *publisher) sendGap(body string, gap ...string) {
	p.t.Helper()
	p.n++
	m := nats.NewMsg(p.dlv)
	m.Header.Set(dlvclient.FrameHeader, dlvclient.FrameHeaderValue)
	for _, g := range gap {
		m.Header.Add(dlvclient.GapHeader, g)
	}
	m.Data = []byte(body)
	if _, err := p.js.PublishMsg(testCtx(p.t), m, jetstream.WithMsgID(fmt.Sprint("copy-", p.n))); err != nil {
		p.t.Fatalf("publish: %v", err)
	}
}

// TestClientGapMarker: a gap marker the trusted reader publishes reaches OnGap as a typed Gap, in
// order between the frames around it; a malformed one is terminated, never handed over; with no
// OnGap the marker is acked after a warning; a client that predates the marker (DecodeFrame alone)
// refuses its body, so it terminates it.
func TestClientGapMarker(t *testing.T) {
	marker, header, err := dlvclient.EncodeGap(3)
	if err != nil || header != "3" || string(marker) != `{"version":1,"gap":3}` {
		t.Fatalf("EncodeGap(3) = %s, %q, %v", marker, header, err)
	}
	if _, _, err := dlvclient.DecodeFrame(marker); !errors.Is(err, dlvclient.ErrBadFrame) {
		t.Fatalf("fail/old client: the marker body decodes as a frame (%v)", err)
	}
	if _, _, err := dlvclient.EncodeGap(0); !errors.Is(err, dlvclient.ErrBadGap) {
		t.Fatalf("fail/zero count encoded: %v", err)
	}

	t.Run("ok/OnGap in order and fail/malformed markers terminated", func(t *testing.T) {
		e := newEnv(t)
		p := e.publisher(t)
		ajs := e.js(t, mtls.KindManagerd, signerv1.Profile_PROFILE_AGENT, agentParams())
		var mu sync.Mutex
		var events []string
		c, err := dlvclient.New(testCtx(t), ajs, dlvclient.Config{Space: spaceName, Owner: "o1", Actor: "a1", LifecycleUID: uid,
			OnGap: func(_ context.Context, g dlvclient.Gap) error {
				mu.Lock()
				defer mu.Unlock()
				events = append(events, fmt.Sprintf("gap %d@%d", g.Missing, g.Seq))
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		run(t, c, func(_ context.Context, d dlvclient.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, d.ID)
			return nil
		})
		p.send("1", frame("m1", "before"))
		p.sendGap(string(marker), header)                        // ok/the marker at seq 2
		p.sendGap(`{"version":1,"gap":3}`, "03")                 // fail/header not canonical
		p.sendGap(`{"version":1,"gap":4}`, "3")                  // fail/count disagrees with the header
		p.sendGap(`{"version":1,"gap":3,"missing":[1]}`, "3")    // fail/unknown field
		p.sendGap(`{"version":1,"gap":3}`, "3", "3")             // fail/two gap headers
		p.sendGap(frame("m9", "a frame with a gap header"), "1") // fail/a frame dressed as a marker
		p.send("1", frame("m2", "after"))
		settled(t, ajs, e, uint64(p.n))
		mu.Lock()
		defer mu.Unlock()
		if got, want := strings.Join(events, ","), "m1,gap 3@2,m2"; got != want {
			t.Fatalf("events %q, want %q", got, want)
		}
	})

	t.Run("ok/no OnGap acks the marker", func(t *testing.T) {
		e := newEnv(t)
		p := e.publisher(t)
		ajs := e.js(t, mtls.KindManagerd, signerv1.Profile_PROFILE_AGENT, agentParams())
		c, err := dlvclient.New(testCtx(t), ajs, dlvclient.Config{Space: spaceName, Owner: "o1", Actor: "a1", LifecycleUID: uid})
		if err != nil {
			t.Fatal(err)
		}
		got := run(t, c, nil)
		p.sendGap(string(marker), header)
		p.send("1", frame("m2", "after"))
		settled(t, ajs, e, uint64(p.n))
		if ids(got()) != "m2" {
			t.Fatalf("handed over %q, want m2 only", ids(got()))
		}
	})
}
