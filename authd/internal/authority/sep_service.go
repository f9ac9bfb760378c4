package authority

// Service endpoint state (seed 002; issue 24 item 4): the /service-endpoint-authority requests
// after the route verified their proof, against the sep. rows of the auth bucket and the endpoint
// gate family (epgate.<epTok>.<iid>, svc.<epTok>.<iid>) the manager's registrations use.
//
// Every effectful request binds its requestId to its body digest in the instance's request
// ledger (sep.req.<epTok>.<iid>) after its authorization: a changed body under a bound requestId
// is conflict body-changed, the 65th distinct requestId is denied rate-limited. Register, decide
// and ready replay their bound outcome (advancing it where it stopped); activate and renew mint
// anew on every replay. Name-bind binds in its own create-only row.
//
// Refused (each an answer, nothing written unless said): another account or space
// (permission-denied); a proof kind the kind does not take (permission-denied); an owner that
// is not the proposal's, the registration's or the name binding's (permission-denied); a
// contract that does not check (bad-request); a refused, revoked, superseded or expired proposal
// or approval, a re-registration after activation, a witness that is not the current
// registration's, an ended root (failed-precondition); a store that does not answer, a corrupt
// row or a plane claim not held (unavailable: replay the same request).

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

// Service endpoint lifetimes.
const (
	// ProposalLifetime is how long a registration proposal stays open for its decision.
	ProposalLifetime = 7 * 24 * time.Hour
	// DefaultApproval and MaxApproval bound an approval (decide's approvalSeconds).
	DefaultApproval = 30 * 24 * time.Hour
	MaxApproval     = 365 * 24 * time.Hour
	// StaleFreeze is how long a registration barrier may hold its freeze before another
	// register rolls it forward or aborts it; its own replay adopts it at any age.
	StaleFreeze = 30 * time.Second
	// sepMaxRounds bounds the re-reads after a lost revision on a ledger or proposal write.
	sepMaxRounds = 8
)

// sepState is the service endpoint part of an Authority.
type sepState struct {
	mu sync.Mutex
	// flights are the instances (epTok.iid) whose register barrier runs in this process.
	flights map[string]bool
	// fault, set only by tests, runs before each service write with its point name; an error
	// stops the request there as a store failure would (unavailable).
	fault func(point string) error
	// fns, set only by tests while pkg/serviceaccess is a floor, replaces its functions.
	fns *sepFuncs
}

// sepFuncs are the pkg/serviceaccess functions the state calls.
type sepFuncs struct {
	check      func(c *serviceaccess.Contract, endpoint string) error
	canonical  func(s serviceaccess.Snapshot) ([]byte, error)
	witnessOf  func(canonical []byte) string
	bodyDigest func(r *serviceaccess.Request) (string, error)
}

var realSepFuncs = sepFuncs{
	check:      func(c *serviceaccess.Contract, ep string) error { _, err := c.Check(ep); return err },
	canonical:  serviceaccess.Snapshot.Canonical,
	witnessOf:  serviceaccess.WitnessOf,
	bodyDigest: serviceaccess.BodyDigest,
}

func (a *Authority) sepFn() *sepFuncs {
	if a.sep.fns != nil {
		return a.sep.fns
	}
	return &realSepFuncs
}

// sepFault is the test hook before a write.
func (a *Authority) sepFault(point string) error {
	if a.sep.fault != nil {
		if err := a.sep.fault(point); err != nil {
			return &Error{Code: CodeUnavailable, Msg: "fault at " + point, Err: err}
		}
	}
	return nil
}

// sepWrite is the plane check and the test hook, then a create (rev 0) or an update at rev of
// a service row of at most rowMax bytes.
func (a *Authority) sepWrite(ctx context.Context, point, key string, value []byte, rev uint64, rowMax int) (uint64, error) {
	if err := a.sepFault(point); err != nil {
		return 0, err
	}
	if err := a.held(); err != nil {
		return 0, err
	}
	return a.store.putSep(ctx, key, value, rev, rowMax)
}

