package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/authclient"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
)

// The human whose bearer the demo gets: an IdP subject and the actor granted to it.
const (
	devSubject  = "dev-user"
	devActor    = "console"
	calloutText = "hello from the callout"
)

// devIdP is the dev stack's own IdP, in process on loopback: an Ed25519 key made at each start
// (in memory only, never written), its JWKS at /jwks, and tokens for devSubject. authd pins its
// URL once per state dir, so a second run listens on the pinned address again.
type devIdP struct {
	url  string
	srv  *http.Server
	priv ed25519.PrivateKey
	kid  string
}

func startIdP(addr string) (*devIdP, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	kid := make([]byte, 8)
	_, _ = rand.Read(kid)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dev IdP on %s (the address authd pinned): %w", addr, err)
	}
	i := &devIdP{url: "http://" + ln.Addr().String(), priv: priv, kid: base64.RawURLEncoding.EncodeToString(kid)}
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub), "kid": i.kid, "alg": "EdDSA", "use": "sig"}}})
	i.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jwks" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks)
	})}
	go func() { _ = i.srv.Serve(ln) }()
	return i, nil
}

func (i *devIdP) close() { _ = i.srv.Close() }

// token signs an IdP token for sub, valid ten minutes: issuer and audience the IdP's origin.
func (i *devIdP) token(sub string) string {
	now := time.Now()
	h, _ := json.Marshal(map[string]any{"alg": "EdDSA", "kid": i.kid, "typ": "JWT"})
	c, _ := json.Marshal(map[string]any{"iss": i.url, "aud": i.url, "sub": sub, "iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix()})
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(i.priv, []byte(in)))
}

// authdRun is what the bearer demo needs from a running authd.
type authdRun struct {
	url, cap, config string
	idp              *devIdP
}

// startAuthd starts the dev IdP on the address pinned earlier (or a free port, pinned now with
// `authd idp pin`), runs `authd serve` and waits until it is ready (pkg/daemon.Ready).
func (s *stack) startAuthd(ctx context.Context, addr, natsURL string) (*authdRun, error) {
	stateDir := filepath.Join(s.l.authd, "state")
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	idpAddr, pinned := "127.0.0.1:0", false
	if b, err := os.ReadFile(filepath.Join(stateDir, "idp.json")); err == nil {
		var pin struct {
			URL string `json:"url"`
		}
		if err := json.Unmarshal(b, &pin); err != nil {
			return nil, fmt.Errorf("%s: %v", filepath.Join(stateDir, "idp.json"), err)
		}
		pu, err := url.Parse(pin.URL)
		if err != nil || pu.Host == "" {
			return nil, fmt.Errorf("%s: url %q", filepath.Join(stateDir, "idp.json"), pin.URL)
		}
		idpAddr, pinned = pu.Host, true
	}
	idp, err := startIdP(idpAddr)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, idp.close)
	authd := filepath.Join(s.o.bin, "authd")
	if !pinned {
		if out, err := exec.CommandContext(ctx, authd, "idp", "pin", idp.url, "--state-dir", stateDir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("authd idp pin %s: %v: %s", idp.url, err, out)
		}
		fmt.Fprintf(s.out, "authd:     pinned the dev IdP %s (Ed25519 key in memory only)\n", idp.url)
	}

	f := s.l.clientFiles(mtls.KindAuthd, s.o.space)
	cfg := fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {address: %s, ca: %s, cert: %s, key: %s}\ncallout_seed: %s\nstate_dir: %s\nlisten: 127.0.0.1:0\nallowed_servers: [%s]\n",
		s.o.space, q(natsURL), q(addr), q(f.ServerCAFile), q(f.CertFile), q(f.KeyFile),
		q(filepath.Join(s.l.trust, "authd", fmt.Sprintf("space.%x", s.o.space), "callout.nk")), q(stateDir), s.brokerID)
	cfgPath := filepath.Join(s.l.authd, "authd.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return nil, err
	}
	var info daemon.ReadyInfo
	c, err := s.startHeld(ctx, "authd", stateDir, "auth-service-refusal.json", "PLANE_HELD", func() (*child, error) {
		c, err := s.startChild("authd", nil, authd, "serve", "--config", cfgPath)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if info, err = daemon.Ready(rctx, stateDir, "auth-service", c.cmd.Process.Pid); err != nil {
			// Ready returns as soon as the refusal file appears: wait for the exit too.
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
			}
			return c, fmt.Errorf("authd not ready: %w; see %s", err, c.log)
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(stateDir, "auth-service.json"))
	if err != nil {
		return nil, err
	}
	var disc daemon.Discovery
	if err := json.Unmarshal(b, &disc); err != nil || disc.Cap == "" {
		return nil, fmt.Errorf("authd's discovery file: no capability (%v)", err)
	}
	id, _ := certFacts(f.CertFile)
	key, exp := s.auditCredential(id, "auth-plane")
	s.rows = append(s.rows, statusRow{"authd", id, key, "exchange " + info.URL, exp})
	ckey, cexp := s.auditCredential(id, "auth-callout")
	s.rows = append(s.rows, statusRow{"authd callout", "callout service user", ckey, "serving the callout", cexp})
	fmt.Fprintf(s.out, "authd:     separate process (pid %d), exchange %s\n", c.cmd.Process.Pid, info.URL)
	return &authdRun{url: info.URL, cap: disc.Cap, config: cfgPath, idp: idp}, nil
}

