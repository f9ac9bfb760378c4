package serviceaccess

import "encoding/json"

// Path is the route both authd faces serve when service endpoints are on.
const Path = "/service-endpoint-authority"

// MaxEnvelopeBytes bounds a POST body; authd answers 413 past it before parsing.
const MaxEnvelopeBytes = 2 << 20

// MaxRequestsPerInstance bounds the distinct requestIds one instance's ledger binds; the next
// one is refused with 429.
const MaxRequestsPerInstance = 64

// Kind is a request kind.
type Kind string

// The request kinds.
const (
	KindRegister Kind = "register"
	KindActivate Kind = "activate"
	KindRenew    Kind = "renew"
	KindReady    Kind = "ready"
	KindStatus   Kind = "status"
	KindNameBind Kind = "name-bind"
	KindDecide   Kind = "decide"
)

// ProofKind is a proof kind.
type ProofKind string

// The proof kinds.
const (
	// ProofIDP carries an IdP token; the owner is derived from it and needs a current
	// interactive cli or web row.
	ProofIDP ProofKind = "idp"
	// ProofRenewal carries a service renewal proof (cotal-service-renewal+jwt).
	ProofRenewal ProofKind = "renewal"
	// ProofAccess carries a service access bearer (cotal-service-access+jwt).
	ProofAccess ProofKind = "access"
	// ProofOperator carries nothing in the body: the request came over the loopback face with
	// Authorization: Bearer <cap>.
	ProofOperator ProofKind = "operator"
)

// Decision is a decide request's verdict.
type Decision string

// The decisions.
const (
	DecisionApprove Decision = "approve"
	DecisionRefuse  Decision = "refuse"
	DecisionRevoke  Decision = "revoke"
)

// Envelope is a POST body: exactly {request, proof}.
type Envelope struct {
	Request Request `json:"request"`
	Proof   Proof   `json:"proof"`
}

// Proof is {kind, token?}: token is required for idp, renewal and access and absent for
// operator.
type Proof struct {
	Kind  ProofKind `json:"kind"`
	Token string    `json:"token,omitempty"`
}

// Expected is a register's precondition: {state:"registered", witness}.
type Expected struct {
	State   string `json:"state"`
	Witness string `json:"witness"`
}

// TargetKind is a status target kind.
type TargetKind string

// The status target kinds.
const (
	TargetInstance  TargetKind = "instance"
	TargetOperation TargetKind = "operation"
)

// Target is a status selector: {kind:"instance"} or {kind:"operation", operation, requestId}
// (operation is a Kind other than status; without it the target does not parse).
type Target struct {
	Kind      TargetKind `json:"kind"`
	Operation Kind       `json:"operation,omitempty"`
	RequestID string     `json:"requestId,omitempty"`
}

// Request is one request. Kind, Account and Space are always present; RequestID is present for
// every kind but status. The other fields are exactly those of the kind:
//
//	register   endpoint, instance, contract, expected?
//	activate   endpoint, instance, witness
//	renew      endpoint, instance, witness
//	ready      endpoint, instance, witness
//	status     endpoint, instance, target
//	name-bind  endpoint, owner
//	decide     endpoint, instance, proposal, contract, decision, approvalSeconds?
//
// A field of another kind is refused, as is a missing one.
type Request struct {
	Kind            Kind      `json:"kind"`
	Account         string    `json:"account"`
	Space           string    `json:"space"`
	RequestID       string    `json:"requestId,omitempty"`
	Endpoint        string    `json:"endpoint,omitempty"`
	Instance        string    `json:"instance,omitempty"`
	Contract        *Contract `json:"contract,omitempty"`
	Expected        *Expected `json:"expected,omitempty"`
	Witness         string    `json:"witness,omitempty"`
	Target          *Target   `json:"target,omitempty"`
	Owner           string    `json:"owner,omitempty"`
	Proposal        string    `json:"proposal,omitempty"`
	Decision        Decision  `json:"decision,omitempty"`
	ApprovalSeconds int64     `json:"approvalSeconds,omitempty"`
}

// AnswerKind is an answer kind.
type AnswerKind string