// sepProofAllowed is the kind x proof matrix (the route checks it first; this is its echo).
func sepProofAllowed(req *serviceaccess.Request, c ServiceCaller) bool {
	switch c.Proof {
	case serviceaccess.ProofIDP:
		if space.ValidateDerivedOwner(c.Owner) != nil {
			return false
		}
		switch req.Kind {
		case serviceaccess.KindRegister, serviceaccess.KindActivate, serviceaccess.KindStatus, serviceaccess.KindDecide:
			return true
		}
	case serviceaccess.ProofRenewal:
		r := c.Renewal
		if r == nil || r.Sub != c.Owner || r.Ep != req.Endpoint || r.Iid != req.Instance {
			return false
		}
		switch req.Kind {
		case serviceaccess.KindActivate, serviceaccess.KindRenew:
			return r.Wit == req.Witness
		case serviceaccess.KindStatus:
			return true
		}
	case serviceaccess.ProofAccess:
		x := c.Access
		if x == nil || x.Sub != c.Owner || x.Ep != req.Endpoint || x.Iid != req.Instance {
			return false
		}
		switch req.Kind {
		case serviceaccess.KindReady:
			return x.Wit == req.Witness
		case serviceaccess.KindStatus:
			return true
		}
	case serviceaccess.ProofOperator:
		return c.Owner == "" && (req.Kind == serviceaccess.KindNameBind || req.Kind == serviceaccess.KindStatus)
	}
	return false
}

func sepDenied(req *serviceaccess.Request, code, reason, msg string) *serviceaccess.Answer {
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerDenied, RequestID: req.RequestID, Code: code, Reason: reason, Message: msg}
}

func sepConflict(req *serviceaccess.Request, reason, witness, msg string) *serviceaccess.Answer {
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerConflict, RequestID: req.RequestID, Reason: reason, Witness: witness, Message: msg}
}

func sepBusy(req *serviceaccess.Request, msg string) *serviceaccess.Answer {
	return &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable, RequestID: req.RequestID, Message: msg}
}

// newSepID is prefix and 26 lowercase base32 characters of 16 random bytes (a root or proposal).
func newSepID(prefix string) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return prefix + sepBase32.EncodeToString(b[:]), nil
}

var sepBase32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// contractDigest is the authority's pin of a contract: "sha256:<hex>" of its JSON (closures and
// artifacts in the contract's own order, HTML characters unescaped).
func contractDigest(c *serviceaccess.Contract) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(c); err != nil {
		return "", err
	}
	sum := sha256.Sum256(bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}))
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// sepKeys validates a request's endpoint and instance as key coordinates.
func sepKeys(req *serviceaccess.Request) error {
	if _, err := lifecycle.EndpointGateKey(req.Endpoint, req.Instance); err != nil {
		return refuse(CodeBadRequest, "%v", err)
	}
	if !sepRequestID(req.RequestID) && req.Kind != serviceaccess.KindStatus {
		return refuse(CodeBadRequest, "requestId is not 8 to 64 of [A-Za-z0-9_-]")
	}
	return nil
}

func sepRequestID(s string) bool {
	if len(s) < 8 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// sepBind binds req's requestId in its instance's ledger to (op, digest) with outcome o, or
// finds it bound. It returns the bound entry and whether it was bound before, or a conflict or
// rate-limited answer.
func (a *Authority) sepBind(ctx context.Context, req *serviceaccess.Request, digest string, o lifecycle.ServiceOutcome) (lifecycle.ServiceLedgerEntry, bool, *serviceaccess.Answer, error) {
	key, _ := lifecycle.ServiceLedgerKey(req.Endpoint, req.Instance)
	for range sepMaxRounds {
		l, rev, found, err := a.store.ServiceLedger(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return lifecycle.ServiceLedgerEntry{}, false, nil, err
		}
		if e, i := l.Find(req.RequestID); i >= 0 {
			if e.Operation != string(req.Kind) || e.Digest != digest {
				return e, true, sepConflict(req, serviceaccess.ReasonBodyChanged, "", "the requestId is bound to another request body"), nil
			}
			return e, true, nil, nil
		}
		if len(l.Entries) >= lifecycle.MaxServiceLedgerEntries {
			return lifecycle.ServiceLedgerEntry{}, false, sepDenied(req, serviceaccess.CodeRateLimited, "ledger-full",
				fmt.Sprintf("the instance has bound %d requests; replay a bound requestId", lifecycle.MaxServiceLedgerEntries)), nil
		}
		e := lifecycle.ServiceLedgerEntry{RequestID: req.RequestID, Operation: string(req.Kind), Digest: digest, Outcome: o}
		l.Endpoint, l.InstanceID = req.Endpoint, req.Instance
		l.Entries = append(l.Entries, e)
		b, err := lifecycle.EncodeServiceLedger(l)
		if err != nil {
			return e, false, nil, err
		}
		_, err = a.sepWrite(ctx, "ledger-bind", key, b, rev, lifecycle.MaxServiceRowBytes)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return e, false, nil, err
		}
		if !found {
			a.log.Info("service ledger created", "key", key)
		}
		return e, false, nil, nil
	}
	return lifecycle.ServiceLedgerEntry{}, false, nil, refuse(CodeUnavailable, "%s kept moving", key)
}

