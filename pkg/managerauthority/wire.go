// Package managerauthority is the wire of authd's manager-service authority transport (issue 25;
// seed 001 "Managed-agent authority transport", reference lifecycle-hosted.md §2.6-2.7):
// POST /manager-service-authority with the closed body {idpToken, request}, at most MaxBodyBytes.
// The request's kind says what it asks:
//
//   - "manager-service-authority" (Request), a remote manager lifecycle's phases by operation:
//     prepare (a remote-manager supervisor credential for identities.supervisor, and the
//     caller-computable ActivationProof), activate (register the manager endpoint instance; the
//     answer carries processEpoch, accountPublicKey and nextRegistrationProof, the host's current
//     registration proof), renew (a fresh supervisor credential under the current registration)
//     and retire (a retirement-requester credential for one managed target). session,
//     renewStandingBundle and renewRunDriver are operations of upstream's wire this project does
//     not serve;
//   - the managed-agent kinds (ManagedRequest and its target forms): enrollment,
//     prepare-retirement, runtime-create and runtime-status;
//   - kinds this project does not serve (retained-agent validation, goal-index scan, admin
//     authorization, service maintenance, delegated user intents).
//
// Every object is closed: an unknown, duplicate or re-cased key is refused, as is a value of
// another type, a number above 2^53-1 and data after the body. DecodeEnvelope parses the body,
// Peek reads the request's kind and operation, and the Decode functions parse each served kind
// and check each field's grammar. Nothing here holds a secret but the idpToken, which the
// decoders never put in an error.
package managerauthority

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/cotalgo/cotal/pkg/jsjson"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Path is the transport's route on both of authd's faces (upstream's managerAuthorityUrl path).
const Path = "/manager-service-authority"

// MaxBodyBytes bounds one request body.
const MaxBodyBytes = 64 << 10

// maxDepth bounds how deeply a body may nest (the deepest served object is 4 levels).
const maxDepth = 8

// Kinds.
const (
	KindAuthority         = "manager-service-authority"
	KindEnrollment        = "manager-managed-agent-enrollment"
	KindPrepareRetirement = "manager-managed-agent-prepare-retirement"
	KindRuntimeCreate     = "manager-managed-agent-runtime-create"
	KindRuntimeStatus     = "manager-managed-agent-runtime-status"
	// Kinds of upstream's transport this project does not serve (501).
	KindRetainedValidation = "manager-retained-agent-validation"
	KindGoalIndexScan      = "manager-goal-index-scan"
	KindAdminAuthorization = "manager-admin-authorization"
	KindMaintenance        = "manager-service-maintenance"
	KindDelegatedAdmission = "manager-delegated-user-intent-admission"
	KindDelegatedExecution = "manager-delegated-user-intent-execution"
)

// Operation is a manager-service-authority request's phase.
type Operation string

// Operations.
const (
	OpPrepare  Operation = "prepare"
	OpActivate Operation = "activate"
	OpRenew    Operation = "renew"
	OpRetire   Operation = "retire"
	// Operations of upstream's wire this project does not serve (501).
	OpSession             Operation = "session"
	OpRenewStandingBundle Operation = "renewStandingBundle"
	OpRenewRunDriver      Operation = "renewRunDriver"
)

// Served reports whether op is one of the four operations this project serves.
func (op Operation) Served() bool {
	return op == OpPrepare || op == OpActivate || op == OpRenew || op == OpRetire
}

// Unserved reports whether kind (with op for KindAuthority) is a kind or operation of upstream's
// transport this project answers 501: the session, standing-bundle and run-driver operations, and
// the retained, goal-index, admin, maintenance and delegated kinds.
func Unserved(kind string, op Operation) bool {
	switch kind {
	case KindAuthority:
		return op == OpSession || op == OpRenewStandingBundle || op == OpRenewRunDriver
	case KindRetainedValidation, KindGoalIndexScan, KindAdminAuthorization, KindMaintenance,
		KindDelegatedAdmission, KindDelegatedExecution:
		return true
	}
	return false
}

