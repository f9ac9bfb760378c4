package ctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cotalgo/cotal/pkg/space"
)

// DefaultMaxRequestBytes bounds a control request body. A real request ({op, args, from}) is a
// few hundred bytes; anything near the broker's max_payload is abuse, refused before decoding.
const DefaultMaxRequestBytes = 64 << 10

// ErrBadRequest matches every request the envelope decoder refuses.
var ErrBadRequest = errors.New("ctl: bad request")

// Request is a decoded control request (upstream ControlRequest): an op, its arguments (a JSON
// object, possibly empty) and the sender the payload claims, which must equal the principal of
// the request subject.
type Request struct {
	Op   string
	Args map[string]json.RawMessage
	From string
}

// Reply is a control reply (upstream ControlReply). Code, an addition to upstream's envelope
// that its clients ignore, is a stable name for a refusal a caller may act on (only
// CodeTooManyInFlight today); other refusals carry only Error.
type Reply struct {
	OK    bool   `json:"ok"`
	Data  any    `json:"data,omitempty"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
}

// CodeTooManyInFlight refuses a request of a caller that already has its limit of requests in
// flight (Config.MaxInFlightPerCaller); nothing was run, and it may be sent again.
const CodeTooManyInFlight = "TOO_MANY_IN_FLIGHT"

func refuse(format string, a ...any) Reply { return Reply{Error: fmt.Sprintf(format, a...)} }

func okReply(data any) Reply { return Reply{OK: true, Data: data} }

// DecodeRequest reads a control request body of at most max bytes: a JSON object with a
// non-empty string op of at most 64 bytes, an args object (absent or null reads as empty) and a
// from object whose id is a string. Anything else is an error matching ErrBadRequest whose text
// is safe to send back (it never echoes the body).
func DecodeRequest(b []byte, max int) (Request, error) {
	if len(b) > max {
		return Request{}, fmt.Errorf("%w: body of %d bytes is over the %d-byte bound", ErrBadRequest, len(b), max)
	}
	var fields map[string]json.RawMessage
	if !isObject(b) || json.Unmarshal(b, &fields) != nil {
		return Request{}, fmt.Errorf("%w: body is not a JSON object", ErrBadRequest)
	}
	var op string
	if json.Unmarshal(fields["op"], &op) != nil || op == "" || len(op) > 64 {
		return Request{}, fmt.Errorf("%w: op must be a non-empty string of at most 64 bytes", ErrBadRequest)
	}
	var from struct {
		ID *string `json:"id"`
	}
	if !isObject(fields["from"]) || json.Unmarshal(fields["from"], &from) != nil || from.ID == nil {
		return Request{}, fmt.Errorf("%w: from.id must be a string", ErrBadRequest)
	}
	r := Request{Op: op, From: *from.ID, Args: map[string]json.RawMessage{}}
	if a := bytes.TrimSpace(fields["args"]); len(a) > 0 && !bytes.Equal(a, []byte("null")) {
		if !isObject(a) || json.Unmarshal(a, &r.Args) != nil {
			return Request{}, fmt.Errorf("%w: args must be a JSON object", ErrBadRequest)
		}
	}
	return r, nil
}

func isObject(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '{'
}

// Caller is the principal a request subject names: cotal.<t>.ctl.<service>.<owner>.<actor>. The
// broker lets only that principal publish there, so it is the authenticated sender.
type Caller struct{ Owner, Actor string }

// Principal is owner.actor.
func (c Caller) Principal() string { return c.Owner + "." + c.Actor }

// ParseCaller splits a request subject of service in space n. The owner must be a real principal
// owner ("local" or a derived u_ owner), as upstream's isPrincipalOwnerToken requires.
func ParseCaller(n space.Names, service, subject string) (Caller, bool) {
	rest, ok := strings.CutPrefix(subject, n.Prefix()+".ctl."+service+".")
	if !ok {
		return Caller{}, false
	}
	owner, actor, ok := strings.Cut(rest, ".")
	if !ok || space.ValidateOwner(owner) != nil || space.ValidateActor(actor) != nil {
		return Caller{}, false
	}
	if owner != "local" && space.ValidateDerivedOwner(owner) != nil {
		return Caller{}, false
	}
	return Caller{owner, actor}, true
}

// BoundReply reports whether reply is <subject>.reply.<nonce> with one nonce token
// (space.ValidateInboxNonce: a UUID fits). Upstream's boundReply guard: the daemon may publish on
// every caller's reply lane, so a reply target outside the sender's own subtree would make it a
// confused deputy; such a request is dropped without an answer.
func BoundReply(subject, reply string) bool {
	nonce, ok := strings.CutPrefix(reply, subject+".reply.")
	return ok && space.ValidateInboxNonce(nonce) == nil
}

// argString reads an optional string argument; a present non-string is an error.
func argString(args map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := args[name]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", true, fmt.Errorf("%s must be a string", name)
	}
	return s, true, nil
}

// argUint reads a required non-negative integer argument (a JSON number without fraction or
// exponent that fits uint64).
func argUint(args map[string]json.RawMessage, name string) (uint64, error) {
	raw, ok := args[name]
	if !ok {
		return 0, fmt.Errorf("%s is required", name)
	}
	var n uint64
	s := string(bytes.TrimSpace(raw))
	if s == "" || strings.ContainsAny(s, ".eE-+") || json.Unmarshal(raw, &n) != nil {
		return 0, fmt.Errorf("%s must be a non-negative integer", name)
	}
	return n, nil
}