// sepSetOutcome rewrites requestID's bound outcome; when must is set, the entry's outcome must
// still satisfy it (else nothing is written and ok is false).
func (a *Authority) sepSetOutcome(ctx context.Context, point string, req *serviceaccess.Request, o lifecycle.ServiceOutcome, must func(lifecycle.ServiceOutcome) bool) (bool, error) {
	key, _ := lifecycle.ServiceLedgerKey(req.Endpoint, req.Instance)
	for range sepMaxRounds {
		l, rev, found, err := a.store.ServiceLedger(ctx, req.Endpoint, req.Instance)
		if err != nil {
			return false, err
		}
		_, i := l.Find(req.RequestID)
		if !found || i < 0 {
			return false, fmt.Errorf("%w: %s lost the entry of %s", ErrCorrupt, key, req.RequestID)
		}
		if must != nil && !must(l.Entries[i].Outcome) {
			return false, nil
		}
		if l.Entries[i].Outcome == o {
			return true, nil
		}
		l.Entries[i].Outcome = o
		b, err := lifecycle.EncodeServiceLedger(l)
		if err != nil {
			return false, err
		}
		_, err = a.sepWrite(ctx, point, key, b, rev, lifecycle.MaxServiceRowBytes)
		if errors.Is(err, ErrConflict) {
			continue
		}
		return err == nil, err
	}
	return false, refuse(CodeUnavailable, "%s kept moving", key)
}

// sepNameBind binds an endpoint name to an owner, create-only (operator).
func (a *Authority) sepNameBind(ctx context.Context, req *serviceaccess.Request) (*serviceaccess.Answer, error) {
	key, err := lifecycle.ServiceNameKey(req.Endpoint)
	if err != nil {
		return nil, refuse(CodeBadRequest, "%v", err)
	}
	if space.ValidateDerivedOwner(req.Owner) != nil || !sepRequestID(req.RequestID) {
		return nil, refuse(CodeBadRequest, "owner or requestId is outside its grammar")
	}
	digest, err := a.sepFn().bodyDigest(req)
	if err != nil {
		return nil, err
	}
	bound := &serviceaccess.Answer{Kind: serviceaccess.AnswerBound, RequestID: req.RequestID, Endpoint: req.Endpoint, Owner: req.Owner}
	for range sepMaxRounds {
		n, _, found, err := a.store.ServiceName(ctx, req.Endpoint)
		if err != nil {
			return nil, err
		}
		if found {
			switch {
			case n.RequestID == req.RequestID && n.Digest != digest:
				return sepConflict(req, serviceaccess.ReasonBodyChanged, "", "the requestId is bound to another request body"), nil
			case n.Owner != req.Owner:
				return sepConflict(req, serviceaccess.ReasonExpected, "", "the endpoint name is bound to another owner"), nil
			}
			return bound, nil
		}
		b, err := lifecycle.EncodeServiceName(lifecycle.ServiceName{Endpoint: req.Endpoint, Owner: req.Owner, RequestID: req.RequestID, Digest: digest})
		if err != nil {
			return nil, err
		}
		_, err = a.sepWrite(ctx, "name-bind", key, b, 0, lifecycle.MaxServiceRowBytes)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return bound, nil
	}
	return nil, refuse(CodeUnavailable, "%s kept moving", key)
}

