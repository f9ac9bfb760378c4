package lifecycle

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

const goodLease = `{"holder":"local.mgr","instanceId":"abcdefghijklmnopqrstuvwxyz","runtime":"pty","root":"/srv/cotal","pid":42,"since":1767225600000}`

// registeredLease is goodLease rewritten after a registration at epoch 0, revision 7.
var registeredLease = strings.TrimSuffix(goodLease, "}") + `,"processEpoch":0,"registrationRevision":7}`

func TestManagerLease(t *testing.T) {
	want := ManagerLease{Holder: "local.mgr", InstanceID: "abcdefghijklmnopqrstuvwxyz", Runtime: "pty", Root: "/srv/cotal", PID: 42, Since: 1767225600000}
	r, err := DecodeManagerLease([]byte(goodLease))
	if err != nil || r != want || r.Registered() {
		t.Fatalf("DecodeManagerLease(old row) = %+v, %v", r, err)
	}
	b, err := EncodeManagerLease(r)
	if err != nil || string(b) != goodLease {
		t.Fatalf("EncodeManagerLease = %s, %v; want upstream's field order", b, err)
	}
	want.RegistrationRevision = 7
	r, err = DecodeManagerLease([]byte(registeredLease))
	if err != nil || r != want || !r.Registered() || r.ProcessEpoch != 0 {
		t.Fatalf("DecodeManagerLease(registered at epoch 0) = %+v, %v", r, err)
	}
	if b, err := EncodeManagerLease(r); err != nil || string(b) != registeredLease {
		t.Fatalf("EncodeManagerLease(registered) = %s, %v", b, err)
	}
	if b, err := json.Marshal(r); err != nil || string(b) != registeredLease {
		t.Fatalf("json.Marshal = %s, %v", b, err)
	}
	var back ManagerLease
	if err := json.Unmarshal([]byte(registeredLease), &back); err != nil || back != r {
		t.Fatalf("json.Unmarshal = %+v, %v", back, err)
	}
	if err := json.Unmarshal([]byte(`{"holder":"x"}`), &back); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("json.Unmarshal of a bad row = %v", err)
	}
	want.ProcessEpoch = 2
	if b, err := EncodeManagerLease(want); err != nil || !strings.HasSuffix(string(b), `,"processEpoch":2,"registrationRevision":7}`) {
		t.Fatalf("EncodeManagerLease(epoch 2) = %s, %v", b, err)
	}
	if k, err := LeaseKey("abcdefghijklmnopqrstuvwxyz"); err != nil || k != "lease.abcdefghijklmnopqrstuvwxyz" {
		t.Fatalf("LeaseKey = %q, %v", k, err)
	}
	if k, err := LeaseKey("a.b"); err == nil {
		t.Fatalf("LeaseKey(a.b) = %q", k)
	}
	if _, err := EncodeManagerLease(ManagerLease{Holder: "h", InstanceID: want.InstanceID, Runtime: "r", Root: "/", PID: 1, ProcessEpoch: 1}); err == nil {
		t.Fatal("encoded an epoch without a revision")
	}
	for _, tc := range []struct{ name, in, want string }{
		{"fail/empty", ``, "lease row:"},
		{"fail/not-json", `garbage`, "lease row:"},
		{"fail/unknown-field", strings.Replace(goodLease, `}`, `,"ready":true}`, 1), "unknown field"},
		{"fail/trailing", goodLease + `{}`, "trailing"},
		{"fail/no-holder", strings.Replace(goodLease, `"local.mgr"`, `""`, 1), "holder"},
		{"fail/no-runtime", strings.Replace(goodLease, `"pty"`, `""`, 1), "runtime"},
		{"fail/relative-root", strings.Replace(goodLease, `"/srv/cotal"`, `"srv"`, 1), "root"},
		{"fail/unclean-root", strings.Replace(goodLease, `"/srv/cotal"`, `"/srv/../etc"`, 1), "root"},
		{"fail/zero-pid", strings.Replace(goodLease, `42`, `0`, 1), "pid"},
		{"fail/string-pid", strings.Replace(goodLease, `42`, `"42"`, 1), "lease row:"},
		{"fail/negative-since", strings.Replace(goodLease, `1767225600000`, `-1`, 1), "since"},
		{"fail/bad-instance", strings.Replace(goodLease, `abcdefghijklmnopqrstuvwxyz`, `ABC`, 1), "instanceId"},
		{"fail/oversize", `{"holder":"` + strings.Repeat("a", MaxRowBytes) + `"}`, "bytes"},
		{"fail/epoch alone", strings.Replace(goodLease, `}`, `,"processEpoch":0}`, 1), "come together"},
		{"fail/revision alone", strings.Replace(goodLease, `}`, `,"registrationRevision":7}`, 1), "come together"},
		{"fail/revision 0", strings.Replace(registeredLease, `"registrationRevision":7`, `"registrationRevision":0`, 1), "is 0"},
		{"fail/null epoch", strings.Replace(registeredLease, `"processEpoch":0`, `"processEpoch":null`, 1), "come together"},
		{"fail/negative epoch", strings.Replace(registeredLease, `"processEpoch":0`, `"processEpoch":-1`, 1), "lease row:"},
		{"fail/huge revision", strings.Replace(registeredLease, `"registrationRevision":7`, `"registrationRevision":9007199254740992`, 1), "2^53-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeManagerLease([]byte(tc.in))
			if err == nil || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeManagerLease = %v; want ErrCorrupt mentioning %q", err, tc.want)
			}
		})
	}
}
