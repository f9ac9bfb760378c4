package profiles

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/space"
)

var updateGolden = flag.Bool("update", false, "rewrite pkg/profiles/testdata golden files")

const (
	mxSpace = "demo space"
	mxUID   = "abcdefghijklmnopqrstuvwxyz"
	// mxIID is the manager instance id the retirement requester's golden caller serves.
	mxIID = "bbbbbbbbbbbbbbbbbbbbbbbbbb"
	// mxEndpoint and mxSvcIID are the service endpoint and instance the service-serve golden
	// serves (endpoint token billing_api-v2).
	mxEndpoint = "billing.api-v2"
	mxSvcIID   = "dddddddddddddddddddddddddd"
	// mxDataAccount is the data account the system-account goldens name.
	mxDataAccount = "AAT6LL2VLE3SZW5AIYXT5MZHX2I7BRWM5T4HBYVAKRQZSWH7JBFP3V7E"
)

// mxGoldenParams are the representative parameters each golden file is built from.
var mxGoldenParams = map[Name]Params{
	Agent: {
		Owner: "local", Actor: "bob", LifecycleUID: mxUID, Role: "review",
		Subscribe:      []string{"general"},
		AllowSubscribe: []string{"team.backend", "general", "general", "proj.>"},
		AllowPublish:   []string{"general", "proj.>"},
		Capabilities:   []string{CapSpawn},
	},
	Supervisor:    {Owner: "local", Actor: "manager"},
	Provisioner:   {Owner: "local", Actor: "manager"},
	Deprovisioner: {Owner: "local", Actor: "bob", LifecycleUID: mxUID, MemberChannels: []string{"team.backend", "general", "general"}},
	Delivery:      {},
	Observer:      {},
	Admin:         {Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "web", InboxNonce: "bksyh3qicrxbejqrvpgufe4nu6-web-nonce-0001"},
	Operator:      {Owner: "local", Actor: "alice"},
	Probe:         {},
	AuthCallout:   {},
	Sentinel:      {},
	AuthPlane:     {},
	MembershipRW:  {},
	RetirementRequester: {
		Owner: "local", Actor: "manager_serve_" + mxIID, LifecycleUID: mxUID,
		Target: &RetirementTarget{Owner: "local", Actor: "bob", LifecycleUID: "cccccccccccccccccccccccccc"},
	},
	ServiceServe:  {Owner: "u_abcdefghijklmnopqrstuvwxyz", ServiceEndpoint: mxEndpoint, InstanceID: mxSvcIID},
	RemoteManager: {Owner: "u_abcdefghijklmnopqrstuvwxyz", Actor: "manager_" + mxIID, InstanceID: mxIID},

	MembershipObserver: {DataAccount: mxDataAccount},
	ConnectionEvictor:  {DataAccount: mxDataAccount},
}

// mxSpecJSON renders a spec the way golden files hold it: indented, '>' unescaped.
func mxSpecJSON(t *testing.T, s *Spec) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		t.Fatalf("encode spec: %v", err)
	}
	return buf.Bytes()
}

func TestGolden(t *testing.T) {
	if len(mxGoldenParams) != len(All()) {
		t.Fatalf("golden params cover %d profiles, matrix has %d", len(mxGoldenParams), len(All()))
	}
	for _, name := range All() {
		t.Run("ok/"+string(name), func(t *testing.T) {
			p, ok := mxGoldenParams[name]
			if !ok {
				t.Fatalf("no golden params for %s", name)
			}
			s, err := Build(mxSpace, name, p)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			got := mxSpecJSON(t, s)
			path := filepath.Join("testdata", string(name)+".json")
			if *updateGolden {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run with -update to create): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from golden (run with -update after review):\n--- got\n%s\n--- want\n%s", path, got, want)
			}
			// The golden form round-trips to the same spec.
			var back Spec
			if err := json.Unmarshal(want, &back); err != nil {
				t.Fatalf("decode golden: %v", err)
			}
			if again := mxSpecJSON(t, &back); !bytes.Equal(again, want) {
				t.Fatalf("golden does not round-trip:\n%s", again)
			}
		})
	}
}

// TestAccountConnzOnlyAuthPlane: the data account's CONNZ request (authd's plane-reclaim sweep,
// $SYS.REQ.ACCOUNT.PING.CONNZ) is granted to the auth-plane profile and to no other; of the
// system-account profiles only membership-observer requests an account's CONNZ, and only its own
// space's ($SYS.REQ.ACCOUNT.<data account>.CONNZ).
func TestAccountConnzOnlyAuthPlane(t *testing.T) {
	for _, name := range All() {
		t.Run("ok/"+string(name), func(t *testing.T) {
			s, err := Build(mxSpace, name, mxGoldenParams[name])
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			ping, other := false, []string{}
			for _, subj := range s.Pub.Allow {
				switch {
				case subj == space.AccountConnzPing:
					ping = true
				case strings.HasPrefix(subj, "$SYS.REQ.ACCOUNT"):
					other = append(other, subj)
				}
			}
			if ping != (name == AuthPlane) {
				t.Fatalf("%s grants the account CONNZ request: %v, want %v", name, ping, name == AuthPlane)
			}
			if name == MembershipObserver {
				if len(other) != 1 || !strings.HasSuffix(other[0], ".CONNZ") || strings.ContainsAny(other[0], "*>") {
					t.Fatalf("membership-observer's account requests %v, want exactly one account's CONNZ", other)
				}
			} else if len(other) != 0 {
				t.Fatalf("%s grants account requests %v, want none", name, other)
			}
		})
	}
}
