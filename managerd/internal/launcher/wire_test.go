package launcher

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func testConfig(t *testing.T) Config {
	t.Helper()
	u := func(v uint32) *uint32 { return &v }
	c := Config{
		Socket: "/run/l/l.sock", TokenFile: "/run/m/token", AgentRoot: "/var/lib/agents",
		Manager:    IDs{UID: u(990), GID: u(990)},
		Agents:     UIDRange{UIDFirst: u(60600), UIDCount: 16},
		Connectors: map[string]Connector{"echo": {Argv: []string{"/usr/bin/echo"}}},
		EnvAllow:   []string{"TERM", "COTAL_SUBSCRIBE"},
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

func reasonOf(err error) Reason {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

// TestValidate: a well-formed launch passes; a name that is not one safe path segment, an
// unknown connector, another target uid or gid, an environment key outside the allow-list (or
// reserved to the launcher), over-long values and material, and mixed operations are refused
// with their reason.
func TestValidate(t *testing.T) {
	cfg := testConfig(t)
	u := func(v uint32) *uint32 { return &v }
	good := func() *wireRequest {
		return &wireRequest{Op: opLaunch, Request: Request{Name: "alice-1", Connector: "echo",
			Env: map[string]string{"TERM": "xterm"}, Material: []byte("{}")}}
	}
	if err := cfg.validate(good()); err != nil {
		t.Fatalf("good request refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		mut  func(r *wireRequest)
		want Reason
	}{
		{"ok/minimal", func(r *wireRequest) { r.UID, r.GID, r.Env, r.Material = nil, nil, nil, nil }, ""},
		{"ok/signal", func(r *wireRequest) { *r = wireRequest{Op: opSignal, Pid: 42, StartTime: 7, Signal: "TERM"} }, ""},
		{"fail/name-slash", func(r *wireRequest) { r.Name = "a/b" }, ReasonNameInvalid},
		{"fail/name-dotdot", func(r *wireRequest) { r.Name = ".." }, ReasonNameInvalid},
		{"fail/name-traversal", func(r *wireRequest) { r.Name = "../../etc" }, ReasonNameInvalid},
		{"fail/name-dot", func(r *wireRequest) { r.Name = "." }, ReasonNameInvalid},
		{"fail/name-empty", func(r *wireRequest) { r.Name = "" }, ReasonNameInvalid},
		{"fail/name-nul", func(r *wireRequest) { r.Name = "a\x00b" }, ReasonNameInvalid},
		{"fail/name-newline", func(r *wireRequest) { r.Name = "a\n" }, ReasonNameInvalid},
		{"fail/name-long", func(r *wireRequest) { r.Name = strings.Repeat("a", 65) }, ReasonNameInvalid},
		{"fail/connector-unknown", func(r *wireRequest) { r.Connector = "bash" }, ReasonConnectorUnknown},
		{"fail/connector-path", func(r *wireRequest) { r.Connector = "/bin/sh" }, ReasonConnectorUnknown},
		{"fail/uid-root", func(r *wireRequest) { r.UID = u(0) }, ReasonTargetNotAllowed},
		{"fail/uid-manager", func(r *wireRequest) { r.UID = u(990) }, ReasonTargetNotAllowed},
		{"fail/uid-in-range", func(r *wireRequest) { r.UID = u(60600) }, ReasonTargetNotAllowed},
		{"fail/gid-in-range", func(r *wireRequest) { r.GID = u(60601) }, ReasonTargetNotAllowed},
		{"fail/gid-other", func(r *wireRequest) { r.GID = u(0) }, ReasonTargetNotAllowed},
		{"ok/probe", func(r *wireRequest) { *r = wireRequest{Op: opSignal, Pid: 42, StartTime: 7, Signal: "PROBE"} }, ""},
		{"fail/env-unlisted", func(r *wireRequest) { r.Env = map[string]string{"SECRET": "x"} }, ReasonEnvNotAllowed},
		{"fail/env-path", func(r *wireRequest) { r.Env = map[string]string{"PATH": "/tmp"} }, ReasonEnvNotAllowed},
		{"fail/env-material", func(r *wireRequest) { r.Env = map[string]string{EnvLaunchMaterial: "/etc/shadow"} }, ReasonEnvNotAllowed},
		{"fail/env-ld", func(r *wireRequest) { r.Env = map[string]string{"LD_PRELOAD": "/x.so"} }, ReasonEnvNotAllowed},
		{"fail/env-key", func(r *wireRequest) { r.Env = map[string]string{"TERM=x": "y"} }, ReasonEnvNotAllowed},
		{"fail/env-value-nul", func(r *wireRequest) { r.Env = map[string]string{"TERM": "a\x00"} }, ReasonEnvNotAllowed},
		{"fail/env-value-long", func(r *wireRequest) { r.Env = map[string]string{"TERM": strings.Repeat("x", 4097)} }, ReasonEnvNotAllowed},
		{"fail/env-many", func(r *wireRequest) {
			r.Env = map[string]string{}
			for i := range 33 {
				r.Env["V"+strings.Repeat("A", i)] = ""
			}
		}, ReasonEnvNotAllowed},
		{"fail/material-long", func(r *wireRequest) { r.Material = make([]byte, MaxMaterialBytes+1) }, ReasonTooLarge},
		{"fail/op-unknown", func(r *wireRequest) { r.Op = "exec" }, ReasonBadRequest},
		{"fail/op-empty", func(r *wireRequest) { r.Op = "" }, ReasonBadRequest},
		{"fail/launch-with-pid", func(r *wireRequest) { r.Pid = 1234 }, ReasonBadRequest},
		{"fail/signal-with-name", func(r *wireRequest) {
			*r = wireRequest{Op: opSignal, Pid: 42, StartTime: 7, Signal: "TERM", Request: Request{Name: "x"}}
		}, ReasonBadRequest},
		{"fail/signal-init", func(r *wireRequest) { *r = wireRequest{Op: opSignal, Pid: 1, StartTime: 7, Signal: "KILL"} }, ReasonBadRequest},
		{"fail/signal-group", func(r *wireRequest) { *r = wireRequest{Op: opSignal, Pid: -5, StartTime: 7, Signal: "KILL"} }, ReasonBadRequest},
		{"fail/signal-other", func(r *wireRequest) { *r = wireRequest{Op: opSignal, Pid: 42, StartTime: 7, Signal: "STOP"} }, ReasonBadRequest},
		{"fail/signal-no-start", func(r *wireRequest) { *r = wireRequest{Op: opSignal, Pid: 42, Signal: "TERM"} }, ReasonBadRequest},
		{"ok/replace", func(r *wireRequest) { *r = replaceReq(42, 7, []byte("{}")) }, ""},
		{"ok/replace-at-limit", func(r *wireRequest) { *r = replaceReq(42, 7, make([]byte, MaxMaterialBytes)) }, ""},
		{"fail/replace-no-material", func(r *wireRequest) { *r = replaceReq(42, 7, nil) }, ReasonBadRequest},
		{"fail/replace-material-long", func(r *wireRequest) { *r = replaceReq(42, 7, make([]byte, MaxMaterialBytes+1)) }, ReasonTooLarge},
		{"fail/replace-init", func(r *wireRequest) { *r = replaceReq(1, 7, []byte("{}")) }, ReasonBadRequest},
		{"fail/replace-group", func(r *wireRequest) { *r = replaceReq(-5, 7, []byte("{}")) }, ReasonBadRequest},
		{"fail/replace-no-start", func(r *wireRequest) { *r = replaceReq(42, 0, []byte("{}")) }, ReasonBadRequest},
		{"fail/replace-with-name", func(r *wireRequest) { *r = replaceReq(42, 7, []byte("{}")); r.Name = "other" }, ReasonBadRequest},
		{"fail/replace-with-uid", func(r *wireRequest) { *r = replaceReq(42, 7, []byte("{}")); r.UID = u(0) }, ReasonBadRequest},
		{"fail/replace-with-env", func(r *wireRequest) {
			*r = replaceReq(42, 7, []byte("{}"))
			r.Env = map[string]string{"TERM": "x"}
		}, ReasonBadRequest},
		{"fail/replace-with-signal", func(r *wireRequest) { *r = replaceReq(42, 7, []byte("{}")); r.Signal = "KILL" }, ReasonBadRequest},
		{"fail/replace-with-connector", func(r *wireRequest) { *r = replaceReq(42, 7, []byte("{}")); r.Connector = "echo" }, ReasonBadRequest},
		{"fail/signal-with-material", func(r *wireRequest) {
			*r = wireRequest{Op: opSignal, Pid: 42, StartTime: 7, Signal: "TERM", Request: Request{Material: []byte("x")}}
		}, ReasonBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := good()
			tc.mut(r)
			err := cfg.validate(r)
			if got := reasonOf(err); got != tc.want || (tc.want == "") != (err == nil) {
				t.Fatalf("validate: %v (reason %q), want reason %q", err, got, tc.want)
			}
		})
	}
}

func replaceReq(pid int, start uint64, material []byte) wireRequest {
	return wireRequest{Op: opReplace, Pid: pid, StartTime: start, Request: Request{Material: material}}
}

// TestCheckToken: only the exact token passes; a wrong, short, long, empty or non-hex one is
// TOKEN_INVALID.
func TestCheckToken(t *testing.T) {
	want := bytes.Repeat([]byte{0xab}, tokenBytes)
	good := hex.EncodeToString(want)
	if err := checkToken(want, good); err != nil {
		t.Fatalf("right token refused: %v", err)
	}
	wrong := []byte(good)
	wrong[10] = 'c'
	for name, tok := range map[string]string{
		"fail/wrong": string(wrong), "fail/empty": "", "fail/short": good[:62], "fail/long": good + "ab",
		"fail/not-hex": strings.Repeat("zz", tokenBytes), "fail/upper": strings.ToUpper(good[:2]) + good[2:] + "x",
	} {
		t.Run(name, func(t *testing.T) {
			if got := reasonOf(checkToken(want, tok)); got != ReasonTokenInvalid {
				t.Fatalf("token %q: reason %q, want TOKEN_INVALID", tok, got)
			}
		})
	}
}

// TestReadFrame: a frame announcing more than the limit is refused before its body is read
// (the reader holds no body at all); a frame at the limit is read whole; a short body is an error.
func TestReadFrame(t *testing.T) {
	hdr := func(n uint32) []byte { b := make([]byte, 4); binary.BigEndian.PutUint32(b, n); return b }
	_, err := readFrame(bytes.NewReader(hdr(MaxRequestBytes+1)), MaxRequestBytes)
	if reasonOf(err) != ReasonTooLarge {
		t.Fatalf("over-long frame: %v, want TOO_LARGE", err)
	}
	_, err = readFrame(bytes.NewReader(hdr(^uint32(0))), MaxRequestBytes)
	if reasonOf(err) != ReasonTooLarge {
		t.Fatalf("4 GiB frame: %v, want TOO_LARGE", err)
	}
	body := bytes.Repeat([]byte("x"), MaxRequestBytes)
	got, err := readFrame(bytes.NewReader(append(hdr(MaxRequestBytes), body...)), MaxRequestBytes)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("frame at the limit: %d bytes, %v", len(got), err)
	}
	if _, err := readFrame(bytes.NewReader(append(hdr(10), "short"...)), MaxRequestBytes); err == nil {
		t.Fatal("a truncated frame was read")
	}
}

// TestDecodeRequest: strict JSON: unknown fields, trailing data, wrong types and over-long bodies
// are refused; a request round-trips.
func TestDecodeRequest(t *testing.T) {
	u := uint32(991)
	in := wireRequest{Op: opLaunch, Token: "ab", Request: Request{Name: "a", Connector: "echo", UID: &u,
		Env: map[string]string{"TERM": "x"}, Material: []byte{0, 1, 2}, Rows: 24, Cols: 80}}
	b, _ := json.Marshal(in)
	got, err := decodeRequest(b)
	if err != nil || !reflect.DeepEqual(*got, in) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	for name, body := range map[string]string{
		"fail/unknown-field": `{"op":"launch","command":"/bin/sh"}`,
		"fail/argv":          `{"op":"launch","argv":["/bin/sh"]}`,
		"fail/trailing":      `{"op":"launch"} {}`,
		"fail/trailing-junk": `{"op":"launch"}x`,
		"fail/array":         `[]`,
		"fail/uid-type":      `{"op":"launch","uid":"0"}`,
		"fail/uid-negative":  `{"op":"launch","uid":-1}`,
		"fail/rows-overflow": `{"op":"launch","rows":70000}`,
		"fail/empty":         ``,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := decodeRequest([]byte(body)); reasonOf(err) != ReasonBadRequest {
				t.Fatalf("%s: %v, want BAD_REQUEST", body, err)
			}
		})
	}
	if _, err := decodeRequest(make([]byte, MaxRequestBytes+1)); reasonOf(err) != ReasonTooLarge {
		t.Fatalf("over-long body: %v, want TOO_LARGE", err)
	}
}