// approvalCurrent reports whether p stands approved at now.
func approvalCurrent(p lifecycle.ServiceProposal, found bool, now int64) bool {
	return found && p.State == lifecycle.ProposalApproved && p.ApprovalExpiresAt > now
}

// sepDecide approves, refuses or revokes the instance's current proposal (its owner, who must
// also own the endpoint name).
func (a *Authority) sepDecide(ctx context.Context, req *serviceaccess.Request, owner string) (*serviceaccess.Answer, error) {
	if err := sepKeys(req); err != nil {
		return nil, err
	}
	p, prev, pfound, err := a.store.ServiceProposal(ctx, req.Endpoint, req.Instance)
	if err != nil {
		return nil, err
	}
	if !pfound || p.Proposal != req.Proposal {
		return sepDenied(req, serviceaccess.CodeNotFound, "proposal", "the proposal is not the instance's current proposal"), nil
	}
	if p.Owner != owner {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "owner", "the proposal belongs to another owner"), nil
	}
	n, _, nfound, err := a.store.ServiceName(ctx, req.Endpoint)
	if err != nil {
		return nil, err
	}
	if !nfound {
		return sepDenied(req, serviceaccess.CodeFailedPrecondition, "name-unbound", "the endpoint name is not bound; an operator binds it first"), nil
	}
	if n.Owner != owner {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "name-owner", "the endpoint name is bound to another owner"), nil
	}
	now := a.now().Unix()
	out := lifecycle.ServiceOutcome{Kind: lifecycle.OutcomeDecided, Proposal: p.Proposal, Decision: string(req.Decision)}
	switch req.Decision {
	case serviceaccess.DecisionApprove:
		if req.Contract == nil {
			return nil, refuse(CodeBadRequest, "approve carries the contract")
		}
		if err := a.sepFn().check(req.Contract, req.Endpoint); err != nil {
			return nil, refuse(CodeBadRequest, "contract: %v", err)
		}
		cd, err := contractDigest(req.Contract)
		if err != nil {
			return nil, refuse(CodeBadRequest, "contract: %v", err)
		}
		if cd != p.ContractDigest {
			return sepDenied(req, serviceaccess.CodeBadRequest, "contract", "the contract is not the proposal's"), nil
		}
		secs := req.ApprovalSeconds
		if secs == 0 {
			secs = int64(DefaultApproval / time.Second)
		}
		if secs < 1 || secs > int64(MaxApproval/time.Second) {
			return sepDenied(req, serviceaccess.CodeBadRequest, "approval-seconds", "approvalSeconds is not in 1..31536000"), nil
		}
		out.ApprovalExpiresAt = now + secs
	case serviceaccess.DecisionRefuse, serviceaccess.DecisionRevoke:
	default:
		return nil, refuse(CodeBadRequest, "decision is not approve, refuse or revoke")
	}
	digest, err := a.sepFn().bodyDigest(req)
	if err != nil {
		return nil, err
	}
	e, existed, ans, err := a.sepBind(ctx, req, digest, out)
	if ans != nil || err != nil {
		return ans, err
	}
	if existed {
		if e.Outcome.Kind != lifecycle.OutcomeDecided {
			return nil, fmt.Errorf("%w: a decide bound to a %s outcome", ErrCorrupt, e.Outcome.Kind)
		}
		out = e.Outcome // the replay applies what the first call bound
	}
	decided := &serviceaccess.Answer{Kind: serviceaccess.AnswerDecided, RequestID: req.RequestID, Proposal: p.Proposal,
		Decision: req.Decision, ApprovalExpiresAt: out.ApprovalExpiresAt}
	pkey, _ := lifecycle.ServiceProposalKey(req.Endpoint, req.Instance)
	switch req.Decision {
	case serviceaccess.DecisionApprove:
		if p.State == lifecycle.ProposalApproved && p.ApprovalExpiresAt == out.ApprovalExpiresAt {
			return decided, nil // this decide's approval is stored
		}
		if p.State != lifecycle.ProposalOpen {
			return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-"+p.State, "the proposal is "+p.State), nil
		}
		if p.ExpiresAt <= now {
			return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-expired", "the proposal expired; the service proposes again"), nil
		}
		if err := a.sepPutArtifacts(ctx, req.Contract); err != nil {
			return nil, err
		}
		p.State, p.ApprovalExpiresAt = lifecycle.ProposalApproved, out.ApprovalExpiresAt
	case serviceaccess.DecisionRefuse:
		if p.State == lifecycle.ProposalRefused && existed {
			return decided, nil
		}
		if p.State != lifecycle.ProposalOpen {
			return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-"+p.State, "only an open proposal is refused"), nil
		}
		p.State = lifecycle.ProposalRefused
	case serviceaccess.DecisionRevoke:
		if p.State == lifecycle.ProposalRevoked && existed {
			if err := a.sepEndRoot(ctx, req, now); err != nil {
				return nil, err
			}
			return decided, nil
		}
		if p.State != lifecycle.ProposalApproved {
			return sepDenied(req, serviceaccess.CodeFailedPrecondition, "proposal-"+p.State, "only an approved proposal is revoked"), nil
		}
		p.State = lifecycle.ProposalRevoked
	}
	b, err := lifecycle.EncodeServiceProposal(p)
	if err != nil {
		return nil, err
	}
	if _, err := a.sepWrite(ctx, "decide", pkey, b, prev, lifecycle.MaxServiceRowBytes); err != nil {
		return nil, err // a lost revision too: the replay decides again on what it reads
	}
	if req.Decision == serviceaccess.DecisionRevoke {
		if err := a.sepEndRoot(ctx, req, now); err != nil {
			return nil, err
		}
	}
	return decided, nil
}

