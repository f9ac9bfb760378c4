package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/cotalgo/cotal/pkg/space"
)

// The register-manager rail's wire (space.Names.RegisterManager): a manager that took its
// instance lease asks authd, as its own principal <owner>.<actor> (the subject carries it; the
// body never names a caller), to register this start of its instance. The request body is closed:
//
//	{"v":1,"instanceId":"<iid>"}
//
// and the answer, published only on space.RailReply(<request subject>), is one of
//
//	{"v":1,"ok":true,"result":{"instanceId":"<iid>","processEpoch":E,"registrationRevision":R,"generation":G}}
//	{"v":1,"ok":false,"code":"<code>","error":"<sentence>"}
//
// The result carries no registration proof: the proof binds the manager's lifecycle uid and the
// public keys of its five actors, which a Go managerd does not have (it runs one supervisor
// credential and no manager lifecycle), so authd would have to invent them.

// MaxRailBodyBytes bounds a register-manager request or answer.
const MaxRailBodyBytes = 4096

// maxRailCodeBytes and maxRailTextBytes bound a refusal's code and sentence.
const (
	maxRailCodeBytes = 64
	maxRailTextBytes = 1024
)

// RegisterManagerRequest is a register-manager request: the instance whose lease the caller holds.
type RegisterManagerRequest struct {
	InstanceID string
}

// RegisterManagerResult is what a committed registration answers.
type RegisterManagerResult struct {
	InstanceID           string
	ProcessEpoch         uint64
	RegistrationRevision uint64
	Generation           uint64
}

// RegisterManagerReply is a register-manager answer: OK with Result, or a refusal with its Code
// (an authority refusal code) and Error.
type RegisterManagerReply struct {
	OK     bool
	Result RegisterManagerResult
	Code   string
	Error  string
}

type registerRequestWire struct {
	V          *int    `json:"v"`
	InstanceID *string `json:"instanceId"`
}

type registerResultWire struct {
	InstanceID           *string `json:"instanceId"`
	ProcessEpoch         *uint64 `json:"processEpoch"`
	RegistrationRevision *uint64 `json:"registrationRevision"`
	Generation           *uint64 `json:"generation"`
}

// EncodeRegisterManagerRequest returns the request body for instanceID.
func EncodeRegisterManagerRequest(instanceID string) ([]byte, error) {
	if err := space.ValidateUID(instanceID); err != nil {
		return nil, fmt.Errorf("lifecycle: register-manager request: instanceId: %w", err)
	}
	v := 1
	return marshalNoHTML(registerRequestWire{V: &v, InstanceID: &instanceID})
}

// DecodeRegisterManagerRequest reads a request body strictly: at most MaxRailBodyBytes, one JSON
// object of exactly v (1) and instanceId (the uid grammar), no trailing data. The error never
// echoes the body.
func DecodeRegisterManagerRequest(b []byte) (RegisterManagerRequest, error) {
	var w registerRequestWire
	if err := decodeClosed(b, &w); err != nil {
		return RegisterManagerRequest{}, fmt.Errorf("lifecycle: register-manager request: %w", err)
	}
	switch {
	case w.V == nil || *w.V != 1:
		return RegisterManagerRequest{}, errors.New("lifecycle: register-manager request: v must be 1")
	case w.InstanceID == nil:
		return RegisterManagerRequest{}, errors.New("lifecycle: register-manager request: instanceId is required")
	}
	if err := space.ValidateUID(*w.InstanceID); err != nil {
		return RegisterManagerRequest{}, fmt.Errorf("lifecycle: register-manager request: instanceId: %w", err)
	}
	return RegisterManagerRequest{InstanceID: *w.InstanceID}, nil
}