// Envelope is the body: the caller's IdP token (the human proof) and the request.
type Envelope struct {
	IdPToken string          `json:"idpToken"`
	Request  json.RawMessage `json:"request"`
}

// Identity is one caller-generated user nkey.
type Identity struct {
	ID string `json:"id"`
}

// Identities are the public user nkeys of the manager instance's five actors.
type Identities struct {
	Supervisor    Identity `json:"supervisor"`
	Executor      Identity `json:"executor"`
	Serve         Identity `json:"serve"`
	GoalWriter    Identity `json:"goalWriter"`
	SessionLedger Identity `json:"sessionLedger"`
}

// Lifecycle is the identities in pkg/lifecycle's form.
func (i Identities) Lifecycle() lifecycle.Identities {
	return lifecycle.Identities{Supervisor: i.Supervisor.ID, Executor: i.Executor.ID, Serve: i.Serve.ID,
		GoalWriter: i.GoalWriter.ID, SessionLedger: i.SessionLedger.ID}
}

// Target is one exact managed lifecycle.
type Target struct {
	Owner        string `json:"owner"`
	Actor        string `json:"actor"`
	LifecycleUID string `json:"lifecycleUid"`
}

// Retirement is a retire request's terminal operation: the requester nkey (id), the target, the
// target's managed retirement opId and the serve epoch it is asked at.
type Retirement struct {
	ID         string `json:"id"`
	Target     Target `json:"target"`
	OpID       string `json:"opId"`
	ServeEpoch uint64 `json:"serveEpoch"`
}

// Request is a manager-service-authority request. Actor is the interactive ledger actor that
// authenticates it (normally cli); InstanceID and ManagerLifecycleUID are caller-chosen uids;
// RegistrationProof is required by activate (the ActivationProof), renew and retire (the current
// registration proof activate answered); ProcessEpoch by renew; Retirement by retire only.
type Request struct {
	V                   int         `json:"v"`
	Kind                string      `json:"kind"`
	Operation           Operation   `json:"operation"`
	Space               string      `json:"space"`
	Actor               string      `json:"actor"`
	InstanceID          string      `json:"instanceId"`
	ManagerLifecycleUID string      `json:"managerLifecycleUid"`
	RequestID           string      `json:"requestId"`
	RegistrationProof   string      `json:"registrationProof,omitempty"`
	AccountPublicKey    string      `json:"accountPublicKey,omitempty"`
	ProcessEpoch        *uint64     `json:"processEpoch,omitempty"`
	Retirement          *Retirement `json:"retirement,omitempty"`
	Identities          Identities  `json:"identities"`
}

// Credential is a host-signed user JWT for a caller-generated nkey (the seed stays with the
// caller) and its expiry in Unix seconds.
type Credential struct {
	JWT string `json:"jwt"`
	Exp int64  `json:"exp"`
}

// Credentials are the credentials an answer carries; an absent one is absent authority.
type Credentials struct {
	Supervisor          *Credential `json:"supervisor,omitempty"`
	RetirementRequester *Credential `json:"retirementRequester,omitempty"`
}

// Actors are the manager instance's five actors, fixed functions of its instance id.
type Actors struct {
	Supervisor    string `json:"supervisor"`
	Executor      string `json:"executor"`
	Serve         string `json:"serve"`
	GoalWriter    string `json:"goalWriter"`
	SessionLedger string `json:"sessionLedger"`
}

// ActorsOf returns the actors of instanceID (pkg/lifecycle.ManagerActors).
func ActorsOf(instanceID string) (Actors, error) {
	a, err := lifecycle.ManagerActors(instanceID)
	if err != nil {
		return Actors{}, err
	}
	return Actors{Supervisor: a[0], Executor: a[1], Serve: a[2], GoalWriter: a[3], SessionLedger: a[4]}, nil
}

