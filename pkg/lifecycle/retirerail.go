package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cotalgo/cotal/pkg/space"
)

// The retire-lifecycle rail's wire (space.Names.RetireLifecycle; reference lifecycle-hosted.md
// §2.4): a remote manager's retirement requester asks authd to retire one managed lifecycle. The
// target and the caller are in the subject only; the request body is closed:
//
//	{"v":1,"opId":"<opId>","serveEndpoint":"<endpoint>","serveInstanceId":"<iid>","serveEpoch":E}
//
// and the answer, published only on space.RailReply(<request subject>), is one of
//
//	{"v":1,"ok":true,"result":{"retired":true,"lifecycleUid":"<uid>","opId":"<opId>","evictedPrincipals":["<owner>.<actor>",...]}}
//	{"v":1,"ok":false,"code":"<code>","error":"<sentence>"}

// maxEvicted bounds the principals a retire-lifecycle answer names.
const maxEvicted = 16

// RetireLifecycleRequest is a retire-lifecycle request: the retirement's opId (which must be
// ManagedRetirementOpID of the subject's target uid) and the caller's serving endpoint
// instance and epoch.
type RetireLifecycleRequest struct {
	OpID            string
	ServeEndpoint   string
	ServeInstanceID string
	ServeEpoch      uint64
}

// RetireLifecycleResult is what a finished retirement answers: the lifecycle and its opId
// retired, and the principals whose connections the barrier proved gone (empty when it had
// been retired before).
type RetireLifecycleResult struct {
	LifecycleUID      string
	OpID              string
	EvictedPrincipals []string
}

// RetireLifecycleReply is a retire-lifecycle answer: OK with Result, or a refusal with its Code
// (an authority refusal code) and Error.
type RetireLifecycleReply struct {
	OK     bool
	Result RetireLifecycleResult
	Code   string
	Error  string
}

type retireRequestWire struct {
	V               *int    `json:"v"`
	OpID            *string `json:"opId"`
	ServeEndpoint   *string `json:"serveEndpoint"`
	ServeInstanceID *string `json:"serveInstanceId"`
	ServeEpoch      *uint64 `json:"serveEpoch"`
}

type retireResultWire struct {
	Retired           *bool     `json:"retired"`
	LifecycleUID      *string   `json:"lifecycleUid"`
	OpID              *string   `json:"opId"`
	EvictedPrincipals *[]string `json:"evictedPrincipals"`
}

func (r RetireLifecycleRequest) check() error {
	if err := space.ValidateUID(r.OpID); err != nil {
		return fmt.Errorf("opId: %w", err)
	}
	if _, err := EndpointToken(r.ServeEndpoint); err != nil {
		return fmt.Errorf("serveEndpoint: %w", err)
	}
	if err := space.ValidateUID(r.ServeInstanceID); err != nil {
		return fmt.Errorf("serveInstanceId: %w", err)
	}
	if r.ServeEpoch > MaxSafeInteger {
		return errors.New("serveEpoch is above 2^53-1")
	}
	return nil
}

// EncodeRetireLifecycleRequest returns the request body of r.
func EncodeRetireLifecycleRequest(r RetireLifecycleRequest) ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("lifecycle: retire-lifecycle request: %w", err)
	}
	v := 1
	return marshalNoHTML(retireRequestWire{&v, &r.OpID, &r.ServeEndpoint, &r.ServeInstanceID, &r.ServeEpoch})
}

// DecodeRetireLifecycleRequest reads a request body strictly: at most MaxRailBodyBytes, one JSON
// object of exactly v (1), opId and serveInstanceId (the uid grammar), serveEndpoint (an
// endpoint name) and serveEpoch (an integer 0..2^53-1), each present once, no trailing data.
// The error never echoes the body.
func DecodeRetireLifecycleRequest(b []byte) (RetireLifecycleRequest, error) {
	var w retireRequestWire
	if err := decodeClosedOnce(b, &w); err != nil {
		return RetireLifecycleRequest{}, fmt.Errorf("lifecycle: retire-lifecycle request: %w", err)
	}
	switch {
	case w.V == nil || *w.V != 1:
		return RetireLifecycleRequest{}, errors.New("lifecycle: retire-lifecycle request: v must be 1")
	case w.OpID == nil || w.ServeEndpoint == nil || w.ServeInstanceID == nil || w.ServeEpoch == nil:
		return RetireLifecycleRequest{}, errors.New("lifecycle: retire-lifecycle request: opId, serveEndpoint, serveInstanceId and serveEpoch are required")
	}
	r := RetireLifecycleRequest{*w.OpID, *w.ServeEndpoint, *w.ServeInstanceID, *w.ServeEpoch}
	if err := r.check(); err != nil {
		return RetireLifecycleRequest{}, fmt.Errorf("lifecycle: retire-lifecycle request: %w", err)
	}
	return r, nil
}

