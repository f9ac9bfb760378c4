package lifecycle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/cotalgo/cotal/pkg/space"
)

// Service endpoint rows (seed 002, sepkeys.go): each is encoded and decoded like the lifecycle
// rows (version first, closed, canonical byte for byte), under larger bounds: a request ledger
// holds up to MaxServiceLedgerEntries entries and an artifact row carries its bytes.
const (
	// MaxServiceRowBytes bounds a name binding, request ledger, proposal or root row.
	MaxServiceRowBytes = 64 << 10
	// MaxServiceArtifactBytes bounds one artifact's bytes; its row (base64) stays under
	// MaxServiceArtifactRowBytes, well inside a broker's default 1 MiB payload.
	MaxServiceArtifactBytes    = 256 << 10
	MaxServiceArtifactRowBytes = 384 << 10
	// MaxServiceLedgerEntries is how many distinct requestIds one instance's ledger binds.
	MaxServiceLedgerEntries = 64
	// ServiceActorPrefix starts a service instance's NATS actor: svc_<instanceId>.
	ServiceActorPrefix = "svc_"
)

// SpecService is a service endpoint registration's part of its spec svc.<epTok>.<iid>: the
// witness the registration answered, its owner, its generation (the endpoint gate's generation
// after the reopen) and the digest of the contract it pins.
type SpecService struct {
	Witness    string `json:"witness"`
	Owner      string `json:"owner"`
	Generation uint64 `json:"generation"`
	Contract   string `json:"contract"`
}

func (s *SpecService) validate(principal, iid string) error {
	if !isWitness(s.Witness) {
		return errors.New("witness is not w_ and 52 base32 characters")
	}
	if err := space.ValidateDerivedOwner(s.Owner); err != nil {
		return err
	}
	if principal != ServicePrincipal(s.Owner, iid) {
		return errors.New("the principal is not the owner's service actor of the instance")
	}
	if s.Generation < 1 || s.Generation > MaxSafeInteger {
		return errors.New("generation is not in 1..2^53-1")
	}
	if !isSHA256Digest(s.Contract) {
		return errors.New("contract is not sha256:<64 lowercase hex>")
	}
	return nil
}

// ServicePrincipal is the NATS principal of a service instance: <owner>.svc_<instanceId>.
func ServicePrincipal(owner, iid string) string { return owner + "." + ServiceActorPrefix + iid }

// ServiceName is the value of sep.name.<epTok>: the endpoint name's owner, bound create-only by
// an operator's name-bind (RequestID and Digest are that request's, for its replay).
type ServiceName struct {
	Endpoint  string `json:"endpoint"`
	Owner     string `json:"owner"`
	RequestID string `json:"requestId,omitempty"`
	Digest    string `json:"digest,omitempty"`
}

// Ledger outcome states: what a bound request stands at.
const (
	// OutcomeProposed: a register answered approval-required with Proposal (ExpiresAt).
	OutcomeProposed = "proposed"
	// OutcomeRegistering: a register's barrier began (StartedAt) toward Epoch, Witness and
	// Generation; written before its freeze, so a frozen gate names its barrier's entry.
	OutcomeRegistering = "registering"
	// OutcomeRegistered: a register's barrier committed Witness at Generation.
	OutcomeRegistered = "registered"
	// OutcomeDecided: a decide recorded Decision on Proposal (ApprovalExpiresAt for approve).
	OutcomeDecided = "decided"
	// OutcomeCredential: an activate or renew is bound (each replay mints anew).
	OutcomeCredential = "credential"
	// OutcomeReady: a ready is bound to Witness.
	OutcomeReady = "ready"
)