// The answer kinds, each with its HTTP status.
const (
	AnswerApprovalRequired AnswerKind = "approval-required" // 202
	AnswerRegistered       AnswerKind = "registered"        // 200
	AnswerCredential       AnswerKind = "credential"        // 200
	AnswerReady            AnswerKind = "ready"             // 200
	AnswerStatus           AnswerKind = "status"            // 200
	AnswerBound            AnswerKind = "bound"             // 200 (name-bind)
	AnswerDecided          AnswerKind = "decided"           // 200
	AnswerConflict         AnswerKind = "conflict"          // 409
	AnswerUnavailable      AnswerKind = "unavailable"       // 503
	AnswerDenied           AnswerKind = "denied"            // 400, 401, 403, 404, 412, 413, 415 or 429
)

// Denial codes (Answer.Code of a denied answer).
const (
	CodeBadRequest         = "bad-request"         // 400
	CodeUnauthenticated    = "unauthenticated"     // 401
	CodePermissionDenied   = "permission-denied"   // 403
	CodeNotFound           = "not-found"           // 404
	CodeFailedPrecondition = "failed-precondition" // 412
	CodeTooLarge           = "too-large"           // 413
	CodeUnsupportedMedia   = "unsupported-media"   // 415
	CodeRateLimited        = "rate-limited"        // 429
)

// Conflict reasons (Answer.Reason of a conflict answer).
const (
	ReasonBodyChanged = "body-changed" // the requestId is bound to another body
	ReasonOvertaken   = "overtaken"    // another registration won the barrier
	ReasonGateMoved   = "gate-moved"   // the gate moved under the request without a new registration
	ReasonExpected    = "expected"     // the instance is not in the expected state
)

// Token is one issued token and its expiry (unix seconds).
type Token struct {
	Token string `json:"token"`
	Exp   int64  `json:"exp"`
}

// InstanceStatus is a status answer's view of one instance.
type InstanceStatus struct {
	// State is "proposed", "registered", "active", "ready", "revoked" or "absent".
	State      string `json:"state"`
	Witness    string `json:"witness,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Proposal   string `json:"proposal,omitempty"`
	// ApprovalExpiresAt is unix seconds; zero when no approval stands.
	ApprovalExpiresAt int64 `json:"approvalExpiresAt,omitempty"`
}

// OperationStatus is a status answer's view of one bound request.
type OperationStatus struct {
	Operation Kind   `json:"operation"`
	RequestID string `json:"requestId"`
	// Outcome is the bound answer kind, or "" while unbound.
	Outcome AnswerKind `json:"outcome,omitempty"`
}

// Answer is one answer. Kind selects the fields; requestId (and kind) echo the request.
//
//	approval-required  requestId, proposal, expiresAt
//	registered         requestId, witness, generation, snapshot
//	credential         requestId, witness, root, access, renewal?, approvalExpiresAt
//	ready              requestId, witness
//	status             instance? | operation?
//	bound              requestId, endpoint, owner
//	decided            requestId, proposal, decision, approvalExpiresAt?
//	conflict           requestId, reason, witness?, message?
//	unavailable        requestId?, message
//	denied             requestId?, code, reason, message
//
// Snapshot is the exact canonical bytes the witness hashes (see Snapshot), so a service checks
// it byte for byte against its own.
type Answer struct {
	Kind              AnswerKind       `json:"kind"`
	RequestID         string           `json:"requestId,omitempty"`
	Proposal          string           `json:"proposal,omitempty"`
	ExpiresAt         int64            `json:"expiresAt,omitempty"`
	Witness           string           `json:"witness,omitempty"`
	Generation        uint64           `json:"generation,omitempty"`
	Snapshot          json.RawMessage  `json:"snapshot,omitempty"`
	Root              string           `json:"root,omitempty"`
	Access            *Token           `json:"access,omitempty"`
	Renewal           *Token           `json:"renewal,omitempty"`
	ApprovalExpiresAt int64            `json:"approvalExpiresAt,omitempty"`
	Endpoint          string           `json:"endpoint,omitempty"`
	Owner             string           `json:"owner,omitempty"`
	Decision          Decision         `json:"decision,omitempty"`
	Instance          *InstanceStatus  `json:"instance,omitempty"`
	Operation         *OperationStatus `json:"operation,omitempty"`
	Code              string           `json:"code,omitempty"`
	Reason            string           `json:"reason,omitempty"`
	Message           string           `json:"message,omitempty"`
}

// Info is the GET answer: {v, account, space, issuer, keys}; keys as GET /jwks publishes them.
type Info struct {
	V       int    `json:"v"`
	Account string `json:"account"`
	Space   string `json:"space"`
	Issuer  string `json:"issuer"`
	Keys    []JWK  `json:"keys"`
}

// JWK is one published Ed25519 key (RFC 8037), as GET /jwks serves it.
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}