// FuzzDecodeRequest: the request decoder and validator never panic on any bytes, and whatever
// they accept is within every bound and re-encodes to a request that decodes and validates the
// same.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"op":"launch","token":"00","name":"alice","connector":"echo","uid":991,"env":{"TERM":"x"},"material":"AAEC"}`))
	f.Add([]byte(`{"op":"signal","token":"00","pid":42,"start_time":7,"signal":"KILL"}`))
	f.Add([]byte(`{"op":"launch","name":"../x","connector":"echo"}`))
	f.Add([]byte(`{"op":"launch","name":"a","name":"b"}`))
	f.Add([]byte(`{"op":"launch","rows":65535,"cols":1}`))
	f.Add([]byte(`{"op":"replace_material","token":"00","pid":42,"start_time":7,"material":"eyJ2ZXJzaW9uIjoxfQ=="}`))
	f.Add([]byte(`{"op":"replace_material","pid":42,"start_time":7,"material":""}`))
	f.Add([]byte(`{"op":"replace_material","pid":42,"start_time":7,"material":"AA==","name":"x","signal":"KILL"}`))
	f.Add([]byte(`{"op":"replace_material","pid":42,"start_time":7,"material":"!!"}`))
	cfg := Config{}
	{
		u := func(v uint32) *uint32 { return &v }
		cfg = Config{Socket: "/r/l.sock", TokenFile: "/r/m/t", AgentRoot: "/a",
			Manager: IDs{UID: u(990), GID: u(990)}, Agents: UIDRange{UIDFirst: u(60600), UIDCount: 16},
			Connectors: map[string]Connector{"echo": {Argv: []string{"/bin/echo"}}}, EnvAllow: []string{"TERM"}}
		if err := cfg.Validate(); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeRequest(body)
		if err != nil {
			if reasonOf(err) == "" {
				t.Fatalf("decode error without a reason: %v", err)
			}
			return
		}
		if err := cfg.validate(req); err != nil {
			if reasonOf(err) == "" {
				t.Fatalf("validate error without a reason: %v", err)
			}
			return
		}
		if req.Op == opLaunch {
			if !validName(req.Name) || strings.Contains(req.Name, "/") || req.Name == ".." || req.Name == "." {
				t.Fatalf("accepted name %q", req.Name)
			}
			if _, ok := cfg.Connectors[req.Connector]; !ok {
				t.Fatalf("accepted connector %q", req.Connector)
			}
			if req.UID != nil || req.GID != nil {
				t.Fatalf("accepted target %v/%v", req.UID, req.GID)
			}
			for k, v := range req.Env {
				if k != "TERM" || len(v) > maxEnvValue || strings.IndexByte(v, 0) >= 0 {
					t.Fatalf("accepted env %q=%q", k, v)
				}
			}
			if len(req.Material) > MaxMaterialBytes {
				t.Fatalf("accepted %d bytes of material", len(req.Material))
			}
		}
		if req.Op == opReplace {
			if req.Pid <= 1 || req.StartTime == 0 || req.Material == nil || len(req.Material) > MaxMaterialBytes {
				t.Fatalf("accepted replace_material pid %d start %d with %d bytes", req.Pid, req.StartTime, len(req.Material))
			}
			if req.Name != "" || req.Connector != "" || req.UID != nil || req.GID != nil || req.Env != nil || req.Signal != "" {
				t.Fatalf("accepted replace_material with launch or signal fields: %+v", req)
			}
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := decodeRequest(again)
		if err != nil {
			t.Fatalf("re-encoded request refused: %v", err)
		}
		if err := cfg.validate(req2); err != nil {
			t.Fatalf("re-encoded request invalid: %v", err)
		}
		if !reflect.DeepEqual(req, req2) {
			t.Fatalf("re-encoding changed the request: %+v vs %+v", req, req2)
		}
	})
}

// TestParseProcStat: the start time and state are read after the last ')', so a command name with
// spaces and parentheses cannot shift the fields; malformed lines are errors.
func TestParseProcStat(t *testing.T) {
	rest := " 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 1000 10"
	st, err := parseProcStat([]byte("4242 (a) b) S" + rest + " 18446744073709551615 1 2\n"))
	if err != nil || st.State != 'S' || st.StartTime != 123456 {
		t.Fatalf("parse: %+v, %v", st, err)
	}
	st, err = parseProcStat([]byte("7 (x y) Z" + rest + "\n"))
	if err != nil || st.State != 'Z' || st.StartTime != 123456 {
		t.Fatalf("parse zombie: %+v, %v", st, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) SS" + rest, "1 (x) S 1 1 1 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 notanumber 1"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Fatalf("parsed %q", bad)
		}
	}
}
