package serviceaccess

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

// MaxApprovalSeconds bounds a decide's approvalSeconds (one year).
const MaxApprovalSeconds = 31536000

// Bounds of an answer's and an Info's free fields.
const (
	MaxMessageBytes = 1024
	MaxInfoKeys     = 16
)

// fieldsOf lists the keys a request of kind k carries besides kind, account and space (and
// requestId for every kind but status), and which of them are optional.
func fieldsOf(k Kind) (fields []string, optional []string, ok bool) {
	switch k {
	case KindRegister:
		return []string{"endpoint", "instance", "contract", "expected"}, []string{"expected"}, true
	case KindActivate, KindRenew, KindReady:
		return []string{"endpoint", "instance", "witness"}, nil, true
	case KindStatus:
		return []string{"endpoint", "instance", "target"}, nil, true
	case KindNameBind:
		return []string{"endpoint", "owner"}, nil, true
	case KindDecide:
		return []string{"endpoint", "instance", "proposal", "contract", "decision", "approvalSeconds"}, []string{"approvalSeconds"}, true
	}
	return nil, nil, false
}

// ValidKind reports whether k is a request kind.
func ValidKind(k Kind) bool { _, _, ok := fieldsOf(k); return ok }

// ParseEnvelope parses a POST body closed and validates the request for its kind and the proof
// for its kind. It does not check authorization. It refuses, with an *Error naming the field: a
// body that is not exactly one JSON object of request and proof; an unknown, duplicated or
// re-cased key at any level; trailing data; null or a value of another type; a request field
// of another kind or a missing one; account not a NATS account public key; space not a space
// name; requestId (every kind but status) outside its grammar; endpoint, instance, witness,
// owner (a derived owner) or proposal outside theirs; a contract that fails Check(endpoint);
// expected other than {state:"registered", witness}; a target other than {kind:"instance"} or
// {kind:"operation", operation, requestId} with operation a kind other than status; a decision
// outside approve, refuse and revoke; approvalSeconds outside 1..MaxApprovalSeconds or on a
// decision other than approve; a proof kind outside idp, renewal, access and operator; a token
// missing from an idp, renewal or access proof, longer than MaxTokenBytes or outside
// [A-Za-z0-9_.-]; a token on an operator proof.
func ParseEnvelope(b []byte) (*Envelope, error) {
	if len(b) > MaxEnvelopeBytes {
		return nil, fail("", "body is longer than %d bytes", MaxEnvelopeBytes)
	}
	o, err := object(b, "")
	if err != nil {
		return nil, fail("body", "is not exactly one JSON object")
	}
	if err := o.only([]string{"request", "proof"}, "request", "proof"); err != nil {
		return nil, err
	}
	ro, err := o.sub("request")
	if err != nil {
		return nil, err
	}
	req, err := parseRequest(ro)
	if err != nil {
		return nil, err
	}
	po, err := o.sub("proof")
	if err != nil {
		return nil, err
	}
	proof, err := parseProof(po)
	if err != nil {
		return nil, err
	}
	return &Envelope{Request: *req, Proof: *proof}, nil
}

func parseProof(o *obj) (*Proof, error) {
	if err := o.only([]string{"kind", "token"}, "kind"); err != nil {
		return nil, err
	}
	k, err := o.str("kind")
	if err != nil {
		return nil, err
	}
	p := &Proof{Kind: ProofKind(k)}
	switch p.Kind {
	case ProofOperator:
		if o.has("token") {
			return nil, fail(o.field("token"), "an operator proof carries no token")
		}
		return p, nil
	case ProofIDP, ProofRenewal, ProofAccess:
	default:
		return nil, fail(o.field("kind"), "is not idp, renewal, access or operator")
	}
	if !o.has("token") {
		return nil, fail(o.field("token"), "is missing")
	}
	if p.Token, err = o.str("token"); err != nil {
		return nil, err
	}
	if !validTokenText(p.Token) {
		return nil, fail(o.field("token"), "is not 1 to %d bytes of [A-Za-z0-9_.-]", MaxTokenBytes)
	}
	return p, nil
}