// ServiceOutcome is what a ledger entry's request stands at; the fields are those of its kind.
type ServiceOutcome struct {
	Kind              string `json:"kind"`
	Proposal          string `json:"proposal,omitempty"`
	ExpiresAt         int64  `json:"expiresAt,omitempty"`
	Witness           string `json:"witness,omitempty"`
	Generation        uint64 `json:"generation,omitempty"`
	Epoch             uint64 `json:"epoch,omitempty"`
	StartedAt         int64  `json:"startedAt,omitempty"`
	Decision          string `json:"decision,omitempty"`
	ApprovalExpiresAt int64  `json:"approvalExpiresAt,omitempty"`
}

// ServiceLedgerEntry binds one requestId to its operation and body digest.
type ServiceLedgerEntry struct {
	RequestID string         `json:"requestId"`
	Operation string         `json:"operation"`
	Digest    string         `json:"digest"`
	Outcome   ServiceOutcome `json:"outcome"`
}

// ServiceLedger is the value of sep.req.<epTok>.<iid>: at most MaxServiceLedgerEntries entries,
// each requestId once, in binding order.
type ServiceLedger struct {
	Endpoint   string               `json:"endpoint"`
	InstanceID string               `json:"instanceId"`
	Entries    []ServiceLedgerEntry `json:"entries"`
}

// Find returns the entry of requestID and its index, or -1.
func (l *ServiceLedger) Find(requestID string) (ServiceLedgerEntry, int) {
	for i, e := range l.Entries {
		if e.RequestID == requestID {
			return e, i
		}
	}
	return ServiceLedgerEntry{}, -1
}

// Proposal states.
const (
	ProposalOpen     = "open"
	ProposalApproved = "approved"
	ProposalRefused  = "refused"
	ProposalRevoked  = "revoked"
)

// ServiceProposal is the value of sep.prop.<epTok>.<iid>: the instance's current registration
// proposal, opened by RequestID for Owner and ContractDigest. Times are unix seconds;
// ApprovalExpiresAt is set once approved (and kept when revoked).
type ServiceProposal struct {
	Proposal          string `json:"proposal"`
	Endpoint          string `json:"endpoint"`
	InstanceID        string `json:"instanceId"`
	Owner             string `json:"owner"`
	ContractDigest    string `json:"contractDigest"`
	RequestID         string `json:"requestId"`
	State             string `json:"state"`
	CreatedAt         int64  `json:"createdAt"`
	ExpiresAt         int64  `json:"expiresAt"`
	ApprovalExpiresAt int64  `json:"approvalExpiresAt,omitempty"`
}

// ServiceRoot is the value of sep.root.<epTok>.<iid>: the native root the first activate
// created for Witness at Generation. It ends at ExpiresAt (unix seconds), which a revoke moves
// to the revocation's instant.
type ServiceRoot struct {
	Root       string `json:"root"`
	Witness    string `json:"witness"`
	Generation uint64 `json:"generation"`
	CreatedAt  int64  `json:"createdAt"`
	ExpiresAt  int64  `json:"expiresAt"`
}

// ServiceArtifact is the value of sep.art.<hex>: one approved artifact, its bytes hashing to
// Digest.
type ServiceArtifact struct {
	Digest string `json:"digest"`
	Bytes  []byte `json:"bytes"`
}

func (n *ServiceName) validate() error {
	if _, err := EndpointToken(n.Endpoint); err != nil {
		return err
	}
	if err := space.ValidateDerivedOwner(n.Owner); err != nil {
		return err
	}
	if (n.RequestID == "") != (n.Digest == "") {
		return errors.New("requestId and digest come together")
	}
	if n.RequestID != "" && (!isRequestID(n.RequestID) || !isBodyDigest(n.Digest)) {
		return errors.New("requestId or digest is outside its grammar")
	}
	return nil
}