// sepEndRoot ends the instance's root at now (a revoke), if it has one still standing.
func (a *Authority) sepEndRoot(ctx context.Context, req *serviceaccess.Request, now int64) error {
	key, _ := lifecycle.ServiceRootKey(req.Endpoint, req.Instance)
	for range sepMaxRounds {
		r, rev, found, err := a.store.ServiceRoot(ctx, req.Endpoint, req.Instance)
		if err != nil || !found || r.ExpiresAt <= now {
			return err
		}
		r.ExpiresAt = max(now, 1)
		b, err := lifecycle.EncodeServiceRoot(r)
		if err != nil {
			return err
		}
		_, err = a.sepWrite(ctx, "root-end", key, b, rev, lifecycle.MaxServiceRowBytes)
		if errors.Is(err, ErrConflict) {
			continue
		}
		return err
	}
	return refuse(CodeUnavailable, "%s kept moving", key)
}

// sepPutArtifacts stores each artifact of c create-only; an existing row must hold the same bytes.
func (a *Authority) sepPutArtifacts(ctx context.Context, c *serviceaccess.Contract) error {
	for _, art := range c.Artifacts {
		row := lifecycle.ServiceArtifact{Digest: art.Digest, Bytes: art.Bytes}
		b, err := lifecycle.EncodeServiceArtifact(row)
		if err != nil {
			return refuse(CodeBadRequest, "artifact: %v", err)
		}
		key, _ := lifecycle.ServiceArtifactKey(art.Digest)
		got, _, found, err := a.store.ServiceArtifact(ctx, art.Digest)
		if err != nil {
			return err
		}
		if found {
			if !lifecycle.SameArtifact(got, row) {
				return fmt.Errorf("%w: %s holds other bytes", ErrCorrupt, key)
			}
			continue
		}
		if _, err := a.sepWrite(ctx, "artifact", key, b, 0, lifecycle.MaxServiceArtifactRowBytes); err != nil && !errors.Is(err, ErrConflict) {
			return err
		} else if err != nil {
			// Another writer stored it since the read: it must be the same bytes.
			if got, _, _, err := a.store.ServiceArtifact(ctx, art.Digest); err != nil || !lifecycle.SameArtifact(got, row) {
				return fmt.Errorf("%w: %s holds other bytes (%v)", ErrCorrupt, key, err)
			}
		}
	}
	return nil
}