// ParseRequest parses one request object closed and validates it for its kind (as
// ParseEnvelope does for the envelope's request).
func ParseRequest(b []byte) (*Request, error) {
	o, err := object(b, "request")
	if err != nil {
		return nil, err
	}
	return parseRequest(o)
}

func parseRequest(o *obj) (*Request, error) {
	if !o.has("kind") {
		return nil, fail(o.field("kind"), "is missing")
	}
	k, err := o.str("kind")
	if err != nil {
		return nil, err
	}
	r := &Request{Kind: Kind(k)}
	fields, optional, ok := fieldsOf(r.Kind)
	if !ok {
		return nil, fail(o.field("kind"), "is not a request kind")
	}
	allowed := append([]string{"kind", "account", "space"}, fields...)
	if r.Kind != KindStatus {
		allowed = append(allowed, "requestId")
	}
	var required []string
	for _, f := range allowed {
		opt := false
		for _, x := range optional {
			opt = opt || f == x
		}
		if !opt {
			required = append(required, f)
		}
	}
	if err := o.only(allowed, required...); err != nil {
		return nil, err
	}
	strs := []struct {
		k   string
		dst *string
		ok  func(string) bool
		is  string
	}{
		{"account", &r.Account, nkeys.IsValidPublicAccountKey, "a NATS account public key"},
		{"space", &r.Space, func(s string) bool { return space.ValidateName(s) == nil }, "a space name"},
		{"requestId", &r.RequestID, ValidRequestID, "8 to 64 of [A-Za-z0-9_-]"},
		{"endpoint", &r.Endpoint, ValidEndpoint, "an endpoint name"},
		{"instance", &r.Instance, validInstance, "an instance id (26 to 32 of [a-z0-9])"},
		{"witness", &r.Witness, ValidWitness, "a witness"},
		{"owner", &r.Owner, validDerivedOwner, "a derived owner"},
		{"proposal", &r.Proposal, ValidProposal, "a proposal id"},
	}
	for _, f := range strs {
		if !o.has(f.k) {
			continue
		}
		if *f.dst, err = o.str(f.k); err != nil {
			return nil, err
		}
		if !f.ok(*f.dst) {
			return nil, fail(o.field(f.k), "is not %s", f.is)
		}
	}
	if o.has("contract") {
		if r.Contract, err = parseContract(o, "contract", r.Endpoint); err != nil {
			return nil, err
		}
	}
	if o.has("expected") {
		eo, err := o.sub("expected")
		if err != nil {
			return nil, err
		}
		if err := eo.only([]string{"state", "witness"}, "state", "witness"); err != nil {
			return nil, err
		}
		e := &Expected{}
		if e.State, err = eo.str("state"); err != nil {
			return nil, err
		}
		if e.State != "registered" {
			return nil, fail(eo.field("state"), `is not "registered"`)
		}
		if e.Witness, err = eo.str("witness"); err != nil {
			return nil, err
		}
		if !ValidWitness(e.Witness) {
			return nil, fail(eo.field("witness"), "is not a witness")
		}
		r.Expected = e
	}
	if o.has("target") {
		if r.Target, err = parseTarget(o); err != nil {
			return nil, err
		}
	}
	if o.has("decision") {
		d, err := o.str("decision")
		if err != nil {
			return nil, err
		}
		r.Decision = Decision(d)
		switch r.Decision {
		case DecisionApprove, DecisionRefuse, DecisionRevoke:
		default:
			return nil, fail(o.field("decision"), "is not approve, refuse or revoke")
		}
	}
	if o.has("approvalSeconds") {
		if r.ApprovalSeconds, err = o.integer("approvalSeconds"); err != nil {
			return nil, err
		}
		if r.ApprovalSeconds < 1 || r.ApprovalSeconds > MaxApprovalSeconds {
			return nil, fail(o.field("approvalSeconds"), "is not 1 to %d", MaxApprovalSeconds)
		}
		if r.Decision != DecisionApprove {
			return nil, fail(o.field("approvalSeconds"), "only an approve carries approvalSeconds")
		}
	}
	return r, nil
}