func (o *ServiceOutcome) validate(op string) error {
	bad := func(what string) error { return fmt.Errorf("a %s outcome of a %s: %s", clip(o.Kind), clip(op), what) }
	if o.ExpiresAt < 0 || o.StartedAt < 0 || o.ApprovalExpiresAt < 0 || o.Generation > MaxSafeInteger || o.Epoch > MaxSafeInteger {
		return bad("a number is out of range")
	}
	if o.Proposal != "" && !isPrefixedID(o.Proposal, "p_") {
		return bad("proposal is not p_ and 26 base32 characters")
	}
	if o.Witness != "" && !isWitness(o.Witness) {
		return bad("witness is not w_ and 52 base32 characters")
	}
	// allowed are the fields of the kind, required those it cannot go without; every other
	// field must be zero.
	var allowed, required []string
	switch {
	case op == "register" && o.Kind == OutcomeProposed:
		allowed, required = []string{"proposal", "expiresAt"}, []string{"proposal", "expiresAt"}
	case op == "register" && o.Kind == OutcomeRegistering:
		allowed, required = []string{"proposal", "witness", "generation", "epoch", "startedAt"}, []string{"proposal", "witness", "generation", "startedAt"}
	case op == "register" && o.Kind == OutcomeRegistered:
		allowed, required = []string{"proposal", "witness", "generation", "epoch"}, []string{"proposal", "witness", "generation"}
	case op == "decide" && o.Kind == OutcomeDecided:
		allowed, required = []string{"proposal", "decision", "approvalExpiresAt"}, []string{"proposal", "decision"}
		switch o.Decision {
		case "approve":
			required = append(required, "approvalExpiresAt")
		case "refuse", "revoke":
		default:
			return bad("decision is not approve, refuse or revoke")
		}
	case (op == "activate" || op == "renew") && o.Kind == OutcomeCredential:
	case op == "ready" && o.Kind == OutcomeReady:
		allowed, required = []string{"witness"}, []string{"witness"}
	default:
		return bad("not an outcome of its operation")
	}
	set := map[string]bool{"proposal": o.Proposal != "", "expiresAt": o.ExpiresAt != 0, "witness": o.Witness != "",
		"generation": o.Generation != 0, "epoch": o.Epoch != 0, "startedAt": o.StartedAt != 0, "decision": o.Decision != "",
		"approvalExpiresAt": o.ApprovalExpiresAt != 0}
	for _, f := range required {
		if !set[f] {
			return bad(f + " is missing")
		}
	}
	for _, f := range allowed {
		delete(set, f)
	}
	for f, v := range set {
		if v {
			return bad(f + " does not belong to it")
		}
	}
	return nil
}

func (l *ServiceLedger) validate() error {
	if _, err := EndpointToken(l.Endpoint); err != nil {
		return err
	}
	if err := space.ValidateUID(l.InstanceID); err != nil {
		return err
	}
	if l.Entries == nil {
		return errors.New("entries is null")
	}
	if len(l.Entries) > MaxServiceLedgerEntries {
		return fmt.Errorf("more than %d entries", MaxServiceLedgerEntries)
	}
	seen := make(map[string]bool, len(l.Entries))
	for _, e := range l.Entries {
		if !isRequestID(e.RequestID) {
			return errors.New("a requestId is outside its grammar")
		}
		if seen[e.RequestID] {
			return fmt.Errorf("requestId %s is bound twice", e.RequestID)
		}
		seen[e.RequestID] = true
		if !isBodyDigest(e.Digest) {
			return errors.New("a digest is outside its grammar")
		}
		switch e.Operation {
		case "register", "activate", "renew", "ready", "decide":
		default:
			return fmt.Errorf("operation %q is not bound by a ledger", clip(e.Operation))
		}
		if err := e.Outcome.validate(e.Operation); err != nil {
			return err
		}
	}
	return nil
}