func (r RetireLifecycleResult) check() error {
	if err := space.ValidateUID(r.LifecycleUID); err != nil {
		return fmt.Errorf("lifecycleUid: %w", err)
	}
	if op, _ := ManagedRetirementOpID(r.LifecycleUID); r.OpID != op {
		return errors.New("opId is not the lifecycle's managed retirement opId")
	}
	if len(r.EvictedPrincipals) > maxEvicted {
		return fmt.Errorf("more than %d evicted principals", maxEvicted)
	}
	for _, p := range r.EvictedPrincipals {
		if err := checkPrincipal(p); err != nil {
			return fmt.Errorf("evictedPrincipals: %w", err)
		}
	}
	return nil
}

// EncodeRetireLifecycleReply returns an answer's body (the refusal sentence is clipped to its
// bound; an OK reply's result must be in grammar, its opId the uid's managed retirement).
func EncodeRetireLifecycleReply(r RetireLifecycleReply) ([]byte, error) {
	var res *retireResultWire
	if r.OK {
		if err := r.Result.check(); err != nil {
			return nil, fmt.Errorf("lifecycle: retire-lifecycle reply: %w", err)
		}
		v, yes := r.Result, true
		if v.EvictedPrincipals == nil {
			v.EvictedPrincipals = []string{}
		}
		res = &retireResultWire{&yes, &v.LifecycleUID, &v.OpID, &v.EvictedPrincipals}
	}
	return encodeRailReply("retire-lifecycle", r.OK, res, r.Code, r.Error)
}

// DecodeRetireLifecycleReply reads an answer strictly: at most MaxRailBodyBytes, one closed JSON
// object with v 1 and ok, no key twice; ok true carries exactly a result (retired true, every
// field present, in grammar, the opId the uid's managed retirement), ok false exactly a code
// ([a-z-], at most 64 bytes) and an error string of at most 1024 bytes.
func DecodeRetireLifecycleReply(b []byte) (RetireLifecycleReply, error) {
	w, code, msg, err := decodeRailReply[retireResultWire]("retire-lifecycle", b, decodeClosedOnce)
	if err != nil || w == nil {
		return RetireLifecycleReply{Code: code, Error: msg}, err
	}
	if w.Retired == nil || !*w.Retired || w.LifecycleUID == nil || w.OpID == nil || w.EvictedPrincipals == nil {
		return RetireLifecycleReply{}, fmt.Errorf("lifecycle: retire-lifecycle reply: %w (retired true, lifecycleUid, opId, evictedPrincipals)", errNoResult)
	}
	r := RetireLifecycleReply{OK: true, Result: RetireLifecycleResult{*w.LifecycleUID, *w.OpID, *w.EvictedPrincipals}}
	if err := r.Result.check(); err != nil {
		return RetireLifecycleReply{}, fmt.Errorf("lifecycle: retire-lifecycle reply: %w", err)
	}
	return r, nil
}

// decodeClosedOnce is decodeClosed refusing, as well, a top-level key given twice
// (encoding/json keeps the last, so such a body could say two things).
func decodeClosedOnce(b []byte, dst any) error {
	if err := decodeClosed(b, dst); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil {
		return errors.New("the body is not JSON")
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errors.New("the body is not JSON")
		}
		k, _ := t.(string)
		if seen[k] {
			return fmt.Errorf("field %q appears twice", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return errors.New("the body is not JSON")
		}
	}
	return nil
}