func parseTarget(o *obj) (*Target, error) {
	to, err := o.sub("target")
	if err != nil {
		return nil, err
	}
	if !to.has("kind") {
		return nil, fail(to.field("kind"), "is missing")
	}
	k, err := to.str("kind")
	if err != nil {
		return nil, err
	}
	t := &Target{Kind: TargetKind(k)}
	switch t.Kind {
	case TargetInstance:
		if err := to.only([]string{"kind"}, "kind"); err != nil {
			return nil, err
		}
		return t, nil
	case TargetOperation:
	default:
		return nil, fail(to.field("kind"), "is not instance or operation")
	}
	if err := to.only([]string{"kind", "operation", "requestId"}, "kind", "operation", "requestId"); err != nil {
		return nil, err
	}
	op, err := to.str("operation")
	if err != nil {
		return nil, err
	}
	t.Operation = Kind(op)
	if !ValidKind(t.Operation) || t.Operation == KindStatus {
		return nil, fail(to.field("operation"), "is not a request kind other than status")
	}
	if t.RequestID, err = to.str("requestId"); err != nil {
		return nil, err
	}
	if !ValidRequestID(t.RequestID) {
		return nil, fail(to.field("requestId"), "is not 8 to 64 of [A-Za-z0-9_-]")
	}
	return t, nil
}

// answerFields lists the keys an answer of kind k carries besides kind, and which are optional.
func answerFields(k AnswerKind) (fields, optional []string, ok bool) {
	switch k {
	case AnswerApprovalRequired:
		return []string{"requestId", "proposal", "expiresAt"}, nil, true
	case AnswerRegistered:
		return []string{"requestId", "witness", "generation", "snapshot"}, nil, true
	case AnswerCredential:
		return []string{"requestId", "witness", "root", "access", "renewal", "approvalExpiresAt"}, []string{"renewal"}, true
	case AnswerReady:
		return []string{"requestId", "witness"}, nil, true
	case AnswerStatus:
		return []string{"instance", "operation"}, []string{"instance", "operation"}, true
	case AnswerBound:
		return []string{"requestId", "endpoint", "owner"}, nil, true
	case AnswerDecided:
		return []string{"requestId", "proposal", "decision", "approvalExpiresAt"}, []string{"approvalExpiresAt"}, true
	case AnswerConflict:
		return []string{"requestId", "reason", "witness", "message"}, []string{"witness", "message"}, true
	case AnswerUnavailable:
		return []string{"requestId", "message"}, []string{"requestId"}, true
	case AnswerDenied:
		return []string{"requestId", "code", "reason", "message"}, []string{"requestId"}, true
	}
	return nil, nil, false
}