// bearerDemo grants devActor to devSubject (`authd actor grant`, a whole row on channel general),
// exchanges a dev IdP token for a bearer at authd (the human arm) and connects with it through
// the auth callout: a publish on its own general channel is read back, a publish as another
// principal is refused by the broker.
func (s *stack) bearerDemo(ctx context.Context, signer *signerclient.Client, a *authdRun, natsURL string) error {
	out, err := exec.CommandContext(ctx, filepath.Join(s.o.bin, "authd"), "actor", "--config", a.config, "grant",
		"--subject", devSubject, "--actor", devActor, "--allow-subscribe", "general", "--allow-publish", "general",
		"--label", "cotal-dev demo").CombinedOutput()
	if err != nil {
		return fmt.Errorf("authd actor grant: %v: %s", err, out)
	}
	fmt.Fprintf(s.out, "authd:     %s", out)
	client, err := authclient.New(authclient.Config{URL: a.url, Cap: a.cap, Actor: devActor,
		IdPToken: func(context.Context) (string, error) { return a.idp.token(devSubject), nil }})
	if err != nil {
		return err
	}
	b, err := client.Exchange(ctx)
	if err != nil {
		return fmt.Errorf("exchange at authd: %w", err)
	}
	sentinel, err := authclient.Sentinel(ctx, signer.API(), s.o.space)
	if err != nil {
		return err
	}
	opts, err := client.NatsOptions(sentinel)
	if err != nil {
		return err
	}
	errs := make(chan error, 4)
	nc, err := nats.Connect(natsURL, append(opts, nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
	if err != nil {
		return fmt.Errorf("connect through the callout with the bearer: %w", err)
	}
	defer nc.Close()
	names, err := space.NewNames(s.o.space)
	if err != nil {
		return err
	}
	own, err := names.Chat(b.Owner, devActor, "general")
	if err != nil {
		return err
	}
	read, _ := names.ChatRead("general")
	sub, err := nc.SubscribeSync(read)
	if err != nil {
		return err
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	body, _ := json.Marshal(map[string]any{"id": hex.EncodeToString(id), "from": map[string]string{"id": b.Owner + "." + devActor}, "text": calloutText})
	if err := nc.Publish(own, body); err != nil {
		return err
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		return fmt.Errorf("callout connection: publish on %s not read back: %w", own, err)
	}
	other, _ := names.Chat(b.Owner, "mallory", "general")
	if err := nc.Publish(other, []byte("spoof")); err != nil {
		return err
	}
	_ = nc.Flush()
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "Permissions Violation") {
			return fmt.Errorf("callout connection: unexpected error %v", err)
		}
	case <-time.After(5 * time.Second):
		return errors.New("callout connection: the broker did not refuse a publish as another principal")
	}
	fmt.Fprintf(s.out, "callout:   bearer for %s.%s (IdP subject %s) connected through the callout; published on %s, refused as %s.mallory\n",
		b.Owner, devActor, devSubject, own, b.Owner)
	ready := "callout connect made"
	if s.bobTerm != nil {
		// The post went into CHAT like any other: deliveryd fans it out to general's members.
		got, err := s.bobTerm.waitLine(ctx, "recv general "+b.Owner+"."+devActor+" "+calloutText, 30*time.Second)
		if err != nil {
			return fmt.Errorf("bob: %w", err)
		}
		fmt.Fprintf(s.out, "message:   bob's terminal (Attach): %s\n", got)
		ready += ", bob received its post"
	}
	s.rows = append(s.rows, statusRow{"bearer", b.Owner + "." + devActor, "(server-chosen, per connect)", ready, b.Expires.UTC().Format(time.RFC3339)})
	return nil
}
