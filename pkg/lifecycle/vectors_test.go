package lifecycle

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

// The issue-23 acceptance vectors. The opIds are those of uid a×26 (upstream's vector uid); the
// runtime key is upstream's (s2420, u_a×26, probe, a×26).
func TestVectors(t *testing.T) {
	a26 := strings.Repeat("a", 26)
	for _, c := range []struct {
		name string
		f    func(string) (string, error)
		want string
	}{
		{"ok/managed retirement", ManagedRetirementOpID, "b5beb5e4f583874a2f0947bbbd"},
		{"ok/interactive retirement", InteractiveRetirementOpID, "3db697133b35dc8a7e289dc92c"},
		// Ours: no upstream vector; pinned so the derivation cannot drift.
		{"ok/activation", ActivationOpID, "08cd66207502b704714ce85638"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.f(a26)
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
	t.Run("ok/registration", func(t *testing.T) {
		// Ours: no upstream vector; computed independently as the first 26 hex characters of
		// SHA-256("register:manager."+"b"*26+":0"), ":2", and of "register:svc_a-b."+"b"*26+":0".
		b26 := strings.Repeat("b", 26)
		for _, c := range []struct {
			ep    string
			epoch uint64
			want  string
		}{
			{ManagerEndpoint, 0, "8112f510e6121a59e1d37cb6b6"},
			{ManagerEndpoint, 2, "835331ed567b0440297e4d951c"},
			{"svc.a-b", 0, "53d3f6d698dacec9e51eae57ff"},
		} {
			if got, err := RegistrationOpID(c.ep, b26, c.epoch); err != nil || got != c.want {
				t.Fatalf("RegistrationOpID(%q, %d) = %q, %v; want %q", c.ep, c.epoch, got, err, c.want)
			}
		}
		for _, in := range []struct {
			ep, iid string
			epoch   uint64
		}{{"Manager", b26, 0}, {ManagerEndpoint, "short", 0}, {ManagerEndpoint, b26, MaxSafeInteger + 1}} {
			if got, err := RegistrationOpID(in.ep, in.iid, in.epoch); err == nil {
				t.Fatalf("RegistrationOpID(%q, %q, %d) = %q", in.ep, in.iid, in.epoch, got)
			}
		}
	})
	t.Run("ok/runtime key", func(t *testing.T) {
		got, err := ManagedRuntimeKey("s2420", "u_"+a26, "probe", a26)
		if err != nil || got != "cotal-ffa44aae523faeee4ab7689a699b392e" {
			t.Fatalf("got %q, %v", got, err)
		}
	})
	t.Run("fail/opId of a non-uid", func(t *testing.T) {
		for _, f := range []func(string) (string, error){ManagedRetirementOpID, InteractiveRetirementOpID, ActivationOpID} {
			if got, err := f("A" + a26); err == nil {
				t.Fatalf("derived %q from a non-uid", got)
			}
		}
	})
	t.Run("fail/runtime key of a bad target", func(t *testing.T) {
		for _, in := range [][4]string{{"", "u_" + a26, "probe", a26}, {"s", "u.x", "probe", a26}, {"s", "o", "p*", a26}, {"s", "o", "p", "short"}} {
			if got, err := ManagedRuntimeKey(in[0], in[1], in[2], in[3]); err == nil {
				t.Fatalf("%q: got %q", in, got)
			}
		}
	})
}

func vectorRegistration() Registration {
	return Registration{
		Space: "s2420", Owner: "u_" + strings.Repeat("a", 26), Actor: "cli",
		InstanceID: strings.Repeat("b", 26), LifecycleUID: strings.Repeat("c", 26),
		Identities: Identities{
			Supervisor: "U" + strings.Repeat("A", 55), Executor: "U" + strings.Repeat("B", 55),
			Serve: "U" + strings.Repeat("C", 55), GoalWriter: "U" + strings.Repeat("D", 55),
			SessionLedger: "U" + strings.Repeat("E", 55),
		},
		RegistrationRevision: 7, ProcessEpoch: 0,
	}
}

// signerdMac is what signerd's Mac computes (keystore.Space.Mac), written out here so the vector
// checks the payload against the proof without a signer.
func signerdMac(key, payload []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(ProofDomain))
	m.Write([]byte{0})
	m.Write(payload)
	return ProofPrefix + hex.EncodeToString(m.Sum(nil))
}

func TestProofPayload(t *testing.T) {
	t.Run("ok/vector", func(t *testing.T) {
		p, err := ProofPayload(vectorRegistration())
		if err != nil {
			t.Fatal(err)
		}
		if len(p) != 929 {
			t.Fatalf("payload is %d bytes, want 929: %s", len(p), p)
		}
		want := `{"v":1,"kind":"manager-current-registration","space":"s2420","owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"cli","instanceId":"bbbbbbbbbbbbbbbbbbbbbbbbbb","lifecycleUid":"cccccccccccccccccccccccccc","actors":{"supervisor":"manager_bbbbbbbbbbbbbbbbbbbbbbbbbb","executor":"manager_exec_bbbbbbbbbbbbbbbbbbbbbbbbbb","serve":"manager_serve_bbbbbbbbbbbbbbbbbbbbbbbbbb","goalWriter":"manager_goal_bbbbbbbbbbbbbbbbbbbbbbbbbb","sessionLedger":"manager_session_bbbbbbbbbbbbbbbbbbbbbbbbbb"},"identities":{"supervisor":{"id":"U` + strings.Repeat("A", 55) + `"},"executor":{"id":"U` + strings.Repeat("B", 55) + `"},"serve":{"id":"U` + strings.Repeat("C", 55) + `"},"goalWriter":{"id":"U` + strings.Repeat("D", 55) + `"},"sessionLedger":{"id":"U` + strings.Repeat("E", 55) + `"}},"registrationRevision":7,"processEpoch":0}`
		if string(p) != want {
			t.Fatalf("payload\n%s\nwant\n%s", p, want)
		}
		key := make([]byte, 32)
		for i := range key {
			key[i] = byte(i)
		}
		const proof = "sha256:9ab9a9579b063238cd2f6aefd60687f33bc7c840c0e23eb6545a91110d17cb5d"
		got := signerdMac(key, p)
		if got != proof {
			t.Fatalf("proof %s, want %s", got, proof)
		}
		if !ProofEqual(proof, got) {
			t.Fatal("ProofEqual refused equal proofs")
		}
	})
	t.Run("ok/no HTML escaping", func(t *testing.T) {
		r := vectorRegistration()
		r.Space = `a<b>&"c"` + "\u2028x"
		p, err := ProofPayload(r)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(p), `"space":"a<b>&\"c\"`+"\u2028"+`x"`) {
			t.Fatalf("space not written as JSON.stringify writes it: %s", p)
		}
	})
	t.Run("ok/actors", func(t *testing.T) {
		a, err := ManagerActors(strings.Repeat("b", 26))
		if err != nil || a[0] != "manager_"+strings.Repeat("b", 26) || a[4] != "manager_session_"+strings.Repeat("b", 26) {
			t.Fatalf("%q %v", a, err)
		}
		p, err := ServePrincipal("u_"+strings.Repeat("a", 26), strings.Repeat("b", 26))
		if err != nil || p != "u_"+strings.Repeat("a", 26)+".manager_serve_"+strings.Repeat("b", 26) {
			t.Fatalf("%q %v", p, err)
		}
	})
	for name, mut := range map[string]func(*Registration){
		"fail/space":      func(r *Registration) { r.Space = " s" },
		"fail/owner":      func(r *Registration) { r.Owner = "u.a" },
		"fail/actor":      func(r *Registration) { r.Actor = "" },
		"fail/instance":   func(r *Registration) { r.InstanceID = "B" + strings.Repeat("b", 25) },
		"fail/uid":        func(r *Registration) { r.LifecycleUID = "c" },
		"fail/identity":   func(r *Registration) { r.Identities.Serve = "N" + strings.Repeat("C", 55) },
		"fail/identity 1": func(r *Registration) { r.Identities.GoalWriter = "U" + strings.Repeat("1", 55) },
		"fail/revision":   func(r *Registration) { r.RegistrationRevision = MaxSafeInteger + 1 },
		"fail/epoch":      func(r *Registration) { r.ProcessEpoch = MaxSafeInteger + 1 },
	} {
		t.Run(name, func(t *testing.T) {
			r := vectorRegistration()
			mut(&r)
			if p, err := ProofPayload(r); err == nil {
				t.Fatalf("built %s", p)
			}
		})
	}
	t.Run("fail/proof compare", func(t *testing.T) {
		const p = "sha256:9ab9a9579b063238cd2f6aefd60687f33bc7c840c0e23eb6545a91110d17cb5d"
		for _, other := range []string{
			"sha256:9ab9a9579b063238cd2f6aefd60687f33bc7c840c0e23eb6545a91110d17cb5e",
			"sha256:9AB9A9579B063238CD2F6AEFD60687F33BC7C840C0E23EB6545A91110D17CB5D",
			"9ab9a9579b063238cd2f6aefd60687f33bc7c840c0e23eb6545a91110d17cb5d", "", "sha256:",
		} {
			if ProofEqual(other, p) || ProofEqual(p, other) {
				t.Fatalf("ProofEqual accepted %q", other)
			}
		}
		if ProofEqual("", "") {
			t.Fatal("ProofEqual accepted two empty proofs")
		}
	})
}
