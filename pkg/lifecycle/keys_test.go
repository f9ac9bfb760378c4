package lifecycle

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestKeys(t *testing.T) {
	retire := mustOp(t, ManagedRetirementOpID, tUID)
	for _, c := range []struct {
		name, got, want string
	}{
		{"ok/head", mustKey(HeadKey(tOwner, "cli")), "lifecycle." + tOwner + ".cli"},
		{"ok/uid", mustKey(UIDKey(tUID)), "uid." + tUID},
		{"ok/frontier", mustKey(FrontierKey(tUID)), "frontier." + tUID},
		{"ok/spec", mustKey(SpecKey("com.example-1.host", tIID)), "svc.com_example-1_host." + tIID},
		{"ok/gate", mustKey(GateKey(tUID)), "gate." + tUID},
		{"ok/stage", mustKey(StageKey(retire)), "stage." + retire},
		{"ok/manager gate", mustKey(EndpointGateKey(ManagerEndpoint, tIID)), "epgate.manager." + tIID},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Fatalf("got %q, want %q", c.got, c.want)
			}
		})
	}
	t.Run("ok/parse inverts build", func(t *testing.T) {
		o, a, err := ParseHeadKey("lifecycle." + tOwner + ".cli")
		if err != nil || o != tOwner || a != "cli" {
			t.Fatalf("%q %q %v", o, a, err)
		}
		for key, parse := range map[string]func(string) (string, error){
			"uid." + tUID: ParseUIDKey, "frontier." + tUID: ParseFrontierKey, "gate." + tUID: ParseGateKey, "stage." + tUID: ParseStageKey,
		} {
			if u, err := parse(key); err != nil || u != tUID {
				t.Fatalf("%s: %q %v", key, u, err)
			}
		}
		ep, iid, err := ParseSpecKey("svc.com_example-1_host." + tIID)
		if err != nil || ep != "com.example-1.host" || iid != tIID {
			t.Fatalf("%q %q %v", ep, iid, err)
		}
		ep, iid, err = ParseEndpointGateKey("epgate.manager." + tIID)
		if err != nil || ep != ManagerEndpoint || iid != tIID {
			t.Fatalf("%q %q %v", ep, iid, err)
		}
	})
	t.Run("fail/build", func(t *testing.T) {
		for _, f := range []func() (string, error){
			func() (string, error) { return HeadKey("u.x", "cli") },
			func() (string, error) { return HeadKey(tOwner, "*") },
			func() (string, error) { return HeadKey(tOwner, "") },
			func() (string, error) { return UIDKey("C" + tUID[1:]) },
			func() (string, error) { return FrontierKey(tUID + "x." + tUID) },
			func() (string, error) { return GateKey(">") },
			func() (string, error) { return StageKey("short") },
			func() (string, error) { return SpecKey("com_example", tIID) },
			func() (string, error) { return SpecKey("-host", tIID) },
			func() (string, error) { return SpecKey("host-", tIID) },
			func() (string, error) { return SpecKey("a..b", tIID) },
			func() (string, error) { return SpecKey("Host", tIID) },
			func() (string, error) { return SpecKey(strings.Repeat("a", 65), tIID) },
			func() (string, error) { return EndpointGateKey(ManagerEndpoint, "B"+tIID[1:]) },
			func() (string, error) { return EndpointGateKey("", tIID) },
		} {
			if k, err := f(); err == nil {
				t.Fatalf("built %q", k)
			}
		}
	})
	t.Run("fail/parse", func(t *testing.T) {
		for _, k := range []string{
			"", "lifecycle.", "lifecycle." + tOwner, "lifecycle." + tOwner + ".cli.x", "lifecycle.*.cli", "Lifecycle." + tOwner + ".cli",
			"lifecycle." + tOwner + ".", "lifecycle..cli",
		} {
			if o, a, err := ParseHeadKey(k); !errors.Is(err, ErrBadKey) {
				t.Fatalf("%q: %q %q %v", k, o, a, err)
			}
		}
		for _, k := range []string{"uid." + tUID, "gate." + tUID + ".x", "gate.", "gate." + strings.ToUpper(tUID), "gate.>", "gate." + tUID + strings.Repeat("a", 7)} {
			if u, err := ParseGateKey(k); !errors.Is(err, ErrBadKey) {
				t.Fatalf("%q: %q %v", k, u, err)
			}
		}
		for _, k := range []string{"svc.manager." + tIID, "epgate.manager", "epgate.com.example." + tIID, "epgate.a__b." + tIID, "epgate._a." + tIID, "epgate.manager." + tIID + ".x", "epgate.Manager." + tIID} {
			if e, i, err := ParseEndpointGateKey(k); !errors.Is(err, ErrBadKey) {
				t.Fatalf("%q: %q %q %v", k, e, i, err)
			}
		}
		if _, err := EndpointName("a-_b"); err == nil {
			t.Fatal("EndpointName took a token with an empty-edged label")
		}
	})
}

// TestKeyPatterns: each family pattern matches every key its builder makes, token for token, and
// the two lists together match each key of this package exactly once.
func TestKeyPatterns(t *testing.T) {
	retire := mustOp(t, ManagedRetirementOpID, tUID)
	keys := map[string][]string{
		"auth":    {mustKey(GateKey(tUID)), mustKey(StageKey(retire)), mustKey(EndpointGateKey(ManagerEndpoint, tIID)), mustKey(EndpointGateKey("com.example", tIID))},
		"records": {mustKey(HeadKey(tOwner, "cli")), mustKey(UIDKey(tUID)), mustKey(FrontierKey(tUID)), mustKey(SpecKey(ManagerEndpoint, tIID))},
	}
	match := func(pattern, key string) bool {
		p, k := strings.Split(pattern, "."), strings.Split(key, ".")
		if len(p) != len(k) {
			return false
		}
		for i := range p {
			if p[i] != "*" && p[i] != k[i] {
				return false
			}
		}
		return true
	}
	for bucket, patterns := range map[string][]string{"auth": AuthKeyPatterns(), "records": RecordsKeyPatterns()} {
		for _, key := range append(append([]string(nil), keys["auth"]...), keys["records"]...) {
			n := 0
			for _, p := range patterns {
				if match(p, key) {
					n++
				}
			}
			own := slices.Contains(keys[bucket], key)
			if (n == 1) != own || n > 1 {
				t.Errorf("%s patterns %v match %q %d times, want %v", bucket, patterns, key, n, own)
			}
		}
	}
}
