package authclient

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

const (
	// maxInfoBytes bounds a GET /service-endpoint-authority answer (an Info with its keys).
	maxInfoBytes = 64 << 10
	// maxAnswerBytes bounds a POST answer: a registered answer carries the snapshot, which holds
	// the contract's artifacts, themselves bounded by the 2 MiB envelope they came in.
	maxAnswerBytes = 2 * serviceaccess.MaxEnvelopeBytes
	// authorityTimeout bounds one authority call when the context has no earlier deadline.
	authorityTimeout = 10 * time.Second
)

// Codes of an AuthorityError.
const (
	// AuthorityRequest: the request was refused before anything was sent (nil, another account
	// or space than the pinned one, an invalid proof, an envelope over 2 MiB).
	AuthorityRequest = "request"
	// AuthoritySignIn: a nil proof needs the signed-in login, and there is none or it failed.
	AuthoritySignIn = "sign-in"
	// AuthorityTransport: the request or its answer did not cross (network, timeout, read).
	AuthorityTransport = "transport"
	// AuthorityRedirect: the authority answered a redirect, which is never followed.
	AuthorityRedirect = "redirect"
	// AuthorityTooLarge: the answer exceeded its bound.
	AuthorityTooLarge = "too-large"
	// AuthorityMalformed: the answer did not parse as an answer (or an Info).
	AuthorityMalformed = "malformed"
	// AuthorityStatus: the HTTP status is not the one the answer travels with.
	AuthorityStatus = "status"
	// AuthorityUnbound: the answer is not bound to the request: another requestId, an answer
	// kind the request's kind cannot get, another witness, account or space.
	AuthorityUnbound = "unbound"
)

var authorityText = map[string]string{
	AuthorityRequest:   "the request was refused before sending",
	AuthoritySignIn:    "no signed-in login could be had",
	AuthorityTransport: "the authority could not be reached",
	AuthorityRedirect:  "the authority answered a redirect, which is not followed",
	AuthorityTooLarge:  "the authority's answer is too large",
	AuthorityMalformed: "the authority's answer does not parse",
	AuthorityStatus:    "the authority's HTTP status does not match its answer",
	AuthorityUnbound:   "the authority's answer is not bound to the request",
}

// AuthorityError is a call to the service endpoint authority that yielded no bound answer. Its
// text is a fixed sentence per Code (never a token or the authority's text); the cause, when
// there is one, is reachable with errors.Is/As only.
type AuthorityError struct {
	Code string
	// Status is the HTTP status, when an answer arrived.
	Status int
	Err    error
}

