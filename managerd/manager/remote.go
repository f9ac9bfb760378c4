package manager

import (
	"bytes"
	"context"
	"crypto/rand"
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

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/managerauthority"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// A remote managerd (issue 25 item 6; seed 001 "Managed-agent authority transport", reference
// lifecycle-hosted.md §2.7), Config.Authority "remote", has no signerd certificate and holds no
// signing seed: authd's manager-service authority (POST /manager-service-authority, wire in
// pkg/managerauthority) issues its supervisor credential. Its start is:
//
//  1. the remote identity (identity.go): the instance id, the manager's lifecycle uid and the
//     five user nkeys of its actors, kept in Config.StateDir and reused across restarts;
//  2. prepare: the authority mints a remote-manager credential (principal
//     <owner>.manager_<instance id>) for the supervisor nkey and answers the activation proof,
//     which the manager recomputes and must match; the supervisor rail (pkg/signerclient, with a
//     Source) proves the credential on the broker and adopts it;
//  3. the instance lease, its holder the gate principal <owner>.manager_serve_<instance id>;
//  4. activate: the authority registers this start and answers its processEpoch,
//     registrationRevision and the current registration proof (never the activation proof),
//     which the manager writes into its lease row (and the identity file) before it serves;
//  5. ManagerService. The rail renews the credential at 75 % of its life by the authority's
//     renew (RemoteAuthority.RenewExecutor) under the current registration.
//
// Every answer is bound to its request before use: the echoed space, actor, instance, uid,
// request id and identities, the owner equal to Config.Owner, the fixed actors of the instance,
// and per operation the credential and proofs it must carry. Every RemoteAuthority call goes
// through the rejection guard (rejection.go): a panicking or unreadable hook is a *Rejection,
// logged as a HOOK warning, and fails that call.
//
// Spawn (spawnRemote in enroll.go) enrolls the agent at the authority (ManagedAgentEnroller) and
// launches it with the exchange form of its launch material; an authority without the hook makes
// Spawn FAILED_PRECONDITION: a remote managerd never authors an agent grant the host knows
// nothing about.

// RemoteAuthority is the manager-service authority a remote managerd asks, the seed's
// remoteAuthority hooks this project serves. Each takes a complete manager-service-authority
// request the manager built and returns the authority's answer, which the manager binds to the
// request before use. A refusal is an error (the stock client's is a
// *managerauthority.Refusal carrying the door's status and code).
type RemoteAuthority interface {
	// PrepareManager is the prepare phase: a remote-manager credential for
	// identities.supervisor and the activation proof.
	PrepareManager(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error)
	// ActivateManager is the activate phase: the registration of this start.
	ActivateManager(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error)
	// RenewExecutor is the seed's renewExecutor: a fresh supervisor credential under the current
	// registration (this project issues no executor credential).
	RenewExecutor(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error)
	// MintRetirementRequester is the seed's mintRetirementRequester: a retirement-requester
	// credential for req.Retirement.ID and one managed target.
	MintRetirementRequester(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error)
}

// ManagedAgentEnroller is the seed's remoteAuthority.enrollManagedAgent, an optional hook of a
// RemoteAuthority (the stock HTTPAuthority has it): the authority writes a managed grant for
// the requested agent at a lifecycle uid it chooses, provisions that uid's durables, and answers
// the coordinate, the sentinel, the effective lists and the public exchange URL. A remote
// managerd whose authority lacks it refuses Spawn (REASON_ENROLLMENT_UNAVAILABLE).
type ManagedAgentEnroller interface {
	EnrollManagedAgent(ctx context.Context, req *managerauthority.EnrollmentRequest) (*managerauthority.Enrollment, error)
}

// Remote authority client bounds.
const (
	// RemoteCallTimeout bounds one call of the stock client, its answer read included.
	RemoteCallTimeout = 20 * time.Second
	// CodeAuthority is the start refusal of a remote managerd whose authority refused or could
	// not be reached (prepare, activate), or answered something that does not bind.
	CodeAuthority = "AUTHORITY"
)

// MsgEnrollmentUnavailable is Spawn's refusal on a remote managerd whose RemoteAuthority has no
// ManagedAgentEnroller hook.
const MsgEnrollmentUnavailable = "managed-agent enrollment is not available from this authority: a remote managerd spawns only agents the authority enrolls, and this authority has no enrollment hook"

// CheckAuthorityURL checks a remote authority base URL: https, or http to a loopback host
// (127.0.0.0/8, ::1, localhost); no user info, query or fragment.
func CheckAuthorityURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	switch {
	case u.Host == "" || u.Opaque != "":
		return fmt.Errorf("%q: want an absolute https URL", raw)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return fmt.Errorf("%q: want no user info, query or fragment", raw)
	case u.Scheme == "https":
		return nil
	case u.Scheme != "http":
		return fmt.Errorf("%q: want https (or http to a loopback host)", raw)
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("%q: http is only for a loopback host; use https", raw)
}

// HTTPAuthority is the stock RemoteAuthority: an HTTP client of authd's
// POST /manager-service-authority. It reads the IdP token from its file at every call, sends
// the closed {idpToken, request} as application/json, follows no redirect, reads at most
// managerauthority.MaxAnswerBytes of an answer and decodes it closed (DecodeMaterial, or
// DecodeRefusal into a *managerauthority.Refusal). It never logs the token or a JWT.
type HTTPAuthority struct {
	endpoint  string
	tokenFile string
	hc        *http.Client
}

var _ RemoteAuthority = (*HTTPAuthority)(nil)

// NewHTTPAuthority returns the stock client of base (CheckAuthorityURL) reading the IdP token
// from tokenFile (a secret file: this uid's, 0600, in a 0700 directory).
func NewHTTPAuthority(base, tokenFile string) (*HTTPAuthority, error) {
	if err := CheckAuthorityURL(base); err != nil {
		return nil, err
	}
	if tokenFile == "" {
		return nil, errors.New("no IdP token file")
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the authority is reached directly, as configured
	return &HTTPAuthority{
		endpoint: strings.TrimSuffix(base, "/") + managerauthority.Path, tokenFile: tokenFile,
		hc: &http.Client{Transport: tr, Timeout: RemoteCallTimeout, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
	}, nil
}

// PrepareManager posts a prepare request.
func (h *HTTPAuthority) PrepareManager(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error) {
	return h.call(ctx, req)
}

// ActivateManager posts an activate request.
func (h *HTTPAuthority) ActivateManager(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error) {
	return h.call(ctx, req)
}

// RenewExecutor posts a renew request.
func (h *HTTPAuthority) RenewExecutor(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error) {
	return h.call(ctx, req)
}

// MintRetirementRequester posts a retire request.
func (h *HTTPAuthority) MintRetirementRequester(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error) {
	return h.call(ctx, req)
}

var _ ManagedAgentEnroller = (*HTTPAuthority)(nil)

// EnrollManagedAgent posts a manager-managed-agent-enrollment request and decodes its answer
// closed (managerauthority.DecodeEnrollmentAnswer).
func (h *HTTPAuthority) EnrollManagedAgent(ctx context.Context, req *managerauthority.EnrollmentRequest) (*managerauthority.Enrollment, error) {
	b, err := h.post(ctx, req)
	if err != nil {
		return nil, err
	}
	return managerauthority.DecodeEnrollmentAnswer(b)
}

func (h *HTTPAuthority) call(ctx context.Context, req *managerauthority.Request) (*managerauthority.Material, error) {
	b, err := h.post(ctx, req)
	if err != nil {
		return nil, err
	}
	return managerauthority.DecodeMaterial(b)
}

// post sends req in the envelope and returns a 200's body; any other answer is an error (a
// refusal a *managerauthority.Refusal).
func (h *HTTPAuthority) post(ctx context.Context, req any) ([]byte, error) {
	raw, err := creds.ReadSecretFile(h.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("read the IdP token: %w", err)
	}
	token := string(bytes.TrimSpace(raw))
	clear(raw)
	if token == "" {
		return nil, fmt.Errorf("the IdP token file %s is empty", h.tokenFile)
	}
	rb, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(managerauthority.Envelope{IdPToken: token, Request: rb})
	if err != nil {
		return nil, err
	}
	if len(body) > managerauthority.MaxBodyBytes {
		return nil, fmt.Errorf("the request is %d bytes (at most %d)", len(body), managerauthority.MaxBodyBytes)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, h.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "application/json")
	resp, err := h.hc.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("the manager-service authority at %s: %w", h.endpoint, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, managerauthority.MaxAnswerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read the authority's answer: %w", err)
	}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return nil, fmt.Errorf("the manager-service authority answered a redirect (%d); redirects are not followed", resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		rf, err := managerauthority.DecodeRefusal(resp.StatusCode, b)
		if err != nil {
			return nil, fmt.Errorf("the manager-service authority answered %d with an unreadable refusal: %w", resp.StatusCode, err)
		}
		return nil, rf
	}
	return b, nil
}

// remoteState is a remote managerd's authority state: its identity and the current
// registration (epoch and proof) the renewals present.
type remoteState struct {
	auth RemoteAuthority
	id   *remoteIdentity

	mu         sync.Mutex
	activation string // prepare's activation proof
	activated  bool
	epoch      uint64
	revision   uint64
	proof      string // the current registration proof
}

// remoteSource is the supervisor rail's credential source on a remote managerd.
type remoteSource struct{ m *Manager }

// request is a manager-service-authority request of op for the manager's identity.
func (m *Manager) remoteRequest(op managerauthority.Operation) (*managerauthority.Request, error) {
	rs := m.remote
	return &managerauthority.Request{V: 1, Kind: managerauthority.KindAuthority, Operation: op, Space: m.cfg.Space,
		Actor: m.cfg.Actor, InstanceID: rs.id.InstanceID, ManagerLifecycleUID: rs.id.LifecycleUID,
		RequestID: string(op) + "-" + strings.ToLower(rand.Text()), Identities: rs.id.Identities()}, nil
}

// callRemote calls hook through the rejection guard and binds its answer to req.
func (m *Manager) callRemote(ctx context.Context, name string, req *managerauthority.Request,
	hook func(context.Context, *managerauthority.Request) (*managerauthority.Material, error)) (*managerauthority.Material, error) {
	var mat *managerauthority.Material
	err := daemon.Guard("the remote authority's "+name, func() error {
		var e error
		mat, e = hook(ctx, req)
		return e
	})
	if err = m.hookFailed(err); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if mat == nil {
		return nil, fmt.Errorf("%s: the remote authority answered nothing", name)
	}
	if err := m.bindMaterial(req, mat); err != nil {
		return nil, fmt.Errorf("%s: the remote authority's answer does not bind: %w", name, err)
	}
	return mat, nil
}

// bindMaterial checks that mat answers req: every echoed coordinate, the owner this manager is
// configured for, the instance's actors, and the operation's credential and proofs.
func (m *Manager) bindMaterial(req *managerauthority.Request, mat *managerauthority.Material) error {
	actors, err := managerauthority.ActorsOf(req.InstanceID)
	if err != nil {
		return err
	}
	switch {
	case mat.V != 1 || mat.Kind != managerauthority.KindAuthority || mat.Operation != req.Operation:
		return fmt.Errorf("it answers %s %s, not %s", mat.Kind, mat.Operation, req.Operation)
	case mat.Space != req.Space || mat.Actor != req.Actor || mat.InstanceID != req.InstanceID ||
		mat.LifecycleUID != req.ManagerLifecycleUID || mat.RequestID != req.RequestID:
		return errors.New("it echoes another space, actor, instance, lifecycle uid or request id")
	case mat.Identities != req.Identities:
		return errors.New("it echoes other identities")
	case mat.Actors != actors:
		return errors.New("it names other actors than the instance's")
	case mat.Owner != m.cfg.Owner:
		return fmt.Errorf("the authority derived owner %s from the IdP token, but this manager is configured for owner %s", mat.Owner, m.cfg.Owner)
	}
	sup, ret := mat.Credentials.Supervisor, mat.Credentials.RetirementRequester
	switch req.Operation {
	case managerauthority.OpPrepare:
		want, err := managerauthority.ActivationProof(req.Space, m.cfg.Owner, req)
		if err != nil {
			return err
		}
		if sup == nil || ret != nil {
			return errors.New("prepare must answer a supervisor credential only")
		}
		if !lifecycle.ProofEqual(mat.NextRegistrationProof, want) {
			return errors.New("prepare answered another activation proof than this manager computes")
		}
	case managerauthority.OpActivate:
		switch {
		case sup != nil || ret != nil:
			return errors.New("activate answers no credential")
		case mat.ProcessEpoch == nil || mat.RegistrationRevision == nil || *mat.RegistrationRevision == 0:
			return errors.New("activate must answer a processEpoch and a registrationRevision")
		case *mat.ProcessEpoch > lifecycle.MaxSafeInteger || *mat.RegistrationRevision > lifecycle.MaxSafeInteger:
			return errors.New("activate answered an epoch or revision above 2^53-1")
		case !lifecycle.IsProof(mat.NextRegistrationProof) || mat.NextRegistrationProof == req.RegistrationProof:
			return errors.New("activate must answer a current registration proof other than the activation proof")
		case mat.AccountPublicKey == "":
			return errors.New("activate must answer the account public key")
		}
	case managerauthority.OpRenew:
		if sup == nil || ret != nil || mat.ProcessEpoch == nil || *mat.ProcessEpoch != *req.ProcessEpoch || mat.RegistrationProof != req.RegistrationProof {
			return errors.New("renew must answer a supervisor credential at the epoch and proof it was asked")
		}
	case managerauthority.OpRetire:
		if ret == nil || sup != nil || mat.Retirement == nil || *mat.Retirement != *req.Retirement {
			return errors.New("retire must answer a retirement-requester credential for the retirement it was asked")
		}
	}
	return nil
}

// Mint is prepare: the first supervisor credential, and the activation proof kept for activate.
func (s remoteSource) Mint(ctx context.Context, pub string) (string, error) {
	m := s.m
	if pub != m.remote.id.Identities().Supervisor.ID {
		return "", errors.New("the rail's key is not the supervisor identity")
	}
	req, err := m.remoteRequest(managerauthority.OpPrepare)
	if err != nil {
		return "", err
	}
	mat, err := m.callRemote(ctx, "PrepareManager", req, m.remote.auth.PrepareManager)
	if err != nil {
		return "", err
	}
	m.remote.mu.Lock()
	m.remote.activation = mat.NextRegistrationProof
	m.remote.mu.Unlock()
	return mat.Credentials.Supervisor.JWT, nil
}

// Renew is renew under the current registration.
func (s remoteSource) Renew(ctx context.Context, _, _ string) (string, error) {
	m := s.m
	m.remote.mu.Lock()
	activated, epoch, proof := m.remote.activated, m.remote.epoch, m.remote.proof
	m.remote.mu.Unlock()
	if !activated {
		return "", errors.New("this start is not activated yet: no registration to renew under")
	}
	req, err := m.remoteRequest(managerauthority.OpRenew)
	if err != nil {
		return "", err
	}
	req.ProcessEpoch, req.RegistrationProof = &epoch, proof
	mat, err := m.callRemote(ctx, "RenewExecutor", req, m.remote.auth.RenewExecutor)
	if err != nil {
		return "", err
	}
	return mat.Credentials.Supervisor.JWT, nil
}

// activateRemote is activate once the lease is held: the registration of this start, recorded
// in the lease row and the identity file.
func (m *Manager) activateRemote(ctx context.Context) error {
	m.remote.mu.Lock()
	activation := m.remote.activation
	m.remote.mu.Unlock()
	req, err := m.remoteRequest(managerauthority.OpActivate)
	if err != nil {
		return err
	}
	req.RegistrationProof = activation
	mat, err := m.callRemote(ctx, "ActivateManager", req, m.remote.auth.ActivateManager)
	if err != nil {
		return err
	}
	m.remote.mu.Lock()
	m.remote.activated, m.remote.epoch, m.remote.revision, m.remote.proof = true, *mat.ProcessEpoch, *mat.RegistrationRevision, mat.NextRegistrationProof
	m.remote.mu.Unlock()
	m.log.Info("the remote authority activated this start", "instance", mat.InstanceID, "owner", mat.Owner,
		"processEpoch", *mat.ProcessEpoch, "registrationRevision", *mat.RegistrationRevision)
	return m.recordRegistration(ctx, lifecycle.RegisterManagerResult{InstanceID: mat.InstanceID,
		ProcessEpoch: *mat.ProcessEpoch, RegistrationRevision: *mat.RegistrationRevision})
}

// startRemoteRail loads the remote identity, then starts the supervisor rail on it with the
// remote authority as its source (prepare).
func (m *Manager) startRemoteRail(ctx context.Context, fail func(code, reason string, err error) error) error {
	cfg := m.cfg
	auth := m.remoteAuth
	if auth == nil {
		h, err := NewHTTPAuthority(cfg.AuthorityURL, cfg.IdPTokenFile)
		if err != nil {
			return fail(CodeConfig, "remote authority client refused", err)
		}
		auth = h
	}
	id, err := loadRemoteIdentity(cfg.StateDir, cfg.Space, cfg.InstanceID)
	if err != nil {
		return fail(CodeConfig, "remote identity refused", err)
	}
	cfg.InstanceID = id.InstanceID
	m.remote = &remoteState{auth: auth, id: id}
	seed := id.supervisorSeed()
	id.wipe()
	m.rail, err = signerclient.NewRail(signerclient.RailConfig{
		Source: remoteSource{m: m}, Space: cfg.Space, NatsURLs: cfg.Brokers, Logger: m.log,
		OnRenewFailed: m.onRailRenewFailed, UserSeed: seed,
	})
	seed.Wipe()
	if err != nil {
		return fail(CodeConfig, "supervisor rail refused", err)
	}
	if err := m.rail.Start(ctx); err != nil {
		var pe *signerclient.ProofError
		if errors.As(err, &pe) {
			return fail(CodeBroker, "the broker refused the supervisor credential", err)
		}
		return fail(CodeAuthority, "no supervisor credential from the remote authority (prepare)", err)
	}
	m.log.Info("remote managerd prepared", "instance", id.InstanceID, "lifecycle", id.LifecycleUID, "authority", cfg.AuthorityURL)
	return nil
}
