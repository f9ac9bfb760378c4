package service_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// publicAddr is the listen address the "authd public face listening" log line names.
func publicAddr(t *testing.T, logs *testkit.SyncBuffer) string {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line struct {
			Msg, Listen, PublicURL string
		}
		var raw map[string]any
		if json.Unmarshal(sc.Bytes(), &raw) != nil {
			continue
		}
		line.Msg, _ = raw["msg"].(string)
		line.Listen, _ = raw["listen"].(string)
		if line.Msg == "authd public face listening" && line.Listen != "" {
			return line.Listen
		}
	}
	t.Fatalf("no public face listening line in the log:\n%s", logs.String())
	return ""
}

func get(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestPublicFaceStartClose: with public_listen and public_url, authd binds the public face on
// loopback, logs its address, names public_url in PublicURL and the discovery file, serves
// /health and the well-known bundle there (the loopback doors 404), and Close takes it down.
func TestPublicFaceStartClose(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(t)
	cfg.PublicListen, cfg.PublicURL = "127.0.0.1:0", "https://auth.example/tenant-a/"
	fake := idptest.Start(t)
	if _, err := idp.PinURL(ctxT(t), cfg.StateDir, fake.URL, nil); err != nil {
		t.Fatal(err)
	}
	logs := &testkit.SyncBuffer{}
	s := startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if s.PublicURL() != "https://auth.example/tenant-a" {
		t.Fatalf("PublicURL = %q", s.PublicURL())
	}
	b, err := os.ReadFile(daemon.DiscoveryPath(cfg.StateDir, service.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var d daemon.Discovery
	if err := json.Unmarshal(b, &d); err != nil || d.PublicURL != s.PublicURL() || d.URL != s.URL() {
		t.Fatalf("discovery file %+v, %v", d, err)
	}
	addr := publicAddr(t, logs)
	pub := "http://" + addr
	if pub == s.URL() {
		t.Fatal("the public face shares the loopback listener")
	}
	if code, body := get(t, http.MethodGet, pub+"/health"); code != http.StatusOK || strings.TrimSpace(body) != `{"ok":true}` {
		t.Fatalf("public /health = %d %s", code, body)
	}
	code, body := get(t, http.MethodGet, pub+"/.well-known/cotal-mesh")
	var bundle struct {
		Space       string `json:"space"`
		Server      string `json:"server"`
		TLSRequired bool   `json:"tlsRequired"`
		UserAuth    struct {
			IdP struct {
				URL string `json:"url"`
			} `json:"idp"`
			Endpoints struct {
				URL string `json:"url"`
			} `json:"endpoints"`
		} `json:"userAuth"`
		SentinelCreds string `json:"sentinelCreds"`
	}
	if err := json.Unmarshal([]byte(body), &bundle); code != http.StatusOK || err != nil {
		t.Fatalf("well-known = %d %s", code, body)
	}
	if bundle.Space != sp || bundle.Server != e.url || !bundle.TLSRequired || bundle.UserAuth.IdP.URL != fake.URL ||
		bundle.UserAuth.Endpoints.URL != s.PublicURL() || !strings.Contains(bundle.SentinelCreds, "BEGIN NATS USER JWT") {
		t.Fatalf("bundle %+v", bundle)
	}
	// The loopback door answers on the loopback face (401 without the cap), never on the public one.
	if code, _ := get(t, http.MethodPost, s.URL()+"/managed-lifecycle/activate"); code == http.StatusNotFound {
		t.Fatalf("loopback activate door = %d", code)
	}
	for _, p := range []string{"/managed-lifecycle/activate", "/managed-lifecycle/retire", "/service-endpoint-authority"} {
		if code, body := get(t, http.MethodPost, pub+p); code != http.StatusNotFound {
			t.Fatalf("public %s = %d %s", p, code, body)
		}
	}
	// The manager-service authority is on both faces (415: no JSON body).
	for _, base := range []string{pub, s.URL()} {
		if code, body := get(t, http.MethodPost, base+"/manager-service-authority"); code == http.StatusNotFound {
			t.Fatalf("%s/manager-service-authority = %d %s", base, code, body)
		}
	}
	if err := s.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	if resp, err := client.Get(pub + "/health"); err == nil {
		resp.Body.Close()
		t.Fatal("public listener still up after Close")
	}
}

// TestPublicFaceRefused: a public_listen that is not loopback, or one without public_url, is a
// configuration refusal naming the key.
func TestPublicFaceRefused(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ name, listen, url, want string }{
		{"fail/not-loopback", "0.0.0.0:0", "https://auth.example", "public_listen"},
		{"fail/no-url", "127.0.0.1:0", "", "public_url"},
		{"fail/http-url", "127.0.0.1:0", "http://auth.example", "public_url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.config(t)
			cfg.PublicListen, cfg.PublicURL = tc.listen, tc.url
			_, err := service.Start(ctxT(t), service.Inputs{Config: cfg}, service.RuntimeOptions{})
			var se *service.StartError
			if !errors.As(err, &se) || se.Code != service.CodeConfig || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start = %v, want a CONFIG refusal naming %s", err, tc.want)
			}
		})
	}
}