func (e *AuthorityError) Error() string {
	s := "authclient: service endpoint authority: " + authorityText[e.Code]
	if e.Status != 0 {
		s += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	return s
}

func (e *AuthorityError) Unwrap() error { return e.Err }

func authorityErr(code string, status int, err error) error {
	return &AuthorityError{Code: code, Status: status, Err: err}
}

// ProviderConfig is what NewProvider needs.
type ProviderConfig struct {
	// URL is the registered space's authority URL with its tenant path, e.g.
	// https://auth.example.com/tenant-a: calls go to <URL>/service-endpoint-authority, whatever
	// proxy strips the tenant on the way. https, or plain http only to a loopback address.
	URL string
	// Account and Space are the space's data account and name the authority must answer for.
	// Required.
	Account, Space string
	// Login returns the signed-in login's IdP token, for the idp proof a nil proof stands for;
	// called for every such request, so it can refresh the token. nil: no sign-in.
	Login func(ctx context.Context) (string, error)
	// Cap is the loopback face's capability, sent only with an operator proof. Optional.
	Cap string
	// Sentinel is the space's sentinel JWT (a bearer user JWT), which a renewal source's
	// SentinelCreds presents. Optional; checked with CheckSentinel when set.
	Sentinel string
	// HTTPClient makes the calls; nil means a fresh client. Redirects are never followed
	// whichever client is given.
	HTTPClient *http.Client
	// Timeout bounds one call when the context has no earlier deadline; zero means 10 s.
	Timeout time.Duration
	// Now is the caller's clock, which judges a credential's expiry; nil means time.Now.
	Now func() time.Time
}

// Provider is the client of one space's /service-endpoint-authority: Info, requests under a
// service proof or the signed-in login, and the renewal source a serving connection pulls its
// bearers from. It is safe for concurrent use.
//
// It refuses a URL that is not https (or http to a loopback address) or that carries user info,
// a query or a fragment; it never follows a redirect; it bounds every answer; and it returns an
// answer only when it parses closed, travels with its own HTTP status and is bound to the
// request it answers.
type Provider struct {
	url      string
	account  string
	space    string
	login    func(ctx context.Context) (string, error)
	cap      string
	sentinel string
	http     *http.Client
	timeout  time.Duration
	now      func() time.Time
}

// NewProvider validates cfg. It makes no request.
func NewProvider(cfg ProviderConfig) (*Provider, error) {
	u, err := authorityURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if !nkeys.IsValidPublicAccountKey(cfg.Account) {
		return nil, errors.New("authclient: provider: Account is not an account public key")
	}
	if err := space.ValidateName(cfg.Space); err != nil {
		return nil, fmt.Errorf("authclient: provider: %w", err)
	}
	if cfg.Sentinel != "" {
		if err := CheckSentinel(cfg.Sentinel); err != nil {
			return nil, err
		}
	}
	if cfg.Timeout < 0 {
		return nil, errors.New("authclient: provider: Timeout is negative")
	}
	p := &Provider{
		url: u, account: cfg.Account, space: cfg.Space, login: cfg.Login, cap: cfg.Cap,
		sentinel: cfg.Sentinel, timeout: cfg.Timeout, now: cfg.Now,
	}
	if p.timeout == 0 {
		p.timeout = authorityTimeout
	}
	if p.now == nil {
		p.now = time.Now
	}
	hc := &http.Client{}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient
		hc = &c
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	p.http = hc
	return p, nil
}

// authorityURL checks the pinned authority URL (tenant path kept) and returns its route.
func authorityURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("authclient: authority URL: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "", u.Opaque != "":
		return "", fmt.Errorf("authclient: authority URL %.200q is not an http(s) URL with a host", raw)
	case u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("authclient: authority URL %.200q carries user info, a query or a fragment", raw)
	case u.Scheme == "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return "", fmt.Errorf("authclient: authority URL %.200q: plain http only to a loopback address", raw)
		}
	}
	return strings.TrimSuffix(u.String(), "/") + serviceaccess.Path, nil
}

// URL is the route this provider calls: the pinned URL, tenant path included, and
// /service-endpoint-authority.
func (p *Provider) URL() string { return p.url }

// ServiceEndpointInfo GETs the authority's Info: its account and space (which must be the
// pinned ones), the iss its service access bearers carry and its published keys.
func (p *Provider) ServiceEndpointInfo(ctx context.Context) (*serviceaccess.Info, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return nil, authorityErr(AuthorityRequest, 0, err)
	}
	req.Header.Set("Accept", "application/json")
	status, raw, err := p.do(req, maxInfoBytes)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, authorityErr(AuthorityStatus, status, nil)
	}
	info, err := serviceaccess.ParseInfo(raw)
	if err != nil {
		return nil, authorityErr(AuthorityMalformed, status, err)
	}
	if info.Account != p.account || info.Space != p.space || info.Issuer != serviceaccess.Issuer(p.space) {
		return nil, authorityErr(AuthorityUnbound, status, nil)
	}
	return info, nil
}

