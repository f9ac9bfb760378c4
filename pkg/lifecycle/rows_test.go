package lifecycle

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

var (
	tOwner = "u_" + strings.Repeat("a", 26)
	tUID   = strings.Repeat("c", 26)
	tIID   = strings.Repeat("b", 26)
)

func mustOp(t testing.TB, f func(string) (string, error), uid string) string {
	t.Helper()
	op, err := f(uid)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// mustKey builds a test's key; a builder refusing a test's own valid input is a bug in the test.
func mustKey(k string, err error) string {
	if err != nil {
		panic(err)
	}
	return k
}

// rowCase is one family's key, a valid row's golden encoding, and its codec.
type rowCase struct {
	name   string
	key    string
	golden string
	encode func() ([]byte, error)
	decode func(key string, b []byte) (any, error)
}

func rowCases(t testing.TB) []rowCase {
	retire := mustOp(t, ManagedRetirementOpID, tUID)
	activate := mustOp(t, ActivationOpID, tUID)
	born, err := BornGate(tUID)
	if err != nil {
		t.Fatal(err)
	}
	return []rowCase{
		{"head active", mustKey(HeadKey(tOwner, "cli")),
			`{"v":1,"owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","managerInstance":"auth-service:s<&>","processEpoch":1,"state":"active"}`,
			func() ([]byte, error) {
				return EncodeHead(Head{Owner: tOwner, Actor: "cli", LifecycleUID: tUID, ManagerInstance: "auth-service:s<&>", ProcessEpoch: 1, State: HeadActive})
			},
			func(k string, b []byte) (any, error) { return DecodeHead(k, b) }},
		{"head retiring", mustKey(HeadKey(tOwner, "cli")),
			`{"v":1,"owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","managerInstance":"m","processEpoch":1,"state":"retiring","op":{"opId":"` + retire + `","kind":"retirement"}}`,
			func() ([]byte, error) {
				return EncodeHead(Head{Owner: tOwner, Actor: "cli", LifecycleUID: tUID, ManagerInstance: "m", ProcessEpoch: 1, State: HeadRetiring, Op: &Op{retire, OpRetirement}})
			},
			func(k string, b []byte) (any, error) { return DecodeHead(k, b) }},
		{"reservation", mustKey(UIDKey(tUID)),
			`{"v":1,"owner":"` + tOwner + `","actor":"cli","mintedBy":"auth-service:s2420"}`,
			func() ([]byte, error) {
				return EncodeReservation(Reservation{Owner: tOwner, Actor: "cli", MintedBy: "auth-service:s2420"})
			},
			func(k string, b []byte) (any, error) { return DecodeReservation(k, b) }},
		{"frontier", mustKey(FrontierKey(tUID)),
			`{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":[{"stream":"KV_cotal_records_s","seq":9},{"stream":"TASK_s","seq":0}]}`,
			func() ([]byte, error) {
				return EncodeFrontier(Frontier{LifecycleUID: tUID, OpID: retire, Streams: []StreamCutoff{{"KV_cotal_records_s", 9}, {"TASK_s", 0}}})
			},
			func(k string, b []byte) (any, error) { return DecodeFrontier(k, b) }},
		{"frontier without streams", mustKey(FrontierKey(tUID)),
			`{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":[]}`,
			func() ([]byte, error) { return EncodeFrontier(Frontier{LifecycleUID: tUID, OpID: retire}) },
			func(k string, b []byte) (any, error) { return DecodeFrontier(k, b) }},
		{"spec", mustKey(SpecKey("com.example.host", tIID)),
			`{"v":1,"endpoint":"com.example.host","instanceId":"` + tIID + `","principal":"` + tOwner + `.cli","processEpoch":0}`,
			func() ([]byte, error) {
				return EncodeSpec(Spec{Endpoint: "com.example.host", InstanceID: tIID, Principal: tOwner + ".cli"})
			},
			func(k string, b []byte) (any, error) { return DecodeSpec(k, b) }},
		{"gate born", mustKey(GateKey(tUID)),
			`{"v":1,"lifecycleUid":"` + tUID + `","state":"frozen","generation":0,"op":{"opId":"` + activate + `","kind":"activation"}}`,
			func() ([]byte, error) { return EncodeGate(born) },
			func(k string, b []byte) (any, error) { return DecodeGate(k, b) }},
		{"gate open", mustKey(GateKey(tUID)),
			`{"v":1,"lifecycleUid":"` + tUID + `","state":"open","generation":1}`,
			func() ([]byte, error) { return EncodeGate(Gate{LifecycleUID: tUID, State: GateOpen, Generation: 1}) },
			func(k string, b []byte) (any, error) { return DecodeGate(k, b) }},
		{"gate retired", mustKey(GateKey(tUID)),
			`{"v":1,"lifecycleUid":"` + tUID + `","state":"retired","generation":1,"op":{"opId":"` + retire + `","kind":"retirement"}}`,
			func() ([]byte, error) {
				return EncodeGate(Gate{LifecycleUID: tUID, State: GateRetired, Generation: 1, Op: &Op{retire, OpRetirement}})
			},
			func(k string, b []byte) (any, error) { return DecodeGate(k, b) }},
		{"endpoint gate open", mustKey(EndpointGateKey(ManagerEndpoint, tIID)),
			`{"v":1,"state":"open","principal":"` + tOwner + `.cli","processEpoch":0,"registrationRevision":7,"generation":1}`,
			func() ([]byte, error) {
				return EncodeEndpointGate(EndpointGate{State: GateOpen, Principal: tOwner + ".cli", RegistrationRevision: 7, Generation: 1})
			},
			func(k string, b []byte) (any, error) { return DecodeEndpointGate(k, b) }},
		{"endpoint gate frozen", mustKey(EndpointGateKey(ManagerEndpoint, tIID)),
			`{"v":1,"state":"frozen","principal":"` + tOwner + `.cli","processEpoch":2,"registrationRevision":7,"generation":3,"op":{"opId":"835331ed567b0440297e4d951c","kind":"registration"}}`,
			func() ([]byte, error) {
				return EncodeEndpointGate(EndpointGate{State: GateFrozen, Principal: tOwner + ".cli", ProcessEpoch: 2, RegistrationRevision: 7, Generation: 3, Op: &Op{"835331ed567b0440297e4d951c", OpRegistration}})
			},
			func(k string, b []byte) (any, error) { return DecodeEndpointGate(k, b) }},
		{"stage", mustKey(StageKey(retire)),
			`{"v":1,"kind":"retirement","owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","fromGeneration":1}`,
			func() ([]byte, error) {
				return EncodeStage(Stage{Kind: OpRetirement, Owner: tOwner, Actor: "cli", LifecycleUID: tUID, FromGeneration: 1})
			},
			func(k string, b []byte) (any, error) { return DecodeStage(k, b) }},
	}
}

func TestRows(t *testing.T) {
	for _, c := range rowCases(t) {
		t.Run("ok/"+c.name, func(t *testing.T) {
			b, err := c.encode()
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != c.golden {
				t.Fatalf("encoded\n%s\nwant\n%s", b, c.golden)
			}
			if _, err := c.decode(c.key, b); err != nil {
				t.Fatalf("decode: %v", err)
			}
		})
		// Every refusal wraps ErrCorrupt.
		for _, bad := range []struct{ name, b string }{
			{"empty", ""},
			{"null", "null"},
			{"version 2", strings.Replace(c.golden, `"v":1`, `"v":2`, 1)},
			{"no version", "{" + c.golden[len(rowPrefix):]},
			{"version twice", strings.Replace(c.golden, `{"v":1,`, `{"v":1,"v":1,`, 1)},
			{"unknown field", strings.TrimSuffix(c.golden, "}") + `,"x":1}`},
			{"trailing data", c.golden + "{}"},
			{"whitespace", strings.Replace(c.golden, `,"`, `, "`, 1)},
			{"trailing newline", c.golden + "\n"},
			{"truncated", c.golden[:len(c.golden)-1]},
			{"re-cased field", strings.Replace(c.golden, `,"`, `,"X`, 1)},
			{"escaped letter", rowPrefix + `"` + fmt.Sprintf(`\u%04x`, c.golden[len(rowPrefix)+1]) + c.golden[len(rowPrefix)+2:]},
			{"oversized", c.golden[:len(c.golden)-1] + strings.Repeat(" ", MaxRowBytes) + "}"},
		} {
			t.Run("fail/"+c.name+"/"+bad.name, func(t *testing.T) {
				if bad.b == c.golden {
					t.Fatal("the mutation left the row unchanged")
				}
				if r, err := c.decode(c.key, []byte(bad.b)); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("decoded %+v, err %v", r, err)
				}
			})
		}
		t.Run("fail/"+c.name+"/wrong family key", func(t *testing.T) {
			for _, k := range []string{"x." + tUID, "", "plane", c.key + ".x"} {
				if r, err := c.decode(k, []byte(c.golden)); !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrBadKey) {
					t.Fatalf("%q: decoded %+v, err %v", k, r, err)
				}
			}
		})
	}
}