// EncodeRegisterManagerReply returns an answer's body (the refusal sentence is clipped to its
// bound; an OK reply's result must be in grammar).
func EncodeRegisterManagerReply(r RegisterManagerReply) ([]byte, error) {
	var res *registerResultWire
	if r.OK {
		if err := r.Result.check(); err != nil {
			return nil, fmt.Errorf("lifecycle: register-manager reply: %w", err)
		}
		v := r.Result
		res = &registerResultWire{&v.InstanceID, &v.ProcessEpoch, &v.RegistrationRevision, &v.Generation}
	}
	return encodeRailReply("register-manager", r.OK, res, r.Code, r.Error)
}

// DecodeRegisterManagerReply reads an answer strictly: at most MaxRailBodyBytes, one closed JSON
// object with v 1 and ok; ok true carries exactly a result (every field present, instanceId in
// the uid grammar, a registrationRevision of at least 1, integers at most 2^53-1), ok false
// exactly a code ([a-z-], at most 64 bytes) and an error string of at most 1024 bytes.
func DecodeRegisterManagerReply(b []byte) (RegisterManagerReply, error) {
	w, code, msg, err := decodeRailReply[registerResultWire]("register-manager", b, decodeClosed)
	if err != nil || w == nil {
		return RegisterManagerReply{Code: code, Error: msg}, err
	}
	if w.InstanceID == nil || w.ProcessEpoch == nil || w.RegistrationRevision == nil || w.Generation == nil {
		return RegisterManagerReply{}, fmt.Errorf("lifecycle: register-manager reply: %w", errNoResult)
	}
	res := RegisterManagerResult{InstanceID: *w.InstanceID, ProcessEpoch: *w.ProcessEpoch,
		RegistrationRevision: *w.RegistrationRevision, Generation: *w.Generation}
	if err := res.check(); err != nil {
		return RegisterManagerReply{}, fmt.Errorf("lifecycle: register-manager reply: %w", err)
	}
	return RegisterManagerReply{OK: true, Result: res}, nil
}

func (r RegisterManagerResult) check() error {
	if err := space.ValidateUID(r.InstanceID); err != nil {
		return fmt.Errorf("instanceId: %w", err)
	}
	if r.RegistrationRevision < 1 {
		return errors.New("registrationRevision is 0")
	}
	if r.ProcessEpoch > MaxSafeInteger || r.RegistrationRevision > MaxSafeInteger || r.Generation > MaxSafeInteger {
		return errors.New("an integer is above 2^53-1")
	}
	return nil
}

func checkRailCode(c string) error {
	if c == "" || len(c) > maxRailCodeBytes {
		return errors.New("code is empty or too long")
	}
	for i := 0; i < len(c); i++ {
		if ch := c[i]; !(ch >= 'a' && ch <= 'z' || ch == '-') {
			return errors.New("code is not [a-z-]")
		}
	}
	return nil
}

// decodeClosed decodes one bounded JSON object into dst (DecodeObject).
func decodeClosed(b []byte, dst any) error {
	if len(b) > MaxRailBodyBytes {
		return fmt.Errorf("body of %d bytes (at most %d)", len(b), MaxRailBodyBytes)
	}
	return DecodeObject(b, dst)
}

// DecodeObject decodes one JSON object into dst, a pointer to a struct, refusing anything else
// (null, an array, a scalar), invalid UTF-8 (which encoding/json would silently rewrite), an
// unknown field, a field of another type and data after the object. The caller bounds b and checks what was decoded (a missing field stays zero). It is
// the closed decoder of the auth rails' bodies, the lifecycle doors' bodies and managerd's
// identity file.
func DecodeObject(b []byte, dst any) error {
	if !bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{")) {
		return errors.New("the body must be one JSON object")
	}
	// encoding/json would replace each invalid byte with U+FFFD: refuse rather than rewrite.
	if !utf8.Valid(b) {
		return errors.New("the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("field %q must be a %s", te.Field, te.Type)
		}
		return fmt.Errorf("the body is not a closed JSON object of the documented fields: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("the body has data after its JSON object")
	}
	return nil
}

func marshalNoHTML(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// clipText bounds a sentence to max bytes, dropping a UTF-8 sequence the cut split.
func clipText(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "")
}