// ParseAnswer parses an answer closed and validates its fields for its kind (the Answer doc
// comment's table): an unknown, duplicated or re-cased key, a field of another kind, a missing
// one, null, trailing data or a value outside its grammar is refused. A registered answer's
// snapshot must pass ParseSnapshot, hash to its witness and carry its generation. A status
// answer carries exactly one of instance and operation.
func ParseAnswer(b []byte) (*Answer, error) {
	o, err := object(b, "answer")
	if err != nil {
		return nil, err
	}
	if !o.has("kind") {
		return nil, fail("answer.kind", "is missing")
	}
	k, err := o.str("kind")
	if err != nil {
		return nil, err
	}
	a := &Answer{Kind: AnswerKind(k)}
	fields, optional, ok := answerFields(a.Kind)
	if !ok {
		return nil, fail("answer.kind", "is not an answer kind")
	}
	var required []string
	for _, f := range fields {
		opt := false
		for _, x := range optional {
			opt = opt || f == x
		}
		if !opt {
			required = append(required, f)
		}
	}
	if err := o.only(append([]string{"kind"}, fields...), required...); err != nil {
		return nil, err
	}
	strs := []struct {
		k   string
		dst *string
		ok  func(string) bool
		is  string
	}{
		{"requestId", &a.RequestID, ValidRequestID, "8 to 64 of [A-Za-z0-9_-]"},
		{"proposal", &a.Proposal, ValidProposal, "a proposal id"},
		{"witness", &a.Witness, ValidWitness, "a witness"},
		{"root", &a.Root, ValidRoot, "a root id"},
		{"endpoint", &a.Endpoint, ValidEndpoint, "an endpoint name"},
		{"owner", &a.Owner, validDerivedOwner, "a derived owner"},
		{"code", &a.Code, validCode, "a denial code"},
		{"message", &a.Message, func(s string) bool { return text("", s, MaxMessageBytes) == nil }, "1 to 1024 bytes of text"},
	}
	for _, f := range strs {
		if !o.has(f.k) {
			continue
		}
		if *f.dst, err = o.str(f.k); err != nil {
			return nil, err
		}
		if !f.ok(*f.dst) {
			return nil, fail(o.field(f.k), "is not %s", f.is)
		}
	}
	if o.has("reason") {
		if a.Reason, err = o.str("reason"); err != nil {
			return nil, err
		}
		if a.Kind == AnswerConflict && !validReason(a.Reason) {
			return nil, fail("answer.reason", "is not a conflict reason")
		}
		if !validSlug(a.Reason) {
			return nil, fail("answer.reason", "is not 1 to 64 of [a-z0-9-]")
		}
	}
	if o.has("decision") {
		d, err := o.str("decision")
		if err != nil {
			return nil, err
		}
		a.Decision = Decision(d)
		if a.Decision != DecisionApprove && a.Decision != DecisionRefuse && a.Decision != DecisionRevoke {
			return nil, fail("answer.decision", "is not approve, refuse or revoke")
		}
	}
	for _, f := range []struct {
		k   string
		dst *int64
	}{{"expiresAt", &a.ExpiresAt}, {"approvalExpiresAt", &a.ApprovalExpiresAt}} {
		if !o.has(f.k) {
			continue
		}
		if *f.dst, err = o.integer(f.k); err != nil {
			return nil, err
		}
		if *f.dst < 1 {
			return nil, fail(o.field(f.k), "is not a positive unix time")
		}
	}
	if o.has("generation") {
		g, err := o.integer("generation")
		if err != nil {
			return nil, err
		}
		if g < 1 {
			return nil, fail("answer.generation", "is not at least 1")
		}
		a.Generation = uint64(g)
	}
	if o.has("snapshot") {
		raw := bytes.TrimSpace(o.m["snapshot"])
		s, err := ParseSnapshot(raw)
		if err != nil {
			return nil, err
		}
		if WitnessOf(raw) != a.Witness {
			return nil, fail("answer.snapshot", "does not hash to the answer's witness")
		}
		if s.Generation != a.Generation {
			return nil, fail("answer.snapshot", "does not carry the answer's generation")
		}
		a.Snapshot = append(json.RawMessage(nil), raw...)
	}
	for _, f := range []struct {
		k   string
		dst **Token
	}{{"access", &a.Access}, {"renewal", &a.Renewal}} {
		if !o.has(f.k) {
			continue
		}
		to, err := o.sub(f.k)
		if err != nil {
			return nil, err
		}
		if err := to.only([]string{"token", "exp"}, "token", "exp"); err != nil {
			return nil, err
		}
		t := &Token{}
		if t.Token, err = to.str("token"); err != nil {
			return nil, err
		}
		if !validTokenText(t.Token) {
			return nil, fail(to.field("token"), "is not 1 to %d bytes of [A-Za-z0-9_.-]", MaxTokenBytes)
		}
		if t.Exp, err = to.integer("exp"); err != nil {
			return nil, err
		}
		if t.Exp < 1 {
			return nil, fail(to.field("exp"), "is not a positive unix time")
		}
		*f.dst = t
	}
	if a.Kind == AnswerStatus {
		if o.has("instance") == o.has("operation") {
			return nil, fail("answer", "a status carries exactly one of instance and operation")
		}
		if o.has("instance") {
			if a.Instance, err = parseInstanceStatus(o); err != nil {
				return nil, err
			}
		} else if a.Operation, err = parseOperationStatus(o); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// The instance states a status answer reports.
const (
	StateProposed   = "proposed"
	StateRegistered = "registered"
	StateActive     = "active"
	StateReady      = "ready"
	StateRevoked    = "revoked"
	StateAbsent     = "absent"
)

func parseInstanceStatus(o *obj) (*InstanceStatus, error) {
	io, err := o.sub("instance")
	if err != nil {
		return nil, err
	}
	if err := io.only([]string{"state", "witness", "generation", "proposal", "approvalExpiresAt"}, "state"); err != nil {
		return nil, err
	}
	s := &InstanceStatus{}
	if s.State, err = io.str("state"); err != nil {
		return nil, err
	}
	switch s.State {
	case StateProposed, StateRegistered, StateActive, StateReady, StateRevoked, StateAbsent:
	default:
		return nil, fail(io.field("state"), "is not an instance state")
	}
	if io.has("witness") {
		if s.Witness, err = io.str("witness"); err != nil {
			return nil, err
		}
		if !ValidWitness(s.Witness) {
			return nil, fail(io.field("witness"), "is not a witness")
		}
	}
	if io.has("proposal") {
		if s.Proposal, err = io.str("proposal"); err != nil {
			return nil, err
		}
		if !ValidProposal(s.Proposal) {
			return nil, fail(io.field("proposal"), "is not a proposal id")
		}
	}
	if io.has("generation") {
		g, err := io.integer("generation")
		if err != nil {
			return nil, err
		}
		if g < 1 {
			return nil, fail(io.field("generation"), "is not at least 1")
		}
		s.Generation = uint64(g)
	}
	if io.has("approvalExpiresAt") {
		if s.ApprovalExpiresAt, err = io.integer("approvalExpiresAt"); err != nil {
			return nil, err
		}
		if s.ApprovalExpiresAt < 1 {
			return nil, fail(io.field("approvalExpiresAt"), "is not a positive unix time")
		}
	}
	return s, nil
}

func parseOperationStatus(o *obj) (*OperationStatus, error) {
	po, err := o.sub("operation")
	if err != nil {
		return nil, err
	}
	if err := po.only([]string{"operation", "requestId", "outcome"}, "operation", "requestId"); err != nil {
		return nil, err
	}
	s := &OperationStatus{}
	op, err := po.str("operation")
	if err != nil {
		return nil, err
	}
	s.Operation = Kind(op)
	if !ValidKind(s.Operation) || s.Operation == KindStatus {
		return nil, fail(po.field("operation"), "is not a request kind other than status")
	}
	if s.RequestID, err = po.str("requestId"); err != nil {
		return nil, err
	}
	if !ValidRequestID(s.RequestID) {
		return nil, fail(po.field("requestId"), "is not 8 to 64 of [A-Za-z0-9_-]")
	}
	if po.has("outcome") {
		out, err := po.str("outcome")
		if err != nil {
			return nil, err
		}
		s.Outcome = AnswerKind(out)
		if _, _, ok := answerFields(s.Outcome); !ok || s.Outcome == AnswerStatus {
			return nil, fail(po.field("outcome"), "is not an answer kind other than status")
		}
	}
	return s, nil
}

func validCode(c string) bool {
	return codeStatus(c) != 0
}

func codeStatus(c string) int {
	switch c {
	case CodeBadRequest:
		return http.StatusBadRequest
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodePermissionDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeFailedPrecondition:
		return http.StatusPreconditionFailed
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnsupportedMedia:
		return http.StatusUnsupportedMediaType
	case CodeRateLimited:
		return http.StatusTooManyRequests
	}
	return 0
}

func validReason(r string) bool {
	switch r {
	case ReasonBodyChanged, ReasonOvertaken, ReasonGateMoved, ReasonExpected:
		return true
	}
	return false
}

// HTTPStatus is the status an answer travels with: approval-required 202, conflict 409,
// unavailable 503, denied by its code (bad-request 400, unauthenticated 401, permission-denied
// 403, not-found 404, failed-precondition 412, too-large 413, unsupported-media 415,
// rate-limited 429; an unknown code 403), the other kinds 200, and an unknown kind 500.
func (a *Answer) HTTPStatus() int {
	if a == nil {
		return http.StatusInternalServerError
	}
	switch a.Kind {
	case AnswerApprovalRequired:
		return http.StatusAccepted
	case AnswerConflict:
		return http.StatusConflict
	case AnswerUnavailable:
		return http.StatusServiceUnavailable
	case AnswerDenied:
		if s := codeStatus(a.Code); s != 0 {
			return s
		}
		return http.StatusForbidden
	case AnswerRegistered, AnswerCredential, AnswerReady, AnswerStatus, AnswerBound, AnswerDecided:
		return http.StatusOK
	}
	return http.StatusInternalServerError
}

// Marshal encodes an answer for the wire: encoding/json with HTML characters unescaped, so a
// registered answer's snapshot travels as the exact canonical bytes its witness hashes (a
// default json.Marshal would rewrite '<', '>' and '&' in it).
func (a *Answer) Marshal() ([]byte, error) { return marshalNoHTML(a) }

// ParseInfo parses a GET answer closed: exactly {v:1, account, space, issuer, keys}, account a
// NATS account public key, space a space name, issuer Issuer(space), and 1 to MaxInfoKeys keys,
// each exactly {kty:"OKP", crv:"Ed25519", x, kid, alg:"EdDSA", use:"sig"} with x 32 bytes of
// unpadded base64url, kid its RFC 7638 thumbprint and no kid twice.
func ParseInfo(b []byte) (*Info, error) {
	o, err := object(b, "info")
	if err != nil {
		return nil, err
	}
	keys := []string{"v", "account", "space", "issuer", "keys"}
	if err := o.only(keys, keys...); err != nil {
		return nil, err
	}
	in := &Info{}
	v, err := o.integer("v")
	if err != nil {
		return nil, err
	}
	if v != 1 {
		return nil, fail("info.v", "is not 1")
	}
	in.V = 1
	if in.Account, err = o.str("account"); err != nil {
		return nil, err
	}
	if !nkeys.IsValidPublicAccountKey(in.Account) {
		return nil, fail("info.account", "is not a NATS account public key")
	}
	if in.Space, err = o.str("space"); err != nil {
		return nil, err
	}
	if space.ValidateName(in.Space) != nil {
		return nil, fail("info.space", "is not a space name")
	}
	if in.Issuer, err = o.str("issuer"); err != nil {
		return nil, err
	}
	if in.Issuer != Issuer(in.Space) {
		return nil, fail("info.issuer", "is not the space's service access issuer")
	}
	raws, err := array(o.m["keys"], "info.keys", MaxInfoKeys)
	if err != nil {
		return nil, err
	}
	if len(raws) == 0 {
		return nil, fail("info.keys", "is empty")
	}
	seen := map[string]bool{}
	for i, raw := range raws {
		ko, err := object(raw, "info.keys["+strconv.Itoa(i)+"]")
		if err != nil {
			return nil, err
		}
		all := []string{"kty", "crv", "x", "kid", "alg", "use"}
		if err := ko.only(all, all...); err != nil {
			return nil, err
		}
		var k JWK
		for _, f := range []struct {
			k   string
			dst *string
		}{{"kty", &k.Kty}, {"crv", &k.Crv}, {"x", &k.X}, {"kid", &k.Kid}, {"alg", &k.Alg}, {"use", &k.Use}} {
			if *f.dst, err = ko.str(f.k); err != nil {
				return nil, err
			}
		}
		if k.Kty != "OKP" || k.Crv != "Ed25519" || k.Alg != "EdDSA" || k.Use != "sig" {
			return nil, fail(ko.path, "is not an OKP Ed25519 EdDSA signing key")
		}
		if x, err := base64.RawURLEncoding.Strict().DecodeString(k.X); err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fail(ko.field("x"), "is not 32 bytes of unpadded base64url")
		}
		if k.Kid != Thumbprint(k.X) {
			return nil, fail(ko.field("kid"), "is not the key's RFC 7638 thumbprint")
		}
		if seen[k.Kid] {
			return nil, fail(ko.field("kid"), "appears twice")
		}
		seen[k.Kid] = true
		in.Keys = append(in.Keys, k)
	}
	return in, nil
}

// Thumbprint is the RFC 7638 thumbprint of an Ed25519 OKP key with base64url x (the kid signerd
// gives its keys): the unpadded base64url SHA-256 of {"crv":"Ed25519","kty":"OKP","x":x}.
func Thumbprint(x string) string {
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}
