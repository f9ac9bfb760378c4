package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Each row decoder reads untrusted bytes from the broker. Whatever it accepts is bounded, is
// byte for byte its own canonical encoding, and names the key it was read at; whatever it refuses
// wraps ErrCorrupt.

// seedRows adds every golden row, with its key, and a few damaged ones.
func seedRows(f *testing.F, family string) {
	for _, c := range rowCases(f) {
		if !bytes.HasPrefix([]byte(c.name), []byte(family)) {
			continue
		}
		f.Add(c.key, []byte(c.golden))
		f.Add(c.key, []byte(c.golden[:len(c.golden)/2]))
		f.Add(c.key, append([]byte(c.golden[:len(c.golden)-1]), `,"x":null}`...))
		f.Add("x."+c.key, []byte(c.golden))
	}
	f.Add("", []byte(nil))
	f.Add("gate.", []byte(`{"v":1}`))
}

func checkDecoded(t *testing.T, b []byte, err error, enc func() ([]byte, error)) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("refusal does not wrap ErrCorrupt: %v", err)
		}
		return
	}
	if len(b) > MaxRowBytes {
		t.Fatalf("accepted %d bytes", len(b))
	}
	out, err := enc()
	if err != nil || !bytes.Equal(out, b) {
		t.Fatalf("accepted row re-encodes as %q, %v; read %q", out, err, b)
	}
}

func FuzzDecodeHead(f *testing.F) {
	seedRows(f, "head")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		h, err := DecodeHead(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeHead(h) })
		if err == nil {
			if k, err := HeadKey(h.Owner, h.Actor); err != nil || k != key {
				t.Fatalf("head read at %q names %q, %v", key, k, err)
			}
			if (h.State == HeadRetiring) != (h.Op != nil) {
				t.Fatalf("accepted state %s with op %v", h.State, h.Op)
			}
		}
	})
}

func FuzzDecodeReservation(f *testing.F) {
	seedRows(f, "reservation")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		r, err := DecodeReservation(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeReservation(r) })
		if err == nil {
			if _, err := ParseUIDKey(key); err != nil {
				t.Fatalf("accepted a reservation at %q", key)
			}
		}
	})
}

func FuzzDecodeFrontier(f *testing.F) {
	seedRows(f, "frontier")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		fr, err := DecodeFrontier(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeFrontier(fr) })
		if err == nil {
			if k, err := FrontierKey(fr.LifecycleUID); err != nil || k != key {
				t.Fatalf("frontier read at %q names %q, %v", key, k, err)
			}
			if op, _ := ManagedRetirementOpID(fr.LifecycleUID); op != fr.OpID {
				t.Fatalf("accepted a foreign opId %q", fr.OpID)
			}
		}
	})
}

func FuzzDecodeSpec(f *testing.F) {
	seedRows(f, "spec")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		s, err := DecodeSpec(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeSpec(s) })
		if err == nil {
			if k, err := SpecKey(s.Endpoint, s.InstanceID); err != nil || k != key {
				t.Fatalf("spec read at %q names %q, %v", key, k, err)
			}
		}
	})
}

func FuzzDecodeGate(f *testing.F) {
	seedRows(f, "gate")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		g, err := DecodeGate(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeGate(g) })
		if err == nil {
			if k, err := GateKey(g.LifecycleUID); err != nil || k != key {
				t.Fatalf("gate read at %q names %q, %v", key, k, err)
			}
			if (g.State == GateOpen) == (g.Op != nil) {
				t.Fatalf("accepted state %s with op %v", g.State, g.Op)
			}
		}
	})
}

func FuzzDecodeEndpointGate(f *testing.F) {
	seedRows(f, "endpoint gate")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		g, err := DecodeEndpointGate(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeEndpointGate(g) })
		if err == nil {
			if (g.State == GateOpen) == (g.Op != nil) {
				t.Fatalf("accepted state %s with op %v", g.State, g.Op)
			}
			if g.RegistrationRevision == 0 {
				t.Fatal("accepted registration revision 0")
			}
		}
	})
}

func FuzzDecodeStage(f *testing.F) {
	seedRows(f, "stage")
	f.Fuzz(func(t *testing.T, key string, b []byte) {
		s, err := DecodeStage(key, b)
		checkDecoded(t, b, err, func() ([]byte, error) { return EncodeStage(s) })
		if err == nil {
			op, _ := ManagedRetirementOpID(s.LifecycleUID)
			if k, err := StageKey(op); err != nil || k != key {
				t.Fatalf("stage read at %q is %q's, %v", key, k, err)
			}
		}
	})
}

// FuzzParseKeys: every key parser refuses with ErrBadKey or returns the tokens its builder turns
// back into the same key.
func FuzzParseKeys(f *testing.F) {
	for _, k := range []string{
		"lifecycle." + tOwner + ".cli", "uid." + tUID, "frontier." + tUID, "svc.com_example_host." + tIID,
		"gate." + tUID, "stage." + tUID, "epgate.manager." + tIID, "epgate.a__b." + tIID, "gate.", "lifecycle..",
		"svc.-a." + tIID, "epgate.a-_b." + tIID, "",
	} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		check := func(family string, built string, berr, perr error) {
			t.Helper()
			if perr != nil {
				if !errors.Is(perr, ErrBadKey) {
					t.Fatalf("%s: refusal of %q does not wrap ErrBadKey: %v", family, key, perr)
				}
				return
			}
			if berr != nil || built != key {
				t.Fatalf("%s: parsed %q, rebuilt %q, %v", family, key, built, berr)
			}
		}
		o, a, perr := ParseHeadKey(key)
		k, berr := HeadKey(o, a)
		check("head", k, berr, perr)
		for family, p := range map[string]struct {
			parse func(string) (string, error)
			build func(string) (string, error)
		}{
			"uid": {ParseUIDKey, UIDKey}, "frontier": {ParseFrontierKey, FrontierKey},
			"gate": {ParseGateKey, GateKey}, "stage": {ParseStageKey, StageKey},
		} {
			u, perr := p.parse(key)
			k, berr := p.build(u)
			check(family, k, berr, perr)
		}
		e, i, perr := ParseSpecKey(key)
		k, berr = SpecKey(e, i)
		check("spec", k, berr, perr)
		e, i, perr = ParseEndpointGateKey(key)
		k, berr = EndpointGateKey(e, i)
		check("epgate", k, berr, perr)
		if name, err := EndpointName(key); err == nil {
			if tok, err := EndpointToken(name); err != nil || tok != key {
				t.Fatalf("endpoint token %q: name %q gives %q, %v", key, name, tok, err)
			}
		}
	})
}