// Material is the answer to a manager-service-authority request: the request's coordinates
// echoed with the owner the host derived, the phase's credentials, and per operation: prepare's
// nextRegistrationProof (the ActivationProof activate requires), activate's processEpoch,
// accountPublicKey, registrationRevision (the revision the gate records, which the manager writes
// into its lease row with the epoch) and nextRegistrationProof (the current registration proof
// renew, retire and the managed-agent kinds require; never the activation proof), renew's and retire's
// registrationProof echo, and retire's retirement echo. IssuedAt and ExpiresAt are Unix seconds
// (ExpiresAt the earliest credential expiry, 0 without one).
type Material struct {
	V                     int         `json:"v"`
	Kind                  string      `json:"kind"`
	Operation             Operation   `json:"operation"`
	Space                 string      `json:"space"`
	Owner                 string      `json:"owner"`
	Actor                 string      `json:"actor"`
	InstanceID            string      `json:"instanceId"`
	LifecycleUID          string      `json:"lifecycleUid"`
	RequestID             string      `json:"requestId"`
	RegistrationProof     string      `json:"registrationProof,omitempty"`
	AccountPublicKey      string      `json:"accountPublicKey,omitempty"`
	ProcessEpoch          *uint64     `json:"processEpoch,omitempty"`
	RegistrationRevision  *uint64     `json:"registrationRevision,omitempty"`
	Retirement            *Retirement `json:"retirement,omitempty"`
	IssuedAt              int64       `json:"issuedAt"`
	ExpiresAt             int64       `json:"expiresAt"`
	Actors                Actors      `json:"actors"`
	Identities            Identities  `json:"identities"`
	NextRegistrationProof string      `json:"nextRegistrationProof,omitempty"`
	Credentials           Credentials `json:"credentials"`
}

// ManagedRequest is the manager envelope every managed-agent kind carries: the manager
// lifecycle's coordinates, its current registration proof and the serve epoch it was issued at.
type ManagedRequest struct {
	V                   int        `json:"v"`
	Kind                string     `json:"kind"`
	Space               string     `json:"space"`
	Actor               string     `json:"actor"`
	InstanceID          string     `json:"instanceId"`
	ManagerLifecycleUID string     `json:"managerLifecycleUid"`
	RequestID           string     `json:"requestId"`
	RegistrationProof   string     `json:"registrationProof"`
	ServeEpoch          uint64     `json:"serveEpoch"`
	Identities          Identities `json:"identities"`
}

// EnrollmentTarget is the agent an enrollment asks for: its actor, the SHA-256 of the actor token
// the manager generated (the token never leaves it), and its requested row.
type EnrollmentTarget struct {
	Actor          string   `json:"actor"`
	TokenHash      string   `json:"tokenHash"`
	Role           string   `json:"role,omitempty"`
	Label          string   `json:"label,omitempty"`
	Capabilities   []string `json:"capabilities,omitempty"`
	Subscribe      []string `json:"subscribe,omitempty"`
	AllowSubscribe []string `json:"allowSubscribe,omitempty"`
	AllowPublish   []string `json:"allowPublish,omitempty"`
}

// EnrollmentRequest is a manager-managed-agent-enrollment request (no uid: the host picks it).
type EnrollmentRequest struct {
	ManagedRequest
	Target EnrollmentTarget `json:"target"`
}

// Enrollment is the answer to a manager-managed-agent-enrollment request (seed 001 "Fresh
// managed agents"): the coordinate the host chose (owner, actor, lifecycleUid), the space's
// sentinel as NATS creds text (a public bearer user JWT with a throwaway seed: no authority of its
// own), the effective lists (the requested ones clamped to the supervising row's), and
// agentBearerExchangeUrl, the host's public auth-service base URL the agent exchanges its actor
// token at (pkg/authclient's Config.URL: <base>/exchange).
type Enrollment struct {
	Owner                  string   `json:"owner"`
	Actor                  string   `json:"actor"`
	LifecycleUID           string   `json:"lifecycleUid"`
	SentinelCreds          string   `json:"sentinelCreds"`
	Subscribe              []string `json:"subscribe"`
	AllowSubscribe         []string `json:"allowSubscribe"`
	AllowPublish           []string `json:"allowPublish"`
	AgentBearerExchangeURL string   `json:"agentBearerExchangeUrl"`
}

