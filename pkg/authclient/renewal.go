package authclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

// Source states (SourceState.State).
const (
	// SourceIdle: nothing pulled yet.
	SourceIdle = "idle"
	// SourceReady: the last pull answered a validated credential.
	SourceReady = "ready"
	// SourceUnavailable: the last pull failed in a way the next pull retries, replaying the same
	// request.
	SourceUnavailable = "unavailable"
	// SourceEnded: the space refused the service's access; later pulls send nothing.
	SourceEnded = "ended"
	// SourceClosed: Close was called.
	SourceClosed = "closed"
)

// Source failure causes (SourceState.Cause).
const (
	// CauseStore: the record could not be read, parsed, created or written.
	CauseStore = "store"
	// CauseCredentialExpired: the authority's access bearer (or renewal proof) had already
	// expired by the caller's clock; it was neither stored nor returned.
	CauseCredentialExpired = "credential-expired"
	// CauseTransport: the authority could not be reached or its answer not read.
	CauseTransport = "transport"
	// CauseAuthority: the authority answered unavailable or something that is not a valid,
	// bound credential; for an ended source, the space's refusal.
	CauseAuthority = "authority"
	// CauseRateLimited: the authority answered rate-limited.
	CauseRateLimited = "rate-limited"
	// CauseSignIn: an activate needed the signed-in login and there is none, it failed, or the
	// authority rejected it.
	CauseSignIn = "sign-in"
	// CauseRenewal: the authority rejected the stored renewal proof as unauthenticated; it is
	// dropped, and the next pull activates on the signed-in login.
	CauseRenewal = "renewal"
)

// SourceState is a renewal source's lifecycle state, its fixed failure cause and the expiries
// of what it holds. It never holds a token or remote text.
type SourceState struct {
	State string
	// Cause is set for unavailable and ended, "" otherwise.
	Cause string
	// AccessExp is the last validated access bearer's exp; zero before one.
	AccessExp time.Time
	// RenewalExp is the stored renewal proof's exp; zero when none is stored.
	RenewalExp time.Time
}

// ErrSourceEnded and ErrSourceClosed are what a *SourceError of an ended or closed source is.
var (
	ErrSourceEnded  = errors.New("authclient: the space ended this service's access")
	ErrSourceClosed = errors.New("authclient: the renewal source is closed")
)

var causeText = map[string]string{
	CauseStore:             "the renewal record store failed",
	CauseCredentialExpired: "the authority's credential had expired by this clock",
	CauseTransport:         "the authority could not be reached",
	CauseAuthority:         "the authority gave no valid credential",
	CauseRateLimited:       "the authority is rate-limiting this service",
	CauseSignIn:            "the signed-in login is missing or was rejected",
	CauseRenewal:           "the authority rejected the renewal proof",
}

// SourceError is a pull that yielded no credential. Its text is a fixed sentence per state and
// cause. errors.Is matches ErrSourceEnded or ErrSourceClosed for those states.
type SourceError struct {
	State string
	Cause string
}

func (e *SourceError) Error() string {
	switch e.State {
	case SourceClosed:
		return ErrSourceClosed.Error()
	case SourceEnded:
		return ErrSourceEnded.Error() + "; the renewal source sends nothing more"
	}
	return "authclient: service access unavailable: " + causeText[e.Cause]
}

// Is matches ErrSourceEnded and ErrSourceClosed.
func (e *SourceError) Is(target error) bool {
	return (target == ErrSourceEnded && e.State == SourceEnded) || (target == ErrSourceClosed && e.State == SourceClosed)
}

// RenewalConfig is what ServiceEndpointRenewal needs: where the record lives (Store, or Dir for
// the stock file store) and the instance it activates.
type RenewalConfig struct {
	// Store keeps the record. Exactly one of Store and Dir.
	Store RenewalStore
	// Dir is the stock file store's directory (see NewFileStore).
	Dir string
	// Witness is the registration's witness the source activates and renews. Required.
	Witness string
	// Account and Space default to the provider's and must be them when set.
	Account, Space string
	// Endpoint and Instance are the registered endpoint name and instance id. Required.
	Endpoint, Instance string
}

