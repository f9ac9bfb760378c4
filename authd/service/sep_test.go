package service_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/sepdoor"
	"github.com/cotalgo/cotal/authd/service"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// send sends one request to the running service and returns the status and body.
func send(t testing.TB, method, url string, body []byte, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// TestServiceEndpointsSwitch: service_endpoints off (the default) leaves the route an unknown
// path; on, the loopback face serves it: GET names GetSpace's data account, the service issuer
// and the keys /jwks publishes, and POST runs the door's guards (the operator proof with the
// cap only).
func TestServiceEndpointsSwitch(t *testing.T) {
	e := newEnv(t)
	// startFaces starts authd with both faces and returns it with its public face's URL.
	startFaces := func(t *testing.T, on bool) (*service.Service, string) {
		cfg := e.config(t)
		cfg.ServiceEndpoints = on
		cfg.PublicListen, cfg.PublicURL = "127.0.0.1:0", "https://auth.example/tenant-a/"
		logs := &testkit.SyncBuffer{}
		s := startWith(t, service.Inputs{Config: cfg}, service.RuntimeOptions{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
		return s, "http://" + publicAddr(t, logs)
	}
	t.Run("ok/off-is-404", func(t *testing.T) {
		s, pub := startFaces(t, false)
		for _, url := range []string{s.URL(), pub} {
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				status, body := send(t, method, url+serviceaccess.Path, []byte("{}"), map[string]string{"Content-Type": "application/json"})
				if status != http.StatusNotFound || !strings.Contains(string(body), "no such route") {
					t.Fatalf("%s %s off = %d %s", method, url, status, body)
				}
			}
		}
		closeNow(s)
	})
	t.Run("ok/on", func(t *testing.T) {
		s, pub := startFaces(t, true)
		status, body := send(t, http.MethodGet, s.URL()+serviceaccess.Path, nil, nil)
		info, err := serviceaccess.ParseInfo(body)
		if status != http.StatusOK || err != nil {
			t.Fatalf("GET = %d %s: %v", status, body, err)
		}
		client, err := signerclient.Dial(signerclient.Config{Addr: e.sg.Addr, TLS: e.sg.ClientFor(t, "authd", sp)})
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		gs, err := client.GetSpace(ctxT(t), sp)
		if err != nil {
			t.Fatal(err)
		}
		_, jwks := send(t, http.MethodGet, s.URL()+"/jwks", nil, nil)
		var published struct {
			Keys []serviceaccess.JWK `json:"keys"`
		}
		if err := json.Unmarshal(jwks, &published); err != nil {
			t.Fatal(err)
		}
		if info.Account != gs.GetAccountPublicKey() || info.Space != sp || info.Issuer != serviceaccess.Issuer(sp) ||
			len(info.Keys) != len(published.Keys) || len(info.Keys) == 0 || info.Keys[0] != published.Keys[0] {
			t.Fatalf("info = %+v, want account %s and the keys of /jwks %+v", info, gs.GetAccountPublicKey(), published.Keys)
		}
		env, _ := json.Marshal(serviceaccess.Envelope{
			Request: serviceaccess.Request{Kind: serviceaccess.KindNameBind, Account: info.Account, Space: sp, RequestID: "bind-0001",
				Endpoint: "svc.echo", Owner: "u_" + strings.Repeat("a", 26)},
			Proof: serviceaccess.Proof{Kind: serviceaccess.ProofOperator},
		})
		status, body = send(t, http.MethodPost, s.URL()+serviceaccess.Path, env, map[string]string{"Content-Type": "application/json"})
		ans, err := serviceaccess.ParseAnswer(body)
		if status != http.StatusUnauthorized || err != nil || ans.Kind != serviceaccess.AnswerDenied || ans.Code != serviceaccess.CodeUnauthenticated {
			t.Fatalf("operator proof without the cap = %d %s (%v)", status, body, err)
		}
		status, body = send(t, http.MethodPost, s.URL()+serviceaccess.Path, env, map[string]string{"Content-Type": "application/json", "Origin": "null"})
		if ans, err := serviceaccess.ParseAnswer(body); status != http.StatusForbidden || err != nil || ans.Code != serviceaccess.CodePermissionDenied {
			t.Fatalf("Origin = %d %s (%v)", status, body, err)
		}
		// The public face serves the same GET, and refuses the operator proof even with the cap.
		status, pubBody := send(t, http.MethodGet, pub+serviceaccess.Path, nil, nil)
		if pubInfo, err := serviceaccess.ParseInfo(pubBody); status != http.StatusOK || err != nil || pubInfo.Account != info.Account || pubInfo.Keys[0] != info.Keys[0] {
			t.Fatalf("public GET = %d %s (%v)", status, pubBody, err)
		}
		status, body = send(t, http.MethodPost, pub+serviceaccess.Path, env, map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + s.Cap()})
		if ans, err := serviceaccess.ParseAnswer(body); status != http.StatusForbidden || err != nil || ans.Reason != sepdoor.ReasonLoopback {
			t.Fatalf("operator proof on the public face = %d %s (%v)", status, body, err)
		}
		// With the cap the request reaches the lifecycle authority, whose answer (any kind)
		// travels with its status and echoes the requestId.
		status, body = send(t, http.MethodPost, s.URL()+serviceaccess.Path, env, map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + s.Cap()})
		ans, err = serviceaccess.ParseAnswer(body)
		if err != nil || ans.RequestID != "bind-0001" || status != ans.HTTPStatus() || status == http.StatusUnauthorized {
			t.Fatalf("operator proof with the cap = %d %s (%v)", status, body, err)
		}
	})
}
