package launcher

import (
	"bytes"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// The wire: one request frame from the client, one response frame back, then the connection
// closes. A frame is a 4-byte big-endian length and that many bytes of JSON. A successful launch's
// response carries the PTY master as SCM_RIGHTS ancillary data on its first byte.

// Bounds on a request. A frame announcing more than MaxRequestBytes is refused before its body is
// read.
const (
	MaxRequestBytes  = 160 << 10
	MaxResponseBytes = 4 << 10
	MaxMaterialBytes = 64 << 10
	maxNameLen       = 64
	maxEnv           = 32
	maxEnvKey        = 128
	maxEnvValue      = 4096
	tokenBytes       = 32
)

// EnvLaunchMaterial names the file holding the agent's launch material (credentials, servers):
// the launcher writes the request's material to <agent dir>/launch-material (0600, the agent's)
// and puts only its path in this variable.
const EnvLaunchMaterial = "COTAL_LAUNCH_MATERIAL"

// Request asks the launcher to start one agent. It names no command, path or environment source:
// the connector's argv comes from the launcher's configuration, the agent's uid from its range.
type Request struct {
	// Name is the agent's name, ^[A-Za-z0-9_-]+$, at most 64 bytes; its directory is
	// <agent_root>/<name>. Required.
	Name string `json:"name"`
	// Connector names an entry of the launcher's connector table. Required.
	Connector string `json:"connector"`
	// UID and GID must be unset: the launcher assigns each agent a uid of its own from its range
	// (and the gid of the same number). A request naming either is refused TARGET_NOT_ALLOWED;
	// the fields stay on the wire so that such a request hears that reason, not BAD_REQUEST.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	// Env is set in the agent's environment; each key must be in the launcher's env_allow. At most
	// 32 entries, keys 128 bytes, values 4096 bytes, no NUL.
	Env map[string]string `json:"env,omitempty"`
	// Material is written to <agent dir>/launch-material (0600, owned by the agent uid) and its
	// path alone is set in COTAL_LAUNCH_MATERIAL. Optional (empty is none, and removes an earlier
	// agent's file); at most 64 KiB.
	Material []byte `json:"material,omitempty"`
	// Rows and Cols are the terminal's initial size. Optional (0: the kernel's default).
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// Child is a started agent: its pid (also its process group and session id) and its start time
// in clock ticks since boot (field 22 of /proc/<pid>/stat), which together name this process and
// no later one that reuses the pid.
type Child struct {
	Pid       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	// Dir is the agent's directory.
	Dir string `json:"dir"`
	// UID is the uid (and gid) the launcher assigned the agent from its range, held until the
	// agent's cgroup is proven empty.
	UID uint32 `json:"uid,omitempty"`
}

// Operations.
const (
	opLaunch  = "launch"
	opSignal  = "signal"
	opReplace = "replace_material"
)

// wireRequest is a request as sent: the caller's Request, the operation and the token.
type wireRequest struct {
	Op    string `json:"op"`
	Token string `json:"token"`
	Request
	// Signal and replace_material: the child (pid and start time); signal: the signal, TERM,
	// KILL or PROBE (no signal: OK while any process of the child's cgroup may live,
	// CHILD_UNKNOWN once the launcher has proven it empty and released the child). replace_material carries the new material in Request.Material.
	Pid       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
	Signal    string `json:"signal,omitempty"`
}

// Reason is why the launcher refused a request. The values are stable.
type Reason string

// Reasons.
const (
	ReasonPeerNotAllowed    Reason = "PEER_NOT_ALLOWED"
	ReasonTokenInvalid      Reason = "TOKEN_INVALID"
	ReasonTooLarge          Reason = "TOO_LARGE"
	ReasonBadRequest        Reason = "BAD_REQUEST"
	ReasonNameInvalid       Reason = "NAME_INVALID"
	ReasonConnectorUnknown  Reason = "CONNECTOR_UNKNOWN"
	ReasonTargetNotAllowed  Reason = "TARGET_NOT_ALLOWED"
	ReasonEnvNotAllowed     Reason = "ENV_NOT_ALLOWED"
	ReasonChildUnknown      Reason = "CHILD_UNKNOWN"
	ReasonNameInUse         Reason = "NAME_IN_USE"
	ReasonLaunchFailed      Reason = "LAUNCH_FAILED"
	ReasonResourceExhausted Reason = "RESOURCE_EXHAUSTED"
	// ReasonUIDsExhausted: every uid of the agents' range is held by a running agent (or one
	// whose cgroup is not yet proven empty); a launch succeeds again once one is released.
	ReasonUIDsExhausted Reason = "UIDS_EXHAUSTED"
)

// response is the launcher's one answer.
type response struct {
	OK      bool   `json:"ok"`
	Reason  Reason `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Child   *Child `json:"child,omitempty"`
}

// RefusedError is a refusal from the launcher: a stable Reason and a short message.
type RefusedError struct {
	Reason  Reason
	Message string
}

func (e *RefusedError) Error() string {
	if e.Message == "" {
		return "launcher refused: " + string(e.Reason)
	}
	return fmt.Sprintf("launcher refused: %s: %s", e.Reason, e.Message)
}

func refuse(r Reason, format string, args ...any) *RefusedError {
	return &RefusedError{Reason: r, Message: fmt.Sprintf(format, args...)}
}

// frame encodes one frame.
func frame(body []byte) []byte {
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	return buf
}

// readFrame reads one frame of at most limit bytes; a larger announced length is refused
// (TOO_LARGE) without reading the body.
func readFrame(r io.Reader, limit int) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > uint32(limit) {
		return nil, refuse(ReasonTooLarge, "frame of %d bytes is over %d", n, limit)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return body, nil
}

// decodeRequest decodes a request body strictly: one JSON object, no unknown field, nothing
// after it, at most MaxRequestBytes. It checks shape only; validate checks values.
func decodeRequest(body []byte) (*wireRequest, error) {
	if len(body) > MaxRequestBytes {
		return nil, refuse(ReasonTooLarge, "request of %d bytes is over %d", len(body), MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var req wireRequest
	if err := dec.Decode(&req); err != nil {
		return nil, refuse(ReasonBadRequest, "request is not the launcher's JSON: %v", trimErr(err))
	}
	if dec.More() {
		return nil, refuse(ReasonBadRequest, "data after the request")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, refuse(ReasonBadRequest, "data after the request")
	}
	// Empty and absent are one thing on the wire (omitempty): normalise, so a request means the
	// same after a re-encoding. Empty material is no material.
	if len(req.Env) == 0 {
		req.Env = nil
	}
	if len(req.Material) == 0 {
		req.Material = nil
	}
	return &req, nil
}

// trimErr bounds an error message that may quote request bytes.
func trimErr(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// checkToken compares the presented token with the launcher's in constant time. A token of the
// wrong length or not hex is refused the same way.
func checkToken(want []byte, presented string) error {
	got, err := hex.DecodeString(presented)
	if err != nil || len(got) != len(want) || subtle.ConstantTimeCompare(got, want) != 1 {
		return refuse(ReasonTokenInvalid, "the capability token does not match")
	}
	return nil
}

// validName reports whether s can name an agent or a connector: ^[A-Za-z0-9_-]+$, at most 64
// bytes, so it is one path segment and never "." or "..".
func validName(s string) bool { return len(s) <= maxNameLen && nameRE.MatchString(s) }

// validate checks a decoded request's values against the configuration. It runs after the token
// check and before anything is created.
func (c *Config) validate(req *wireRequest) error {
	switch req.Op {
	case opLaunch:
		return c.validateLaunch(req)
	case opSignal:
		if req.Pid <= 1 || req.StartTime == 0 {
			return refuse(ReasonBadRequest, "signal needs a child's pid and start time")
		}
		if req.Signal != "TERM" && req.Signal != "KILL" && req.Signal != "PROBE" {
			return refuse(ReasonBadRequest, "signal must be TERM, KILL or PROBE")
		}
		if req.Name != "" || req.Connector != "" || req.UID != nil || req.GID != nil || req.Env != nil ||
			req.Material != nil || req.Rows != 0 || req.Cols != 0 {
			return refuse(ReasonBadRequest, "signal takes only pid, start_time and signal")
		}
		return nil
	case opReplace:
		if req.Pid <= 1 || req.StartTime == 0 {
			return refuse(ReasonBadRequest, "replace_material needs a child's pid and start time")
		}
		if req.Material == nil {
			return refuse(ReasonBadRequest, "replace_material needs the new material")
		}
		if len(req.Material) > MaxMaterialBytes {
			return refuse(ReasonTooLarge, "material of %d bytes is over %d", len(req.Material), MaxMaterialBytes)
		}
		if req.Name != "" || req.Connector != "" || req.UID != nil || req.GID != nil || req.Env != nil ||
			req.Rows != 0 || req.Cols != 0 || req.Signal != "" {
			return refuse(ReasonBadRequest, "replace_material takes only pid, start_time and material")
		}
		return nil
	}
	return refuse(ReasonBadRequest, "unknown op %.32q", req.Op)
}

func (c *Config) validateLaunch(req *wireRequest) error {
	if req.Pid != 0 || req.StartTime != 0 || req.Signal != "" {
		return refuse(ReasonBadRequest, "launch takes no pid, start_time or signal")
	}
	if !validName(req.Name) {
		return refuse(ReasonNameInvalid, "agent name %.80q must match %s (at most %d bytes)", req.Name, nameRE, maxNameLen)
	}
	if !validName(req.Connector) {
		return refuse(ReasonConnectorUnknown, "connector %.80q is not a connector name", req.Connector)
	}
	if _, ok := c.Connectors[req.Connector]; !ok {
		return refuse(ReasonConnectorUnknown, "connector %q is not in the launcher's table", req.Connector)
	}
	if req.UID != nil || req.GID != nil {
		return refuse(ReasonTargetNotAllowed, "a request may not name a uid or gid: the launcher assigns each agent its own from agents (%d-%d)", *c.Agents.UIDFirst, c.Agents.Last())
	}
	if len(req.Env) > maxEnv {
		return refuse(ReasonEnvNotAllowed, "more than %d environment variables", maxEnv)
	}
	allowed := make(map[string]bool, len(c.EnvAllow))
	for _, k := range c.EnvAllow {
		allowed[k] = true
	}
	for _, k := range sortedKeys(req.Env) {
		v := req.Env[k]
		if len(k) > maxEnvKey || !envKeyRE.MatchString(k) {
			return refuse(ReasonEnvNotAllowed, "%.80q is not a variable name", k)
		}
		if envReserved(k) || !allowed[k] {
			return refuse(ReasonEnvNotAllowed, "%s is not in the launcher's env_allow", k)
		}
		if len(v) > maxEnvValue || strings.IndexByte(v, 0) >= 0 {
			return refuse(ReasonEnvNotAllowed, "%s: value longer than %d bytes or holds NUL", k, maxEnvValue)
		}
	}
	if len(req.Material) > MaxMaterialBytes {
		return refuse(ReasonTooLarge, "material of %d bytes is over %d", len(req.Material), MaxMaterialBytes)
	}
	return nil
}