// PrepareRetirementRequest is a manager-managed-agent-prepare-retirement request.
type PrepareRetirementRequest struct {
	ManagedRequest
	Target Target `json:"target"`
	OpID   string `json:"opId"`
}

// RuntimeRequest is a manager-managed-agent-runtime-create or -status request.
type RuntimeRequest struct {
	ManagedRequest
	Target Target
}

// Error is a refused body: what is wrong, without the idpToken.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func bad(format string, args ...any) *Error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// knownKeys are every key a served body may hold. Together with the per-object unknown-field
// check, requiring each key to be one of these exactly refuses a re-cased key (encoding/json
// matches names case-insensitively); no two of them differ only in case.
var knownKeys = map[string]bool{}

func init() {
	for _, k := range []string{"idpToken", "request", "v", "kind", "operation", "space", "actor", "instanceId",
		"managerLifecycleUid", "requestId", "registrationProof", "accountPublicKey", "processEpoch", "retirement",
		"identities", "id", "target", "opId", "serveEpoch", "owner", "lifecycleUid", "supervisor", "executor",
		"serve", "goalWriter", "sessionLedger", "tokenHash", "role", "label", "capabilities", "subscribe",
		"allowSubscribe", "allowPublish"} {
		knownKeys[k] = true
	}
}

// keyFrame is one open object or array of checkKeys' walk.
type keyFrame struct {
	obj  bool
	keys map[string]bool
	key  bool // an object expecting a key (or its end) next
}

// checkKeys walks b (one JSON value) and refuses a key given twice in one object, a key not in
// knownKeys exactly, nesting deeper than maxDepth, and invalid UTF-8. With topOnly, only the
// outermost object's keys are judged (the envelope: the request's are its kind's decoder's).
func checkKeys(b []byte, topOnly bool) error {
	if !utf8.Valid(b) {
		return bad("the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var stack []*keyFrame
	// valued records that the object on top of the stack received a member's value.
	valued := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].key = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return bad("the body is not JSON: %v", err)
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].key {
			top := stack[n-1]
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:n-1]
				valued()
				continue
			}
			k, _ := tok.(string)
			if topOnly && n > 1 {
				top.key = false
				continue
			}
			if !knownKeys[k] {
				return bad("unknown field %.40q", k)
			}
			if top.keys[k] {
				return bad("field %q is given twice", k)
			}
			top.keys[k], top.key = true, false
			continue
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if len(stack) >= maxDepth {
					return bad("the body nests deeper than %d levels", maxDepth)
				}
				stack = append(stack, &keyFrame{obj: d == '{', keys: map[string]bool{}, key: d == '{'})
			default: // ']'
				stack = stack[:len(stack)-1]
				valued()
			}
			continue
		}
		valued()
	}
}

// decodeClosed decodes b into dst after checkKeys: one object, no unknown field, no other type.
func decodeClosed(b []byte, dst any) error {
	return decodeClosedAt(b, dst, false)
}

func decodeClosedAt(b []byte, dst any, topOnly bool) error {
	if err := checkKeys(b, topOnly); err != nil {
		return err
	}
	if err := lifecycle.DecodeObject(b, dst); err != nil {
		return bad("%v", err)
	}
	return nil
}

// DecodeEnvelope parses a body: at most MaxBodyBytes, the closed object {idpToken, request} with
// a non-empty idpToken (at most 16 KiB) and a request that is an object. The request itself is
// parsed by Peek and the Decode functions.
func DecodeEnvelope(b []byte) (*Envelope, error) {
	if len(b) > MaxBodyBytes {
		return nil, bad("the body is %d bytes (at most %d)", len(b), MaxBodyBytes)
	}
	var env Envelope
	if err := decodeClosedAt(b, &env, true); err != nil {
		return nil, err
	}
	switch {
	case env.IdPToken == "":
		return nil, bad("idpToken is required")
	case len(env.IdPToken) > 16<<10:
		return nil, bad("idpToken is longer than 16 KiB")
	case !bytes.HasPrefix(bytes.TrimLeft(env.Request, " \t\r\n"), []byte("{")):
		return nil, bad("request is required and must be an object")
	}
	return &env, nil
}