// FuzzDecodeManagerLease: a lease row read from the broker is untrusted bytes; whatever decodes
// is a valid row that encodes and decodes back to itself, and every refusal wraps ErrCorrupt.
func FuzzDecodeManagerLease(f *testing.F) {
	f.Add([]byte(goodLease))
	f.Add([]byte(registeredLease))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"holder":"h","instanceId":"abcdefghijklmnopqrstuvwxyz","runtime":"r","root":"/","pid":1,"since":0} `))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeManagerLease(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("refusal does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if len(b) > MaxRowBytes {
			t.Fatalf("accepted %d bytes", len(b))
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted an invalid row %+v: %v", r, err)
		}
		enc, err := EncodeManagerLease(r)
		if err != nil {
			t.Fatal(err)
		}
		back, err := DecodeManagerLease(enc)
		if err != nil || back != r {
			t.Fatalf("round trip of %+v = %+v, %v", r, back, err)
		}
	})
}

// FuzzDecodeRegisterManagerRequest: authd reads a rail body from any holder of the rail's publish
// grant; whatever decodes names an instance in grammar and re-encodes to a body that decodes the
// same.
func FuzzDecodeRegisterManagerRequest(f *testing.F) {
	f.Add([]byte(goodRegisterRequest))
	f.Add([]byte(`{"v":1,"instanceId":null}`))
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRegisterManagerRequest(b)
		if err != nil {
			return
		}
		enc, err := EncodeRegisterManagerRequest(r.InstanceID)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
		if back, err := DecodeRegisterManagerRequest(enc); err != nil || back != r {
			t.Fatalf("round trip of %+v = %+v, %v", r, back, err)
		}
	})
}

// FuzzDecodeRegisterManagerReply: managerd reads the answer from the broker; whatever decodes is
// in grammar and re-encodes to an answer that decodes the same.
func FuzzDecodeRegisterManagerReply(f *testing.F) {
	f.Add([]byte(goodRegisterOK))
	f.Add([]byte(goodRegisterRefusal))
	f.Add([]byte(`{"v":1,"ok":true,"result":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRegisterManagerReply(b)
		if err != nil {
			return
		}
		enc, err := EncodeRegisterManagerReply(r)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode %+v: %v", b, r, err)
		}
		if back, err := DecodeRegisterManagerReply(enc); err != nil || back != r {
			t.Fatalf("round trip of %+v = %+v, %v", r, back, err)
		}
	})
}

// FuzzDecodeObject: DecodeObject accepts only one JSON object of the struct's fields, and what it
// decoded encodes back to an object it accepts with the same values.
func FuzzDecodeObject(f *testing.F) {
	type coord struct {
		Owner        string `json:"owner"`
		Actor        string `json:"actor"`
		LifecycleUID string `json:"lifecycleUid"`
	}
	f.Add([]byte(`{"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"probe","lifecycleUid":"cccccccccccccccccccccccccc"}`))
	f.Add([]byte(`{"owner":1}`))
	f.Add([]byte(`{} {}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c coord
		if err := DecodeObject(b, &c); err != nil {
			return
		}
		if len(c.Owner)+len(c.Actor)+len(c.LifecycleUID) > len(b) {
			t.Fatalf("decoded more than the body holds")
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var back coord
		if err := DecodeObject(again, &back); err != nil || back != c {
			t.Fatalf("re-decoding %s: %+v, %v", again, back, err)
		}
	})
}

// TestDecodeObjectRefuses: the closed decoder's refusals, each with a value that would otherwise
// decode (the invalid UTF-8 case is FuzzDecodeObject's finding: encoding/json rewrote each bad
// byte as U+FFFD, so the decoded owner was longer than the body).
func TestDecodeObjectRefuses(t *testing.T) {
	type coord struct {
		Owner string `json:"owner"`
	}
	for _, tc := range []struct{ name, body, want string }{
		{"fail/invalid-utf8", "{\"owner\":\"0\xb7\xb7\"}", "UTF-8"},
		{"fail/null", `null`, "one JSON object"},
		{"fail/unknown-field", `{"owner":"a","x":1}`, "documented fields"},
		{"fail/trailing", `{"owner":"a"} {}`, "after its JSON object"},
		{"fail/type", `{"owner":1}`, `"owner" must be a string`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c coord
			err := DecodeObject([]byte(tc.body), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeObject(%q) = %v, want an error naming %q", tc.body, err, tc.want)
			}
		})
	}
	t.Run("ok/utf8", func(t *testing.T) {
		var c coord
		if err := DecodeObject([]byte(`{"owner":"é✓"}`), &c); err != nil || c.Owner != "é✓" {
			t.Fatalf("DecodeObject = %+v, %v", c, err)
		}
	})
}