// ServiceEndpointAuthority POSTs {request, proof} and returns the authority's answer, whatever
// its kind (a denied, conflict or unavailable answer is an answer, not an error). A nil proof
// is the signed-in login: an idp proof with Login's token. The request's account and space must
// be the pinned ones. The answer must parse closed, travel with its own HTTP status, and be
// bound to the request: its requestId is the request's (a denied or unavailable answer the
// authority gave before reading the request may carry none), its kind is one the request's kind
// can get, and a credential, ready or registered answer names the request's witness. Anything
// else is an *AuthorityError.
func (p *Provider) ServiceEndpointAuthority(ctx context.Context, req *serviceaccess.Request, proof *serviceaccess.Proof) (*serviceaccess.Answer, error) {
	if req == nil {
		return nil, authorityErr(AuthorityRequest, 0, errors.New("nil request"))
	}
	if req.Account != p.account || req.Space != p.space {
		return nil, authorityErr(AuthorityRequest, 0, errors.New("the request's account or space is not the pinned one"))
	}
	ctx, cancel := p.bound(ctx)
	defer cancel()
	var pr serviceaccess.Proof
	if proof == nil {
		if p.login == nil {
			return nil, authorityErr(AuthoritySignIn, 0, nil)
		}
		tok, err := p.login(ctx)
		if err != nil || tok == "" {
			return nil, authorityErr(AuthoritySignIn, 0, err)
		}
		pr = serviceaccess.Proof{Kind: serviceaccess.ProofIDP, Token: tok}
	} else {
		pr = *proof
	}
	switch pr.Kind {
	case serviceaccess.ProofIDP, serviceaccess.ProofRenewal, serviceaccess.ProofAccess:
		if pr.Token == "" {
			return nil, authorityErr(AuthorityRequest, 0, errors.New("the proof carries no token"))
		}
	case serviceaccess.ProofOperator:
		if pr.Token != "" {
			return nil, authorityErr(AuthorityRequest, 0, errors.New("an operator proof carries no token"))
		}
	default:
		return nil, authorityErr(AuthorityRequest, 0, errors.New("unknown proof kind"))
	}
	body, err := json.Marshal(serviceaccess.Envelope{Request: *req, Proof: pr})
	if err != nil {
		return nil, authorityErr(AuthorityRequest, 0, err)
	}
	if len(body) > serviceaccess.MaxEnvelopeBytes {
		return nil, authorityErr(AuthorityRequest, 0, errors.New("the envelope exceeds 2 MiB"))
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return nil, authorityErr(AuthorityRequest, 0, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	if pr.Kind == serviceaccess.ProofOperator && p.cap != "" {
		hreq.Header.Set("Authorization", "Bearer "+p.cap)
	}
	status, raw, err := p.do(hreq, maxAnswerBytes)
	if err != nil {
		return nil, err
	}
	ans, err := serviceaccess.ParseAnswer(raw)
	if err != nil {
		return nil, authorityErr(AuthorityMalformed, status, err)
	}
	if ans.HTTPStatus() != status {
		return nil, authorityErr(AuthorityStatus, status, nil)
	}
	if err := boundTo(req, ans); err != nil {
		return nil, authorityErr(AuthorityUnbound, status, err)
	}
	return ans, nil
}

// bound gives ctx the provider's timeout unless it already ends sooner.
func (p *Provider) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= p.timeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.timeout)
}

// do sends req and reads at most limit bytes of its answer. A redirect is an error.
func (p *Provider) do(req *http.Request, limit int) (int, []byte, error) {
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, nil, authorityErr(AuthorityTransport, 0, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return 0, nil, authorityErr(AuthorityRedirect, resp.StatusCode, nil)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		return 0, nil, authorityErr(AuthorityTransport, resp.StatusCode, err)
	}
	if len(raw) > limit {
		return 0, nil, authorityErr(AuthorityTooLarge, resp.StatusCode, nil)
	}
	return resp.StatusCode, raw, nil
}