func (p *ServiceProposal) validate() error {
	if !isPrefixedID(p.Proposal, "p_") {
		return errors.New("proposal is not p_ and 26 base32 characters")
	}
	if _, err := EndpointToken(p.Endpoint); err != nil {
		return err
	}
	if err := space.ValidateUID(p.InstanceID); err != nil {
		return err
	}
	if err := space.ValidateDerivedOwner(p.Owner); err != nil {
		return err
	}
	if !isSHA256Digest(p.ContractDigest) {
		return errors.New("contractDigest is not sha256:<64 lowercase hex>")
	}
	if !isRequestID(p.RequestID) {
		return errors.New("requestId is outside its grammar")
	}
	if p.CreatedAt < 1 || p.ExpiresAt <= p.CreatedAt || p.ApprovalExpiresAt < 0 {
		return errors.New("the times are not 0 < createdAt < expiresAt")
	}
	switch p.State {
	case ProposalOpen, ProposalRefused:
		if p.ApprovalExpiresAt != 0 {
			return fmt.Errorf("a %s proposal carries an approval", p.State)
		}
	case ProposalApproved, ProposalRevoked:
		if p.ApprovalExpiresAt <= p.CreatedAt {
			return fmt.Errorf("a %s proposal without its approval's end", p.State)
		}
	default:
		return fmt.Errorf("state %q is not open, approved, refused or revoked", clip(p.State))
	}
	return nil
}

func (r *ServiceRoot) validate() error {
	if !isPrefixedID(r.Root, "r_") {
		return errors.New("root is not r_ and 26 base32 characters")
	}
	if !isWitness(r.Witness) {
		return errors.New("witness is not w_ and 52 base32 characters")
	}
	if r.Generation < 1 || r.Generation > MaxSafeInteger {
		return errors.New("generation is not in 1..2^53-1")
	}
	if r.CreatedAt < 1 || r.ExpiresAt < 1 {
		return errors.New("a time is not positive")
	}
	return nil
}

func (a *ServiceArtifact) validate() error {
	if !isSHA256Digest(a.Digest) {
		return errors.New("digest is not sha256:<64 lowercase hex>")
	}
	if len(a.Bytes) == 0 || len(a.Bytes) > MaxServiceArtifactBytes {
		return fmt.Errorf("bytes are empty or over %d", MaxServiceArtifactBytes)
	}
	sum := sha256.Sum256(a.Bytes)
	if a.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		return errors.New("the bytes do not hash to the digest")
	}
	return nil
}

// EncodeServiceName validates n and returns its canonical row.
func EncodeServiceName(n ServiceName) ([]byte, error) {
	return encodeRowMax[ServiceName]("service name", n, MaxServiceRowBytes)
}

// DecodeServiceName decodes the row stored at key, a name key whose endpoint the row must name.
func DecodeServiceName(key string, b []byte) (ServiceName, error) {
	n, err := decodeRowMax[ServiceName]("service name", b, MaxServiceRowBytes)
	if err != nil {
		return n, err
	}
	if k, _ := ServiceNameKey(n.Endpoint); k != key {
		return ServiceName{}, fmt.Errorf("%w: service name at %s names another endpoint", ErrCorrupt, clip(key))
	}
	return n, nil
}

// EncodeServiceLedger validates l and returns its canonical row (a nil Entries is written as []).
func EncodeServiceLedger(l ServiceLedger) ([]byte, error) {
	if l.Entries == nil {
		l.Entries = []ServiceLedgerEntry{}
	}
	return encodeRowMax[ServiceLedger]("service ledger", l, MaxServiceRowBytes)
}

// DecodeServiceLedger decodes the row stored at key, a ledger key whose instance the row must
// name.
func DecodeServiceLedger(key string, b []byte) (ServiceLedger, error) {
	l, err := decodeRowMax[ServiceLedger]("service ledger", b, MaxServiceRowBytes)
	if err != nil {
		return l, err
	}
	if k, _ := ServiceLedgerKey(l.Endpoint, l.InstanceID); k != key {
		return ServiceLedger{}, fmt.Errorf("%w: service ledger at %s names another instance", ErrCorrupt, clip(key))
	}
	return l, nil
}

