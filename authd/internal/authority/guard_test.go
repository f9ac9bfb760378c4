package authority

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type coordBody struct {
	Owner        string `json:"owner"`
	Actor        string `json:"actor"`
	LifecycleUID string `json:"lifecycleUid"`
}

func TestReadDoorGuards(t *testing.T) {
	auth := []byte("Bearer " + strings.Repeat("ab", 32))
	ok := `{"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"probe","lifecycleUid":"cccccccccccccccccccccccccc"}`
	type req struct {
		method, origin, ctype, auth, body string
	}
	base := req{http.MethodPost, "", "application/json", string(auth), ok}
	for _, tc := range []struct {
		name string
		edit func(*req)
		want int
	}{
		{"get", func(r *req) { r.method = http.MethodGet; r.origin = "x" }, 405},
		{"origin", func(r *req) { r.origin = "https://evil"; r.ctype = "text/plain" }, 403},
		{"ctype", func(r *req) { r.ctype = "text/plain"; r.auth = "" }, 415},
		{"nocap", func(r *req) { r.auth = "" }, 401},
		{"wrongcap", func(r *req) { r.auth = "Bearer " + strings.Repeat("cd", 32) }, 401},
		{"big", func(r *req) { r.body = `{"owner":"` + strings.Repeat("a", MaxDoorBody) + `"}` }, 413},
		{"notjson", func(r *req) { r.body = "nope" }, 400},
		{"array", func(r *req) { r.body = "[]" }, 400},
		{"unknown", func(r *req) { r.body = strings.TrimSuffix(ok, "}") + `,"x":"y"}` }, 400},
		{"nonstring", func(r *req) { r.body = `{"owner":1,"actor":"probe","lifecycleUid":"cccccccccccccccccccccccccc"}` }, 400},
		{"trailing", func(r *req) { r.body = ok + "{}" }, 400},
		{"ok", func(*req) {}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rq := base
			tc.edit(&rq)
			r := httptest.NewRequest(rq.method, "/managed-lifecycle/retire", strings.NewReader(rq.body))
			if rq.origin != "" {
				r.Header.Set("Origin", rq.origin)
			}
			r.Header.Set("Content-Type", rq.ctype)
			if rq.auth != "" {
				r.Header.Set("Authorization", rq.auth)
			}
			var b coordBody
			err := ReadDoor(r, auth, &b)
			got := 0
			if err != nil {
				got = err.Status
			}
			if got != tc.want {
				t.Fatalf("status %d (%v), want %d", got, err, tc.want)
			}
			if tc.want == 0 && (b.Actor != "probe" || CheckTokens(b.Owner, b.Actor, b.LifecycleUID) != nil) {
				t.Fatalf("decoded %+v", b)
			}
		})
	}
	for _, bad := range [][3]string{
		{"p_aaaaaaaaaaaaaaaaaaaaaaaaaa", "probe", strings.Repeat("c", 26)},
		{"u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "pro.be", strings.Repeat("c", 26)},
		{"u_aaaaaaaaaaaaaaaaaaaaaaaaaa", "probe", "short"},
		{"", "probe", strings.Repeat("c", 26)},
	} {
		if CheckTokens(bad[0], bad[1], bad[2]) == nil {
			t.Errorf("CheckTokens%q accepted", bad)
		}
	}
}