// TestRowRefusals: rows with valid JSON and a state, op, integer or identity this package refuses.
func TestRowRefusals(t *testing.T) {
	retire := mustOp(t, ManagedRetirementOpID, tUID)
	activate := mustOp(t, ActivationOpID, tUID)
	other := strings.Repeat("d", 26)
	otherRetire := mustOp(t, ManagedRetirementOpID, other)
	head := mustKey(HeadKey(tOwner, "cli"))
	gate := mustKey(GateKey(tUID))
	epgate := mustKey(EndpointGateKey(ManagerEndpoint, tIID))
	stage := mustKey(StageKey(retire))
	frontier := mustKey(FrontierKey(tUID))
	spec := mustKey(SpecKey(ManagerEndpoint, tIID))
	res := mustKey(UIDKey(tUID))
	h := func(s string) string {
		return `{"v":1,"owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","managerInstance":"m",` + s + `}`
	}
	g := func(s string) string { return `{"v":1,"lifecycleUid":"` + tUID + `",` + s + `}` }
	eg := func(s string) string { return `{"v":1,` + s + `}` }
	cases := []struct {
		name string
		dec  func(string, []byte) (any, error)
		key  string
		b    string
	}{
		{"head/epoch 0", decHead, head, h(`"processEpoch":0,"state":"active"`)},
		{"head/epoch negative", decHead, head, h(`"processEpoch":-1,"state":"active"`)},
		{"head/epoch float", decHead, head, h(`"processEpoch":1.5,"state":"active"`)},
		{"head/epoch above 2^53-1", decHead, head, h(`"processEpoch":9007199254740992,"state":"active"`)},
		{"head/epoch string", decHead, head, h(`"processEpoch":"1","state":"active"`)},
		{"head/state", decHead, head, h(`"processEpoch":1,"state":"current"`)},
		{"head/retiring without op", decHead, head, h(`"processEpoch":1,"state":"retiring"`)},
		{"head/active with op", decHead, head, h(`"processEpoch":1,"state":"active","op":{"opId":"` + retire + `","kind":"retirement"}`)},
		{"head/foreign op", decHead, head, h(`"processEpoch":1,"state":"retiring","op":{"opId":"` + otherRetire + `","kind":"retirement"}`)},
		{"head/op kind", decHead, head, h(`"processEpoch":1,"state":"retiring","op":{"opId":"` + retire + `","kind":"takeover"}`)},
		{"head/op null", decHead, head, h(`"processEpoch":1,"state":"active","op":null`)},
		{"head/op unknown field", decHead, head, h(`"processEpoch":1,"state":"retiring","op":{"opId":"` + retire + `","kind":"retirement","successor":"x"}`)},
		{"head/other alias", decHead, mustKey(HeadKey(tOwner, "bob")), h(`"processEpoch":1,"state":"active"`)},
		{"head/control in label", decHead, head, strings.Replace(h(`"processEpoch":1,"state":"active"`), `"m"`, `"m\n"`, 1)},
		{"head/bad uid", decHead, head, strings.Replace(h(`"processEpoch":1,"state":"active"`), tUID, "C"+tUID[1:], 1)},
		{"head/missing field", decHead, head, `{"v":1,"owner":"` + tOwner + `","actor":"cli","managerInstance":"m","processEpoch":1,"state":"active"}`},
		{"gate/open at 0", decGate, gate, g(`"state":"open","generation":0`)},
		{"gate/open with op", decGate, gate, g(`"state":"open","generation":1,"op":{"opId":"` + retire + `","kind":"retirement"}`)},
		{"gate/frozen without op", decGate, gate, g(`"state":"frozen","generation":1`)},
		{"gate/state", decGate, gate, g(`"state":"closed","generation":1`)},
		{"gate/activation past 0", decGate, gate, g(`"state":"frozen","generation":1,"op":{"opId":"` + activate + `","kind":"activation"}`)},
		{"gate/foreign activation", decGate, gate, g(`"state":"frozen","generation":0,"op":{"opId":"` + retire + `","kind":"activation"}`)},
		{"gate/foreign retirement", decGate, gate, g(`"state":"frozen","generation":1,"op":{"opId":"` + otherRetire + `","kind":"retirement"}`)},
		{"gate/registration", decGate, gate, g(`"state":"frozen","generation":1,"op":{"opId":"` + retire + `","kind":"registration"}`)},
		{"gate/other uid", decGate, mustKey(GateKey(other)), g(`"state":"open","generation":1`)},
		{"epgate/revision 0", decEpgate, epgate, eg(`"state":"open","principal":"o.a","processEpoch":0,"registrationRevision":0,"generation":1`)},
		{"epgate/principal", decEpgate, epgate, eg(`"state":"open","principal":"oa","processEpoch":0,"registrationRevision":1,"generation":1`)},
		{"epgate/principal three tokens", decEpgate, epgate, eg(`"state":"open","principal":"o.a.b","processEpoch":0,"registrationRevision":1,"generation":1`)},
		{"epgate/retired by registration", decEpgate, epgate, eg(`"state":"retired","principal":"o.a","processEpoch":0,"registrationRevision":1,"generation":1,"op":{"opId":"` + tUID + `","kind":"registration"}`)},
		{"epgate/activation", decEpgate, epgate, eg(`"state":"frozen","principal":"o.a","processEpoch":0,"registrationRevision":1,"generation":1,"op":{"opId":"` + tUID + `","kind":"activation"}`)},
		{"epgate/bad opId", decEpgate, epgate, eg(`"state":"frozen","principal":"o.a","processEpoch":0,"registrationRevision":1,"generation":1,"op":{"opId":"x","kind":"registration"}`)},
		{"epgate/registration op of another epoch", decEpgate, epgate, eg(`"state":"frozen","principal":"o.a","processEpoch":0,"registrationRevision":1,"generation":1,"op":{"opId":"835331ed567b0440297e4d951c","kind":"registration"}`)},
		{"epgate/nameAuthorityRevision", decEpgate, epgate, eg(`"state":"open","principal":"o.a","processEpoch":0,"registrationRevision":1,"generation":1,"nameAuthorityRevision":0`)},
		{"stage/kind", decStage, stage, `{"v":1,"kind":"activation","owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","fromGeneration":1}`},
		{"stage/generation 0", decStage, stage, `{"v":1,"kind":"retirement","owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","fromGeneration":0}`},
		{"stage/other opId", decStage, mustKey(StageKey(otherRetire)), `{"v":1,"kind":"retirement","owner":"` + tOwner + `","actor":"cli","lifecycleUid":"` + tUID + `","fromGeneration":1}`},
		{"frontier/foreign op", decFrontier, frontier, `{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + otherRetire + `","streams":[]}`},
		{"frontier/streams null", decFrontier, frontier, `{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":null}`},
		{"frontier/unsorted", decFrontier, frontier, `{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":[{"stream":"B","seq":1},{"stream":"A","seq":1}]}`},
		{"frontier/duplicate", decFrontier, frontier, `{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":[{"stream":"A","seq":1},{"stream":"A","seq":1}]}`},
		{"frontier/stream name", decFrontier, frontier, `{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":[{"stream":"A.B","seq":1}]}`},
		{"frontier/other uid", decFrontier, mustKey(FrontierKey(other)), `{"v":1,"lifecycleUid":"` + tUID + `","opId":"` + retire + `","streams":[]}`},
		{"spec/other instance", decSpec, spec, `{"v":1,"endpoint":"manager","instanceId":"` + other + `","principal":"o.a","processEpoch":0}`},
		{"spec/other endpoint", decSpec, spec, `{"v":1,"endpoint":"host","instanceId":"` + tIID + `","principal":"o.a","processEpoch":0}`},
		{"reservation/empty mintedBy", decReservation, res, `{"v":1,"owner":"o","actor":"a","mintedBy":""}`},
		{"reservation/owner", decReservation, res, `{"v":1,"owner":"o*","actor":"a","mintedBy":"m"}`},
	}
	for _, c := range cases {
		t.Run("fail/"+c.name, func(t *testing.T) {
			if r, err := c.dec(c.key, []byte(c.b)); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decoded %+v, err %v", r, err)
			}
		})
	}
	t.Run("fail/encode refuses what decode refuses", func(t *testing.T) {
		if b, err := EncodeHead(Head{Owner: tOwner, Actor: "cli", LifecycleUID: tUID, ManagerInstance: "m", State: HeadActive}); err == nil {
			t.Fatalf("encoded %s", b)
		}
		if b, err := EncodeGate(Gate{LifecycleUID: tUID, State: GateFrozen, Generation: 1}); err == nil {
			t.Fatalf("encoded %s", b)
		}
		if b, err := EncodeEndpointGate(EndpointGate{State: GateOpen, Principal: "o.a"}); err == nil {
			t.Fatalf("encoded %s", b)
		}
	})
}

func decHead(k string, b []byte) (any, error)        { return DecodeHead(k, b) }
func decGate(k string, b []byte) (any, error)        { return DecodeGate(k, b) }
func decEpgate(k string, b []byte) (any, error)      { return DecodeEndpointGate(k, b) }
func decStage(k string, b []byte) (any, error)       { return DecodeStage(k, b) }
func decFrontier(k string, b []byte) (any, error)    { return DecodeFrontier(k, b) }
func decSpec(k string, b []byte) (any, error)        { return DecodeSpec(k, b) }
func decReservation(k string, b []byte) (any, error) { return DecodeReservation(k, b) }