// EncodeServiceProposal validates p and returns its canonical row.
func EncodeServiceProposal(p ServiceProposal) ([]byte, error) {
	return encodeRowMax[ServiceProposal]("service proposal", p, MaxServiceRowBytes)
}

// DecodeServiceProposal decodes the row stored at key, a proposal key whose instance the row
// must name.
func DecodeServiceProposal(key string, b []byte) (ServiceProposal, error) {
	p, err := decodeRowMax[ServiceProposal]("service proposal", b, MaxServiceRowBytes)
	if err != nil {
		return p, err
	}
	if k, _ := ServiceProposalKey(p.Endpoint, p.InstanceID); k != key {
		return ServiceProposal{}, fmt.Errorf("%w: service proposal at %s names another instance", ErrCorrupt, clip(key))
	}
	return p, nil
}

// EncodeServiceRoot validates r and returns its canonical row.
func EncodeServiceRoot(r ServiceRoot) ([]byte, error) {
	return encodeRowMax[ServiceRoot]("service root", r, MaxServiceRowBytes)
}

// DecodeServiceRoot decodes the row stored at key, a root key.
func DecodeServiceRoot(key string, b []byte) (ServiceRoot, error) {
	if _, _, err := parseEndpointKey(key, sepRootPrefix); err != nil {
		return ServiceRoot{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return decodeRowMax[ServiceRoot]("service root", b, MaxServiceRowBytes)
}

// EncodeServiceArtifact validates a and returns its canonical row.
func EncodeServiceArtifact(a ServiceArtifact) ([]byte, error) {
	return encodeRowMax[ServiceArtifact]("service artifact", a, MaxServiceArtifactRowBytes)
}

// DecodeServiceArtifact decodes the row stored at key, the artifact key of the row's digest.
func DecodeServiceArtifact(key string, b []byte) (ServiceArtifact, error) {
	a, err := decodeRowMax[ServiceArtifact]("service artifact", b, MaxServiceArtifactRowBytes)
	if err != nil {
		return a, err
	}
	if k, _ := ServiceArtifactKey(a.Digest); k != key {
		return ServiceArtifact{}, fmt.Errorf("%w: service artifact at %s names another digest", ErrCorrupt, clip(key))
	}
	return a, nil
}

// SameArtifact reports whether two artifact rows are byte-equal (an existing artifact row is
// adopted only if it holds the same bytes).
func SameArtifact(a, b ServiceArtifact) bool {
	return a.Digest == b.Digest && bytes.Equal(a.Bytes, b.Bytes)
}

const base32Lower = "abcdefghijklmnopqrstuvwxyz234567"

func isBase32Lower(s string) bool {
	for i := 0; i < len(s); i++ {
		if !strings.ContainsRune(base32Lower, rune(s[i])) {
			return false
		}
	}
	return true
}

// isPrefixedID: prefix and 26 lowercase base32 characters (a root or a proposal id).
func isPrefixedID(s, prefix string) bool {
	rest, ok := strings.CutPrefix(s, prefix)
	return ok && len(rest) == 26 && isBase32Lower(rest)
}

func isWitness(s string) bool {
	rest, ok := strings.CutPrefix(s, "w_")
	return ok && len(rest) == 52 && isBase32Lower(rest)
}

func isSHA256Digest(s string) bool {
	h, ok := strings.CutPrefix(s, "sha256:")
	return ok && len(h) == 64 && strings.Trim(h, "0123456789abcdef") == ""
}

// isBodyDigest: a ledger's body digest, 1..128 of [A-Za-z0-9:_-] (serviceaccess.BodyDigest's
// form is "sha256:<hex>" or like it).
func isBodyDigest(s string) bool { return isToken(s, 1, 128, ":") }

func isRequestID(s string) bool { return isToken(s, 8, 64, "") }

func isToken(s string, min, max int, extra string) bool {
	if len(s) < min || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || strings.IndexByte(extra, c) >= 0) {
			return false
		}
	}
	return true
}