// Peek reads a request's v, kind and (for KindAuthority) operation without judging the rest: v
// must be 1, kind a known kind and operation, for KindAuthority, a known operation.
func Peek(req json.RawMessage) (kind string, op Operation, err error) {
	var p struct {
		V         json.RawMessage `json:"v"`
		Kind      string          `json:"kind"`
		Operation Operation       `json:"operation"`
	}
	if err := json.Unmarshal(req, &p); err != nil {
		return "", "", bad("request: %v", err)
	}
	if string(p.V) != "1" {
		return "", "", bad("request.v must be 1")
	}
	switch p.Kind {
	case KindAuthority:
		if !p.Operation.Served() && !Unserved(p.Kind, p.Operation) {
			return "", "", bad("request.operation %.40q is not an operation (prepare, activate, renew, retire)", p.Operation)
		}
	case KindEnrollment, KindPrepareRetirement, KindRuntimeCreate, KindRuntimeStatus:
	default:
		if !Unserved(p.Kind, "") {
			return "", "", bad("request.kind %.60q is not a kind of this transport", p.Kind)
		}
	}
	return p.Kind, p.Operation, nil
}

// DecodeRequest parses a manager-service-authority request of a served operation and checks its
// grammar: v 1; space a space name; actor an actor token; instanceId, managerLifecycleUid and
// requestId the uid grammar (requestId 1-128 of [A-Za-z0-9_.:-]); every identity a user public
// nkey, no two the same; accountPublicKey, when given, an account key; and per operation:
// prepare takes no registrationProof, processEpoch or retirement; activate requires a
// registrationProof and takes no processEpoch or retirement; renew requires a registrationProof
// and a processEpoch and takes no retirement; retire requires a registrationProof and a
// retirement (its id a user nkey other than the identities, its target within the grammars, its
// opId 26 lower-case hex) and takes no processEpoch.
func DecodeRequest(b json.RawMessage) (*Request, error) {
	var r Request
	if err := decodeClosed(b, &r); err != nil {
		return nil, err
	}
	if r.V != 1 || r.Kind != KindAuthority || !r.Operation.Served() {
		return nil, bad("request is not a served %s request (v 1; prepare, activate, renew or retire)", KindAuthority)
	}
	if err := checkManager(r.Space, r.Actor, r.InstanceID, r.ManagerLifecycleUID, r.RequestID, r.Identities); err != nil {
		return nil, err
	}
	if r.AccountPublicKey != "" && !isKey(r.AccountPublicKey, 'A') {
		return nil, bad("accountPublicKey is not an account public key")
	}
	if r.RegistrationProof != "" && !lifecycle.IsProof(r.RegistrationProof) {
		return nil, bad("registrationProof is not a proof (sha256: and 64 lower-case hex)")
	}
	if r.ProcessEpoch != nil && *r.ProcessEpoch > lifecycle.MaxSafeInteger {
		return nil, bad("processEpoch is above 2^53-1")
	}
	has := func(proof, epoch, ret bool) bool {
		return (r.RegistrationProof != "") == proof && (r.ProcessEpoch != nil) == epoch && (r.Retirement != nil) == ret
	}
	switch r.Operation {
	case OpPrepare:
		if !has(false, false, false) {
			return nil, bad("prepare takes no registrationProof, processEpoch or retirement")
		}
	case OpActivate:
		if !has(true, false, false) {
			return nil, bad("activate requires a registrationProof (the activation proof) and takes no processEpoch or retirement")
		}
	case OpRenew:
		if !has(true, true, false) {
			return nil, bad("renew requires a registrationProof and a processEpoch and takes no retirement")
		}
	case OpRetire:
		if !has(true, false, true) {
			return nil, bad("retire requires a registrationProof and a retirement and takes no processEpoch")
		}
		if err := checkRetirement(r.Retirement, r.Identities); err != nil {
			return nil, err
		}
	}
	return &r, nil
}