// RenewalSource is the bearer loop of one serving instance (ServiceEndpointRenewal is its only
// constructor). Each pull is one request: the first activates on the signed-in login, later
// ones renew on the stored renewal proof, and when that proof has expired the same activate
// request is replayed on the login. It keeps one activate and one renew requestId per witness,
// written to its store before the first send and replayed with fresh material for as long as
// the space allows. Concurrent pulls, Bearer and Credential alike, share one request. It owns no
// timer.
//
// A transport failure, rate-limited, a missing or rejected sign-in, or a store failure leaves it
// unavailable and the next pull replays the same request; any other refusal ends it and later
// pulls send nothing. An access bearer already expired by the caller's clock leaves it
// unavailable (credential-expired) and is neither stored nor returned. Close aborts a pull in
// flight.
type RenewalSource struct {
	p     *Provider
	store RenewalStore
	keys  *infoKeys
	wit   string
	coord RenewalRecord // the record's coordinates (no ids, no proof)

	ctx    context.Context // ended by Close
	cancel context.CancelFunc

	mu     sync.Mutex
	state  SourceState
	flight *pull
}

// pull is one request in flight; done closes when ans or err is set.
type pull struct {
	done    chan struct{}
	ans     *serviceaccess.Answer
	err     error
	waiters int // callers joined; mu guards it
}

