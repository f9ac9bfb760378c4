package drill_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// idpSubject is the IdP subject every drill agent's row is granted to: one derived owner.
const idpSubject = "drill-user"

// testIdP is the drill's IdP on loopback: an Ed25519 key made at start (memory only), its JWKS
// at /jwks, and tokens for idpSubject. authd pins it (`authd idp pin`).
type testIdP struct {
	url  string
	priv ed25519.PrivateKey
	kid  string
}

func startIdP(t *testing.T) *testIdP {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	i := &testIdP{url: "http://" + ln.Addr().String(), priv: priv, kid: "drill-key"}
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(pub), "kid": i.kid, "alg": "EdDSA", "use": "sig"}}})
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/jwks" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return i
}

// token signs an IdP token for idpSubject, valid ten minutes.
func (i *testIdP) token(context.Context) (string, error) {
	now := time.Now()
	h, _ := json.Marshal(map[string]any{"alg": "EdDSA", "kid": i.kid, "typ": "JWT"})
	c, _ := json.Marshal(map[string]any{"iss": i.url, "aud": i.url, "sub": idpSubject, "iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix()})
	in := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(i.priv, []byte(in))), nil
}

// authdRun is a running `authd serve` child with both signerd replicas and every broker URL.
type authdRun struct {
	bin, config, url, cap string
	idp                   *testIdP
	proc                  *child
}

func startAuthd(t *testing.T, bin string, s *signerdtest.Signer, addrs, brokers []string) *authdRun {
	t.Helper()
	a := &authdRun{bin: bin, idp: startIdP(t)}
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(a.bin, "idp", "pin", a.idp.url, "--state-dir", state).CombinedOutput(); err != nil {
		t.Fatalf("authd idp pin: %v\n%s", err, out)
	}
	cf := s.ClientFor(t, mtls.KindAuthd, plane3test.Space)
	q := strconv.Quote
	qs := func(l []string) string {
		out := make([]string, len(l))
		for i, v := range l {
			out[i] = q(v)
		}
		return strings.Join(out, ", ")
	}
	yaml := fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {addresses: [%s], ca: %s, cert: %s, key: %s}\ncallout_seed: %s\nstate_dir: %s\nlisten: 127.0.0.1:0\n",
		q(plane3test.Space), qs(brokers), qs(addrs), q(cf.ServerCAFile), q(cf.CertFile), q(cf.KeyFile),
		q(filepath.Join(s.Dir, "authd", space.Segment(plane3test.Space), "callout.nk")), q(state))
	a.config = filepath.Join(dir, "authd.yaml")
	if err := os.WriteFile(a.config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &child{holder: "authd", cmd: exec.Command(a.bin, "serve", "--config", a.config), stderr: &testkit.SyncBuffer{}, exited: make(chan struct{})}
	c.cmd.Stderr = c.stderr
	c.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET=")
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("authd stderr:\n%s", c.stderr)
		}
	})
	a.proc = c
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	info, err := daemon.Ready(ctx, state, "auth-service", c.cmd.Process.Pid)
	if err != nil {
		t.Fatalf("authd not ready: %v\n%s", err, c.stderr)
	}
	b, err := os.ReadFile(filepath.Join(state, "auth-service.json"))
	if err != nil {
		t.Fatal(err)
	}
	var disc daemon.Discovery
	if err := json.Unmarshal(b, &disc); err != nil || disc.Cap == "" {
		t.Fatalf("authd's discovery file: no capability (%v)", err)
	}
	a.url, a.cap = info.URL, disc.Cap
	return a
}

// grant writes an interactive ledger row for actor (granted to idpSubject, on general) with
// `authd actor grant`, as an operator does; authd picks the lifecycle uid.
// owner, once known, replaces --subject (no DeriveOwner call per row).
func (a *authdRun) grant(t *testing.T, actor, owner string) {
	t.Helper()
	who := []string{"--subject", idpSubject}
	if owner != "" {
		who = []string{"--owner", owner}
	}
	args := append(append([]string{"actor", "--config", a.config, "grant"}, who...), "--actor", actor,
		"--allow-subscribe", "general", "--allow-publish", "general", "--label", "drill")
	out, err := exec.Command(a.bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("authd actor grant %s: %v\n%s", actor, err, out)
	}
}

// rows lists the ledger (`authd actor list --json`): actor -> owner and lifecycle uid.
func (a *authdRun) rows(t *testing.T) map[string][2]string {
	t.Helper()
	out, err := exec.Command(a.bin, "actor", "--config", a.config, "list", "--json").Output()
	if err != nil {
		t.Fatalf("authd actor list: %v", err)
	}
	rows := map[string][2]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r struct {
			Owner, Actor string
			LifecycleUID string `json:"lifecycleUid"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("authd actor list: %v", err)
		}
		rows[r.Actor] = [2]string{r.Owner, r.LifecycleUID}
	}
	return rows
}