func checkRetirement(ret *Retirement, ids Identities) error {
	if !isKey(ret.ID, 'U') {
		return bad("retirement.id is not a user public nkey")
	}
	for _, id := range idList(ids) {
		if id == ret.ID {
			return bad("retirement.id must be a fresh nkey, not one of the identities")
		}
	}
	if err := checkTarget("retirement.target", ret.Target); err != nil {
		return err
	}
	if !isOpID(ret.OpID) {
		return bad("retirement.opId is not an opId (26 lower-case hex)")
	}
	if ret.ServeEpoch > lifecycle.MaxSafeInteger {
		return bad("retirement.serveEpoch is above 2^53-1")
	}
	return nil
}

// managedWire is the wire form of every managed-agent kind (each kind's decoder checks which of
// target's and opId's forms it may carry).
type managedWire struct {
	ManagedRequest
	Target json.RawMessage `json:"target"`
	OpID   *string         `json:"opId"`
}

func decodeManaged(b json.RawMessage, kind string) (*managedWire, error) {
	var w managedWire
	if err := decodeClosed(b, &w); err != nil {
		return nil, err
	}
	if w.V != 1 || w.Kind != kind {
		return nil, bad("request is not a %s request (v 1)", kind)
	}
	if err := checkManager(w.Space, w.Actor, w.InstanceID, w.ManagerLifecycleUID, w.RequestID, w.Identities); err != nil {
		return nil, err
	}
	if !lifecycle.IsProof(w.RegistrationProof) {
		return nil, bad("registrationProof is required and must be a proof (sha256: and 64 lower-case hex)")
	}
	if w.ServeEpoch > lifecycle.MaxSafeInteger {
		return nil, bad("serveEpoch is above 2^53-1")
	}
	if len(bytes.TrimSpace(w.Target)) == 0 || string(bytes.TrimSpace(w.Target)) == "null" {
		return nil, bad("target is required")
	}
	return &w, nil
}

// DecodeEnrollment parses a manager-managed-agent-enrollment request: the manager envelope and
// target {actor, tokenHash (64 lower-case hex), role?, label?, capabilities?, subscribe?,
// allowSubscribe?, allowPublish?}; no opId, no uid.
func DecodeEnrollment(b json.RawMessage) (*EnrollmentRequest, error) {
	w, err := decodeManaged(b, KindEnrollment)
	if err != nil {
		return nil, err
	}
	if w.OpID != nil {
		return nil, bad("an enrollment takes no opId")
	}
	var t EnrollmentTarget
	if err := decodeClosed(w.Target, &t); err != nil {
		return nil, bad("target: %v", err)
	}
	if err := space.ValidateActor(t.Actor); err != nil {
		return nil, bad("target.actor: %v", err)
	}
	if !isHex(t.TokenHash, 64) {
		return nil, bad("target.tokenHash is not a SHA-256 (64 lower-case hex)")
	}
	if t.Role != "" {
		if err := space.ValidateRole(t.Role); err != nil {
			return nil, bad("target.role: %v", err)
		}
	}
	if len(t.Label) > 256 {
		return nil, bad("target.label is longer than 256 bytes")
	}
	for _, l := range []struct {
		name string
		v    []string
	}{{"capabilities", t.Capabilities}, {"subscribe", t.Subscribe}, {"allowSubscribe", t.AllowSubscribe}, {"allowPublish", t.AllowPublish}} {
		if len(l.v) > 128 {
			return nil, bad("target.%s has more than 128 entries", l.name)
		}
		for _, v := range l.v {
			var err error
			if l.name == "capabilities" {
				if !space.IsScopeWord(v) {
					err = errors.New("not a scope word")
				}
			} else {
				err = space.ValidateChannelPattern(v)
			}
			if err != nil {
				return nil, bad("target.%s entry %.40q: %v", l.name, v, err)
			}
		}
	}
	return &EnrollmentRequest{ManagedRequest: w.ManagedRequest, Target: t}, nil
}