// answerKinds are the answer kinds each request kind can get.
var answerKinds = map[serviceaccess.Kind][]serviceaccess.AnswerKind{
	serviceaccess.KindRegister: {serviceaccess.AnswerApprovalRequired, serviceaccess.AnswerRegistered},
	serviceaccess.KindActivate: {serviceaccess.AnswerCredential},
	serviceaccess.KindRenew:    {serviceaccess.AnswerCredential},
	serviceaccess.KindReady:    {serviceaccess.AnswerReady},
	serviceaccess.KindStatus:   {serviceaccess.AnswerStatus},
	serviceaccess.KindNameBind: {serviceaccess.AnswerBound},
	serviceaccess.KindDecide:   {serviceaccess.AnswerDecided},
}

// boundTo checks that ans answers req. Its errors name what differs, never a value.
func boundTo(req *serviceaccess.Request, ans *serviceaccess.Answer) error {
	ok := false
	switch ans.Kind {
	case serviceaccess.AnswerDenied, serviceaccess.AnswerUnavailable:
		ok = true
	case serviceaccess.AnswerConflict:
		// The ledger binds requestIds: a request without one cannot conflict.
		ok = req.RequestID != ""
	default:
		for _, k := range answerKinds[req.Kind] {
			ok = ok || k == ans.Kind
		}
	}
	if !ok {
		return errors.New("the answer's kind is not one the request's kind can get")
	}
	switch {
	case req.RequestID == "" && ans.RequestID != "":
		return errors.New("the answer carries a requestId the request has not")
	case req.RequestID != "" && ans.RequestID != req.RequestID:
		// Only a refusal the authority gave before reading the request may lack the echo.
		if ans.RequestID != "" || (ans.Kind != serviceaccess.AnswerDenied && ans.Kind != serviceaccess.AnswerUnavailable) {
			return errors.New("the answer's requestId is not the request's")
		}
	}
	switch ans.Kind {
	case serviceaccess.AnswerCredential, serviceaccess.AnswerReady:
		if ans.Witness != req.Witness {
			return errors.New("the answer names another witness")
		}
	case serviceaccess.AnswerBound:
		if ans.Endpoint != req.Endpoint || ans.Owner != req.Owner {
			return errors.New("the answer binds another endpoint or owner")
		}
	case serviceaccess.AnswerDecided:
		if ans.Proposal != req.Proposal || ans.Decision != req.Decision {
			return errors.New("the answer decides another proposal or decision")
		}
	case serviceaccess.AnswerStatus:
		if req.Target == nil {
			return errors.New("a status request without a target")
		}
		switch req.Target.Kind {
		case serviceaccess.TargetInstance:
			if ans.Instance == nil || ans.Operation != nil {
				return errors.New("the status answer is not an instance's")
			}
		case serviceaccess.TargetOperation:
			if ans.Operation == nil || ans.Instance != nil ||
				ans.Operation.Operation != req.Target.Operation || ans.Operation.RequestID != req.Target.RequestID {
				return errors.New("the status answer is not the targeted operation's")
			}
		}
	}
	return nil
}

// infoKeys is a KeySource over the authority's published keys: the pinned Info's, fetched on
// first use and again when a kid is unknown.
type infoKeys struct {
	p    *Provider
	mu   sync.Mutex
	keys serviceaccess.StaticKeys
}

func (k *infoKeys) Key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if pub, ok := k.keys[kid]; ok {
		return pub, nil
	}
	if err := k.refreshLocked(ctx); err != nil {
		return nil, err
	}
	if pub, ok := k.keys[kid]; ok {
		return pub, nil
	}
	return nil, errors.New("authclient: the authority publishes no key of that kid")
}

// ensure fetches the keys once, so a pull can tell a transport failure from a bad credential.
func (k *infoKeys) ensure(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.keys != nil {
		return nil
	}
	return k.refreshLocked(ctx)
}

// refreshLocked reads the Info's keys. mu must be held.
func (k *infoKeys) refreshLocked(ctx context.Context) error {
	info, err := k.p.ServiceEndpointInfo(ctx)
	if err != nil {
		return err
	}
	m, err := serviceaccess.KeysOf(info)
	if err != nil {
		return authorityErr(AuthorityMalformed, 0, err)
	}
	k.keys = m
	return nil
}