// ServiceEndpointRenewal returns the renewal source of one registered instance: the only way to
// make one. It reads nothing and sends nothing until the first pull.
func (p *Provider) ServiceEndpointRenewal(cfg RenewalConfig) (*RenewalSource, error) {
	if !serviceaccess.ValidWitness(cfg.Witness) {
		return nil, errors.New("authclient: renewal: Witness is not a witness")
	}
	if cfg.Account == "" {
		cfg.Account = p.account
	}
	if cfg.Space == "" {
		cfg.Space = p.space
	}
	if cfg.Account != p.account || cfg.Space != p.space {
		return nil, errors.New("authclient: renewal: Account and Space must be the provider's")
	}
	if _, err := lifecycle.EndpointToken(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("authclient: renewal: %w", err)
	}
	if err := space.ValidateUID(cfg.Instance); err != nil {
		return nil, fmt.Errorf("authclient: renewal: Instance: %w", err)
	}
	store := cfg.Store
	switch {
	case store != nil && cfg.Dir != "":
		return nil, errors.New("authclient: renewal: Store and Dir are exclusive")
	case store == nil && cfg.Dir == "":
		return nil, errors.New("authclient: renewal: Store or Dir is required")
	case store == nil:
		fs, err := NewFileStore(cfg.Dir)
		if err != nil {
			return nil, err
		}
		store = fs
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &RenewalSource{
		p: p, store: store, keys: &infoKeys{p: p}, wit: cfg.Witness,
		coord: RenewalRecord{
			V: recordVersion, Account: cfg.Account, Space: cfg.Space, Endpoint: cfg.Endpoint,
			Instance: cfg.Instance, Witness: cfg.Witness,
		},
		ctx: ctx, cancel: cancel, state: SourceState{State: SourceIdle},
	}, nil
}

// Bearer pulls: it returns a fresh access bearer, or a *SourceError (or ctx's error when ctx
// ends first; the pull itself goes on for the others sharing it).
func (s *RenewalSource) Bearer(ctx context.Context) (string, error) {
	ans, err := s.join(ctx)
	if err != nil {
		return "", err
	}
	return ans.Access.Token, nil
}

// Credential pulls, like Bearer, and returns the validated credential answer without its
// renewal proof (which never leaves the source), a copy per caller.
func (s *RenewalSource) Credential(ctx context.Context) (*serviceaccess.Answer, error) {
	return s.join(ctx)
}

// State reports the lifecycle state, the fixed cause and the expiries; never a token.
func (s *RenewalSource) State() SourceState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Close closes the source and aborts a pull in flight, returning once that pull has ended (so
// it no longer touches the store); later pulls are refused. Idempotent.
func (s *RenewalSource) Close() {
	s.mu.Lock()
	s.state.State, s.state.Cause = SourceClosed, ""
	f := s.flight
	s.mu.Unlock()
	s.cancel()
	if f != nil {
		<-f.done
	}
}

// SentinelCreds returns the space's sentinel (the provider's Sentinel): the bearer user JWT a
// serving connection presents beside its access bearer, which is what serve.EndpointOptions'
// SentinelCreds takes (pass the method value). It is public and powerless, not a secret. An
// ended or closed source refuses it as it refuses Bearer.
func (s *RenewalSource) SentinelCreds(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	s.mu.Lock()
	st := s.state.State
	s.mu.Unlock()
	if st == SourceEnded || st == SourceClosed {
		return "", &SourceError{State: st, Cause: s.State().Cause}
	}
	if s.p.sentinel == "" {
		return "", errors.New("authclient: renewal: the provider has no Sentinel")
	}
	return s.p.sentinel, nil
}

// join joins the pull in flight or starts one, and waits for it or for ctx.
func (s *RenewalSource) join(ctx context.Context) (*serviceaccess.Answer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if st := s.state.State; st == SourceEnded || st == SourceClosed {
		err := &SourceError{State: st, Cause: s.state.Cause}
		s.mu.Unlock()
		return nil, err
	}
	f := s.flight
	if f == nil {
		f = &pull{done: make(chan struct{})}
		s.flight = f
		go s.run(f)
	}
	f.waiters++
	s.mu.Unlock()
	select {
	case <-f.done:
		if f.err != nil {
			return nil, f.err
		}
		return copyAnswer(f.ans), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// run performs one pull and publishes its outcome to everyone joined.
func (s *RenewalSource) run(f *pull) {
	ans, st := s.pull()
	s.mu.Lock()
	if s.state.State == SourceClosed {
		f.err = &SourceError{State: SourceClosed}
	} else {
		s.state.State, s.state.Cause, s.state.RenewalExp = st.State, st.Cause, st.RenewalExp
		if st.State == SourceReady {
			s.state.AccessExp = time.Unix(ans.Access.Exp, 0)
			f.ans = ans
		} else {
			f.err = &SourceError{State: st.State, Cause: st.Cause}
		}
	}
	s.flight = nil
	s.mu.Unlock()
	close(f.done)
}

// pull sends one request and classifies its outcome into the next state (its RenewalExp that of
// the proof stored after the pull). It returns the credential, without its renewal proof, when
// the state is ready.
func (s *RenewalSource) pull() (*serviceaccess.Answer, SourceState) {
	ctx := s.ctx
	rec, err := s.load()
	if err != nil {
		return nil, SourceState{State: SourceUnavailable, Cause: CauseStore, RenewalExp: s.State().RenewalExp}
	}
	renExp := expOf(rec.Renewal)
	unavailable := func(cause string) SourceState {
		return SourceState{State: SourceUnavailable, Cause: cause, RenewalExp: renExp}
	}
	now := s.p.now()
	req := &serviceaccess.Request{
		Account: rec.Account, Space: rec.Space, Endpoint: rec.Endpoint, Instance: rec.Instance, Witness: rec.Witness,
	}
	var proof *serviceaccess.Proof
	if rec.Renewal != nil && now.Add(clockSlack).Before(time.Unix(rec.Renewal.Exp, 0)) {
		req.Kind, req.RequestID = serviceaccess.KindRenew, rec.RenewRequestID
		proof = &serviceaccess.Proof{Kind: serviceaccess.ProofRenewal, Token: rec.Renewal.Token}
	} else {
		// No renewal proof, or it has expired: the same activate, on the signed-in login.
		if s.p.login == nil {
			return nil, unavailable(CauseSignIn)
		}
		req.Kind, req.RequestID = serviceaccess.KindActivate, rec.ActivateRequestID
	}
	// The keys first, so a transport failure is not taken for a bad credential.
	if err := s.keys.ensure(ctx); err != nil {
		return nil, unavailable(classify(err))
	}
	ans, err := s.p.ServiceEndpointAuthority(ctx, req, proof)
	if err != nil {
		return nil, unavailable(classify(err))
	}
	switch ans.Kind {
	case serviceaccess.AnswerCredential:
	case serviceaccess.AnswerUnavailable:
		return nil, unavailable(CauseAuthority)
	case serviceaccess.AnswerDenied:
		switch {
		case ans.Code == serviceaccess.CodeRateLimited:
			return nil, unavailable(CauseRateLimited)
		case proof == nil && (ans.Code == serviceaccess.CodeUnauthenticated || ans.Code == serviceaccess.CodePermissionDenied):
			return nil, unavailable(CauseSignIn)
		case proof != nil && ans.Code == serviceaccess.CodeUnauthenticated:
			// The authority does not take the proof this clock holds live: drop it, and the next
			// pull activates on the login under the same activate requestId.
			drop := *rec
			drop.Renewal = nil
			if err := s.store.Save(&drop); err != nil {
				return nil, unavailable(CauseStore)
			}
			renExp = time.Time{}
			return nil, unavailable(CauseRenewal)
		}
		return nil, SourceState{State: SourceEnded, Cause: CauseAuthority, RenewalExp: renExp}
	default:
		// A conflict: the persisted requestId is bound to another body, which no replay mends.
		return nil, SourceState{State: SourceEnded, Cause: CauseAuthority, RenewalExp: renExp}
	}
	cred, cause := s.validate(ctx, ans)
	if cause != "" {
		return nil, unavailable(cause)
	}
	st := SourceState{State: SourceReady, RenewalExp: renExp}
	if ans.Renewal != nil {
		next := *rec
		next.Renewal = &serviceaccess.Token{Token: ans.Renewal.Token, Exp: ans.Renewal.Exp}
		if err := s.store.Save(&next); err != nil {
			return nil, unavailable(CauseStore)
		}
		st.RenewalExp = time.Unix(ans.Renewal.Exp, 0)
	}
	return cred, st
}

// load reads the witness's record, creating it (fresh requestIds, no proof) before anything is
// sent, and checks it is this source's.
func (s *RenewalSource) load() (*RenewalRecord, error) {
	rec, err := s.store.Load(s.wit)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		act, err := NewNonce()
		if err != nil {
			return nil, err
		}
		ren, err := NewNonce()
		if err != nil {
			return nil, err
		}
		fresh := s.coord
		fresh.ActivateRequestID, fresh.RenewRequestID = "act_"+act, "ren_"+ren
		if err := s.store.Save(&fresh); err != nil {
			return nil, err
		}
		return &fresh, nil
	}
	if err := rec.check(); err != nil {
		return nil, err
	}
	c := *rec
	c.ActivateRequestID, c.RenewRequestID, c.Renewal = "", "", nil
	if c != s.coord {
		return nil, errors.New("authclient: renewal record is another instance's")
	}
	return rec, nil
}

// validate checks a credential answer: the access bearer (and the renewal proof, when there is
// one) verified with the authority's published keys under the shared validator, both naming
// this witness, endpoint, instance and the answer's root, and neither expired by the caller's
// clock. It returns the answer without its renewal proof, or the failure's cause.
func (s *RenewalSource) validate(ctx context.Context, ans *serviceaccess.Answer) (*serviceaccess.Answer, string) {
	if ans.Access == nil || ans.Witness != s.wit {
		return nil, CauseAuthority
	}
	now := s.p.now()
	if ans.Access.Exp <= now.Unix() || (ans.Renewal != nil && ans.Renewal.Exp <= now.Unix()) {
		return nil, CauseCredentialExpired
	}
	v := &serviceaccess.Validator{Space: s.coord.Space, Keys: s.keys, Now: s.p.now}
	ac, err := v.Access(ctx, ans.Access.Token)
	if err != nil {
		return nil, tokenCause(err)
	}
	if ac.Exp != ans.Access.Exp || ac.Wit != s.wit || ac.Ep != s.coord.Endpoint || ac.Iid != s.coord.Instance || ac.Root != ans.Root {
		return nil, CauseAuthority
	}
	if ans.Renewal != nil {
		rc, err := v.Renewal(ctx, ans.Renewal.Token)
		if err != nil {
			return nil, tokenCause(err)
		}
		if rc.Exp != ans.Renewal.Exp || rc.Wit != s.wit || rc.Ep != s.coord.Endpoint || rc.Iid != s.coord.Instance ||
			rc.Root != ans.Root || rc.Sub != ac.Sub {
			return nil, CauseAuthority
		}
	}
	out := copyAnswer(ans)
	out.Renewal = nil
	return out, ""
}

// expOf is a token's exp as a time; zero for none.
func expOf(t *serviceaccess.Token) time.Time {
	if t == nil {
		return time.Time{}
	}
	return time.Unix(t.Exp, 0)
}

// tokenCause classifies a refused token: expiry by the caller's clock, else the authority's.
func tokenCause(err error) string {
	var te *serviceaccess.TokenError
	if errors.As(err, &te) && te.Check == serviceaccess.CheckExp {
		return CauseCredentialExpired
	}
	return CauseAuthority
}

// classify maps a provider error to a cause.
func classify(err error) string {
	var ae *AuthorityError
	if errors.As(err, &ae) {
		switch ae.Code {
		case AuthoritySignIn:
			return CauseSignIn
		case AuthorityTransport, AuthorityTooLarge:
			return CauseTransport
		}
	}
	return CauseAuthority
}

// copyAnswer copies the parts of an answer a caller could mutate.
func copyAnswer(a *serviceaccess.Answer) *serviceaccess.Answer {
	c := *a
	if a.Access != nil {
		t := *a.Access
		c.Access = &t
	}
	if a.Renewal != nil {
		t := *a.Renewal
		c.Renewal = &t
	}
	if a.Snapshot != nil {
		c.Snapshot = append([]byte(nil), a.Snapshot...)
	}
	if a.Instance != nil {
		i := *a.Instance
		c.Instance = &i
	}
	if a.Operation != nil {
		o := *a.Operation
		c.Operation = &o
	}
	return &c
}

// LogValue keeps the renewal proof out of logs.
func (r RenewalRecord) LogValue() slog.Value {
	return slog.GroupValue(slog.String("witness", r.Witness), slog.String("endpoint", r.Endpoint),
		slog.String("instance", r.Instance), slog.String("renewal", "REDACTED"))
}