// DecodePrepareRetirement parses a manager-managed-agent-prepare-retirement request: the manager
// envelope, target {owner, actor, lifecycleUid} and opId (26 lower-case hex).
func DecodePrepareRetirement(b json.RawMessage) (*PrepareRetirementRequest, error) {
	w, err := decodeManaged(b, KindPrepareRetirement)
	if err != nil {
		return nil, err
	}
	t, err := decodeTarget(w.Target)
	if err != nil {
		return nil, err
	}
	if w.OpID == nil || !isOpID(*w.OpID) {
		return nil, bad("opId is required and must be an opId (26 lower-case hex)")
	}
	return &PrepareRetirementRequest{ManagedRequest: w.ManagedRequest, Target: t, OpID: *w.OpID}, nil
}

// DecodeRuntime parses a manager-managed-agent-runtime-create or -status request (kind says
// which): the manager envelope and target {owner, actor, lifecycleUid}; a provider reference,
// handle or name anywhere is an unknown field.
func DecodeRuntime(b json.RawMessage, kind string) (*RuntimeRequest, error) {
	if kind != KindRuntimeCreate && kind != KindRuntimeStatus {
		return nil, bad("%.60q is not a runtime kind", kind)
	}
	w, err := decodeManaged(b, kind)
	if err != nil {
		return nil, err
	}
	if w.OpID != nil {
		return nil, bad("a runtime request takes no opId")
	}
	t, err := decodeTarget(w.Target)
	if err != nil {
		return nil, err
	}
	return &RuntimeRequest{ManagedRequest: w.ManagedRequest, Target: t}, nil
}

func decodeTarget(b json.RawMessage) (Target, error) {
	var t Target
	if err := decodeClosed(b, &t); err != nil {
		return Target{}, bad("target: %v", err)
	}
	return t, checkTarget("target", t)
}

func checkTarget(name string, t Target) error {
	if err := space.ValidateOwner(t.Owner); err != nil {
		return bad("%s.owner: %v", name, err)
	}
	if err := space.ValidateActor(t.Actor); err != nil {
		return bad("%s.actor: %v", name, err)
	}
	if err := space.ValidateUID(t.LifecycleUID); err != nil {
		return bad("%s.lifecycleUid: %v", name, err)
	}
	return nil
}

// checkManager checks the coordinates every request carries.
func checkManager(spaceName, actor, iid, uid, requestID string, ids Identities) error {
	if err := space.ValidateName(spaceName); err != nil {
		return bad("space: %v", err)
	}
	if err := space.ValidateActor(actor); err != nil {
		return bad("actor: %v", err)
	}
	if err := space.ValidateUID(iid); err != nil {
		return bad("instanceId: %v", err)
	}
	if err := space.ValidateUID(uid); err != nil {
		return bad("managerLifecycleUid: %v", err)
	}
	if !isRequestID(requestID) {
		return bad("requestId must be 1-128 characters of [A-Za-z0-9_.:-]")
	}
	seen := map[string]bool{}
	for i, id := range idList(ids) {
		if !isKey(id, 'U') {
			return bad("identities.%s.id is not a user public nkey", identityNames[i])
		}
		if seen[id] {
			return bad("identities.%s.id repeats another identity", identityNames[i])
		}
		seen[id] = true
	}
	return nil
}

var identityNames = [5]string{"supervisor", "executor", "serve", "goalWriter", "sessionLedger"}

func idList(ids Identities) [5]string {
	return [5]string{ids.Supervisor.ID, ids.Executor.ID, ids.Serve.ID, ids.GoalWriter.ID, ids.SessionLedger.ID}
}

// isKey reports whether s has the shape of a public nkey with prefix p: p and 55 of [A-Z2-7].
func isKey(s string, p byte) bool {
	if len(s) != 56 || s[0] != p {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func isOpID(s string) bool { return isHex(s, lifecycle.OpIDLen) }

func isRequestID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	return strings.IndexFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-')
	}) < 0
}

// ActivationProof is the caller-computable proof prepare answers and activate requires (upstream
// remoteManagerRegistrationProof, with no contract artifacts): "sha256:" and the lower-case hex
// SHA-256 of JSON.stringify({v:1, space, owner, instanceId, lifecycleUid, actors, identities,
// artifactDigests:[]}), keys in that order, actors and identities in the payload's order. It binds
// the owner, the instance and the five identity nkeys; it is not a secret and authorizes nothing
// by itself: activate also needs the IdP proof of the owner and the supervise row. It refuses
// coordinates outside their grammars.
func ActivationProof(spaceName, owner string, r *Request) (string, error) {
	if err := space.ValidateName(spaceName); err != nil {
		return "", err
	}
	if err := space.ValidateOwner(owner); err != nil {
		return "", err
	}
	if err := checkManager(spaceName, "x", r.InstanceID, r.ManagerLifecycleUID, "x", r.Identities); err != nil {
		return "", err
	}
	actors, _ := lifecycle.ManagerActors(r.InstanceID)
	ids := idList(r.Identities)
	b := make([]byte, 0, 1024)
	b = append(b, `{"v":1,"space":`...)
	b = jsjson.AppendString(b, spaceName)
	b = append(b, `,"owner":`...)
	b = jsjson.AppendString(b, owner)
	b = append(b, `,"instanceId":`...)
	b = jsjson.AppendString(b, r.InstanceID)
	b = append(b, `,"lifecycleUid":`...)
	b = jsjson.AppendString(b, r.ManagerLifecycleUID)
	b = append(b, `,"actors":{`...)
	for i, k := range identityNames {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsjson.AppendString(b, k)
		b = append(b, ':')
		b = jsjson.AppendString(b, actors[i])
	}
	b = append(b, `},"identities":{`...)
	for i, k := range identityNames {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsjson.AppendString(b, k)
		b = append(b, `:{"id":`...)
		b = jsjson.AppendString(b, ids[i])
		b = append(b, '}')
	}
	b = append(b, `},"artifactDigests":[]}`...)
	sum := sha256.Sum256(b)
	return lifecycle.ProofPrefix + hex.EncodeToString(sum[:]), nil
}

// MaxAnswerBytes bounds one answer a client reads (a Material holds at most two JWTs).
const MaxAnswerBytes = 64 << 10

// Refusal is a refused request's answer, {"error", "code"}, with its HTTP status.
type Refusal struct {
	Status int    `json:"-"`
	Msg    string `json:"error"`
	Code   string `json:"code"`
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("the manager-service authority refused (%d %s): %s", r.Status, r.Code, r.Msg)
}

// DecodeMaterial parses an answer on the client side: at most MaxAnswerBytes, one closed
// Material object (an unknown field, a value of another type or data after it is refused), of
// kind KindAuthority and v 1, every credential with a JWT and an expiry. Binding it to the
// request (the echoed coordinates, the credential's subject) is the caller's.
func DecodeMaterial(b []byte) (*Material, error) {
	if len(b) > MaxAnswerBytes {
		return nil, bad("the answer is %d bytes (at most %d)", len(b), MaxAnswerBytes)
	}
	var m Material
	if err := lifecycle.DecodeObject(b, &m); err != nil {
		return nil, bad("the answer: %v", err)
	}
	if m.V != 1 || m.Kind != KindAuthority || !m.Operation.Served() {
		return nil, bad("the answer is not a v 1 %s answer of a served operation", KindAuthority)
	}
	for _, c := range []*Credential{m.Credentials.Supervisor, m.Credentials.RetirementRequester} {
		if c != nil && (c.JWT == "" || c.Exp <= 0) {
			return nil, bad("the answer has a credential without a JWT or an expiry")
		}
	}
	return &m, nil
}

// DecodeRefusal parses a refusal's body (at most MaxAnswerBytes, the closed {"error","code"} with
// a code); status is the HTTP status it came with.
func DecodeRefusal(status int, b []byte) (*Refusal, error) {
	if len(b) > MaxAnswerBytes {
		return nil, bad("the refusal is %d bytes (at most %d)", len(b), MaxAnswerBytes)
	}
	r := &Refusal{Status: status}
	if err := lifecycle.DecodeObject(b, r); err != nil {
		return nil, bad("the refusal: %v", err)
	}
	if r.Code == "" || len(r.Code) > 64 || len(r.Msg) > 4096 {
		return nil, bad("the refusal has no code, or a code or message too long")
	}
	return r, nil
}
