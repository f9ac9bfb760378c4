package exchange

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"golang.org/x/time/rate"

	"github.com/cotalgo/cotal/authd/internal/idp"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// Public face paths and defaults.
const (
	// WellKnownPath is the discovery bundle's route on the public face.
	WellKnownPath = "/.well-known/cotal-mesh"
	// ManagerAuthorityPath is the manager-service authority route the bundle advertises
	// (managerAuthorityUrl), served on both faces by authd/internal/msadoor
	// (pkg/managerauthority.Path).
	ManagerAuthorityPath = "/manager-service-authority"
	// Provider is userAuth.provider in the bundle.
	Provider = "cotal"

	// DefaultPeerRate and DefaultPeerBurst are a peer's token bucket: requests a second, and
	// the most it may send at once. Behind a proxy whose X-Forwarded-For is not trusted every
	// client is one peer, so the bucket is then the face's whole request rate.
	DefaultPeerRate  = 20
	DefaultPeerBurst = 60
	// DefaultMaxPeers bounds the peer table (upstream PUBLIC_PEER_BUCKETS_MAX).
	DefaultMaxPeers = 1024
	// DefaultMaxInFlight bounds the requests served at once (upstream PUBLIC_MAX_IN_FLIGHT).
	DefaultMaxInFlight = 64
	// DefaultDeadline bounds one request (upstream PUBLIC_DEADLINE_MS).
	DefaultDeadline = 10 * time.Second
)

// PublicView reports whether the public face issues a bearer with this view: only with none
// (""), as upstream, whose public exchange refuses every view (refuseViews). Every named view,
// known or not, is a loopback operator surface.
func PublicView(view string) bool { return view == "" }

// PublicConfig is the public face. Exchange, URL and Server are required.
type PublicConfig struct {
	// Exchange is the exchange both faces share (space, signer, ledger, IdP, selector,
	// activator, clock, logger). Its Cap and Lifecycle must be empty: this face takes no cap and
	// has no loopback door.
	Exchange Config
	// URL is the https URL the proxy publishes this face at (CheckPublicURL), tenant path
	// allowed: the bundle's endpoints.url.
	URL string
	// Server is the broker URL the bundle advertises (CheckAdvertisedServer): what participants
	// dial, which need not be what authd dials.
	Server string
	// Pin reads the IdP pin for the bundle at each request (idp.Load on the state dir, so a pin
	// made after start shows); nil or idp.ErrNotPinned answers the bundle 503.
	Pin func() (idp.Pin, error)
	// ServiceEndpoints, if set, serves serviceaccess.Path behind this face's limits (its own
	// guards, Origin included); nil answers it 404.
	ServiceEndpoints http.Handler
	// ManagerAuthority, if set, serves ManagerAuthorityPath behind this face's limits (its own
	// guards, Origin included; the public door takes no cap); nil answers it 404.
	ManagerAuthority http.Handler
	// TrustForwardedFor makes the peer the last X-Forwarded-For hop (see the Public doc).
	TrustForwardedFor bool
	// PeerRate and PeerBurst are a peer's token bucket; zero means DefaultPeerRate and
	// DefaultPeerBurst.
	PeerRate  float64
	PeerBurst int
	// MaxPeers, MaxInFlight and Deadline; zero means the defaults above.
	MaxPeers    int
	MaxInFlight int
	Deadline    time.Duration
}

// publicFace is the public face's part of a Handler.
type publicFace struct {
	url, server string
	pin         func() (idp.Pin, error)
	svc         http.Handler
	msa         http.Handler
	trustXFF    bool
	maxPeers    int
	// seed is the throwaway user seed the sentinel creds carry (the sentinel is a bearer JWT:
	// the broker checks no signature, but a creds file needs a seed).
	seed []byte

	sentMu   sync.Mutex
	sentinel string // the checked sentinel JWT, once signerd served it
}

// Public is the public face (auth.md §4 "Optional public listener"): the handler of a second
// listener, on a loopback address, that a TLS-terminating reverse proxy publishes at
// PublicConfig.URL. It serves GET /health, GET /jwks, POST /exchange without the cap,
// GET /.well-known/cotal-mesh (Bundle; 503 while no IdP is pinned or signerd does not serve the
// sentinel) and, when PublicConfig.ServiceEndpoints and PublicConfig.ManagerAuthority are set,
// serviceaccess.Path and ManagerAuthorityPath (routed before the face's Origin guard: those doors
// keep their own guard order); every other path is 404, the loopback lifecycle doors
// (ManagedActivatePath, ManagedRetirePath, and any door added to the loopback face later)
// included.
//
// /exchange takes no cap (the 0600 discovery file's cap means nothing to a remote caller: the IdP
// token or the actor token is the proof) and no view: every view is refused 403 before any
// credential is looked at (PublicView), so elevated operator surfaces stay loopback-only. The
// Origin (403), media type (415) and size (413) guards and the refusal throttle are the loopback
// face's, with a throttle table of its own, so refusals on one face never spend the other's budget.
//
// Construct it with NewPublic and serve it with NewPublicServer. Limits, applied in this order
// before any route runs:
//   - per peer, a token bucket (PeerRate a second, PeerBurst at most) in a table of MaxPeers
//     peers (least recently seen evicted): a request past its peer's bucket is 429 with
//     Retry-After;
//   - at most MaxInFlight requests being served at once across all peers: one more is 503
//     with Retry-After: 1 (busy, not the caller's fault: upstream answers 503 too). A request's
//     slot is held until its handler returns, past its deadline if it overruns;
//   - a deadline of Deadline per request: the request's context ends then, and a request still
//     unanswered gets 503 {"error": "request deadline exceeded"}. NewPublicServer's timeouts cut
//     a client that drips its headers or body.
//
// The peer is the remote address's host. The face binds loopback only (the proxy is its one
// direct peer), so by default every client of the proxy is one peer: X-Forwarded-For is NOT
// trusted, because any client can write it. PublicConfig.TrustForwardedFor (config
// public_trust_forwarded_for) makes the peer the LAST X-Forwarded-For hop, the address the
// operator's own proxy appended; set it only when that proxy is the only way to the listener and
// it appends the hop. The request's RemoteAddr is then that hop for every handler behind the
// face (the refusal throttle and the service-endpoint door count per it).
type Public struct {
	h        *Handler
	peers    *peerLimiter
	slots    chan struct{}
	deadline time.Duration
}

// NewPublic checks pc and returns the public face. It refuses what New refuses (but the cap), a
// cap or lifecycle door in pc.Exchange, a URL CheckPublicURL refuses, a server
// CheckAdvertisedServer refuses, and a negative limit.
func NewPublic(pc PublicConfig) (*Public, error) {
	cfg := pc.Exchange
	if cfg.Cap != "" || cfg.Lifecycle != nil {
		return nil, errors.New("exchange: the public face takes no cap and serves no loopback door")
	}
	if err := checkConfig(&cfg); err != nil {
		return nil, err
	}
	u, err := CheckPublicURL(pc.URL)
	if err != nil {
		return nil, err
	}
	if err := CheckAdvertisedServer(pc.Server); err != nil {
		return nil, err
	}
	if pc.PeerRate < 0 || pc.PeerBurst < 0 || pc.MaxPeers < 0 || pc.MaxInFlight < 0 || pc.Deadline < 0 {
		return nil, errors.New("exchange: public face limits must not be negative")
	}
	pc.PeerRate = orDefault(pc.PeerRate, DefaultPeerRate)
	pc.PeerBurst = orDefault(pc.PeerBurst, DefaultPeerBurst)
	pc.MaxPeers = orDefault(pc.MaxPeers, DefaultMaxPeers)
	pc.MaxInFlight = orDefault(pc.MaxInFlight, DefaultMaxInFlight)
	pc.Deadline = orDefault(pc.Deadline, DefaultDeadline)
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	face := &publicFace{url: u, server: pc.Server, pin: pc.Pin, svc: pc.ServiceEndpoints, msa: pc.ManagerAuthority, trustXFF: pc.TrustForwardedFor, maxPeers: pc.MaxPeers, seed: seed}
	h := newHandler(cfg, face)
	p := &Public{h: h, peers: newPeerLimiter(rate.Limit(pc.PeerRate), pc.PeerBurst, pc.MaxPeers, h.now),
		slots: make(chan struct{}, pc.MaxInFlight), deadline: pc.Deadline}
	return p, nil
}

func orDefault[T int | float64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// URL is the face's published URL, as CheckPublicURL normalized it.
func (p *Public) URL() string { return p.h.public.url }

// Deadline is the per-request deadline in force.
func (p *Public) Deadline() time.Duration { return p.deadline }

// ServeHTTP applies the limits in the order the Public doc gives, then routes.
func (p *Public) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	peer := p.h.public.peer(r)
	if p.h.public.trustXFF {
		r = r.WithContext(r.Context()) // a shallow copy: the server's request stays as it came
		r.RemoteAddr = net.JoinHostPort(peer, "0")
	}
	if wait, ok := p.peers.allow(peer); !ok {
		w.Header().Set("Retry-After", fmt.Sprint(max(1, int((wait+time.Second-1)/time.Second))))
		writeError(w, http.StatusTooManyRequests, "too many requests from this peer; retry later")
		return
	}
	select {
	case p.slots <- struct{}{}:
	default:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "busy; retry shortly")
		return
	}
	// The slot is freed when the handler returns, which under http.TimeoutHandler may be after
	// the deadline's 503 was sent: the work, not the answer, is what the slots bound.
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { <-p.slots }()
		p.h.ServeHTTP(w, r)
	})
	// TimeoutHandler's own 503 carries the headers set here and the body below.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.TimeoutHandler(inner, p.deadline, `{"error":"request deadline exceeded"}`+"\n").ServeHTTP(w, r)
}

// NewPublicServer wraps p in an http.Server whose read timeouts end with the deadline and whose
// write timeout leaves the deadline's 503 time to be written.
func NewPublicServer(p *Public) *http.Server {
	return &http.Server{
		Handler:           p,
		ReadHeaderTimeout: min(ReadHeaderTimeout, p.deadline),
		ReadTimeout:       p.deadline,
		WriteTimeout:      p.deadline + 2*time.Second,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// peer is the request's peer: the remote host, or with trustXFF the last X-Forwarded-For hop
// when it is an IP address.
func (f *publicFace) peer(r *http.Request) string {
	if f.trustXFF {
		if v := r.Header.Values("X-Forwarded-For"); len(v) > 0 {
			hops := strings.Split(v[len(v)-1], ",")
			if ip := net.ParseIP(strings.TrimSpace(hops[len(hops)-1])); ip != nil {
				return ip.String()
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// servePublic routes a request on the public face: the service-endpoint door before the Origin
// guard (its guard order is its own, as the loopback doors'), then the face's routes.
func (h *Handler) servePublic(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == serviceaccess.Path {
		if h.public.svc == nil {
			writeError(w, http.StatusNotFound, "no such route")
			return
		}
		h.public.svc.ServeHTTP(w, r)
		return
	}
	if r.URL.Path == ManagerAuthorityPath {
		if h.public.msa == nil {
			writeError(w, http.StatusNotFound, "no such route")
			return
		}
		h.public.msa.ServeHTTP(w, r)
		return
	}
	if _, ok := r.Header["Origin"]; ok {
		writeError(w, http.StatusForbidden, "requests with an Origin header are refused")
		return
	}
	switch r.URL.Path {
	case "/health":
		if method(w, r, http.MethodGet) {
			writeJSON(w, http.StatusOK, map[string]any{"ok": true})
		}
	case "/jwks":
		if method(w, r, http.MethodGet) {
			h.serveJWKS(w, r)
		}
	case "/exchange":
		if method(w, r, http.MethodPost) {
			h.serveExchange(w, r)
		}
	case WellKnownPath:
		if method(w, r, http.MethodGet) {
			h.serveWellKnown(w, r)
		}
	default:
		writeError(w, http.StatusNotFound, "no such route")
	}
}

// Bundle is the body of GET /.well-known/cotal-mesh (auth.md §4; upstream composeUserBundle).
type Bundle struct {
	Space         string   `json:"space"`
	Server        string   `json:"server"`
	TLSRequired   bool     `json:"tlsRequired"`
	UserAuth      UserAuth `json:"userAuth"`
	SentinelCreds string   `json:"sentinelCreds"`
}

// UserAuth is the bundle's trust pins.
type UserAuth struct {
	Provider  string    `json:"provider"`
	IdP       BundleIdP `json:"idp"`
	Endpoints Endpoints `json:"endpoints"`
}

// BundleIdP is the pinned IdP as idp.json holds it.
type BundleIdP struct {
	URL      string `json:"url"`
	Issuer   string `json:"issuer"`
	Audience string `json:"audience"`
}

// Endpoints are the face's URLs: URL is the public URL itself (the exchange base: /exchange,
// /jwks and the well-known bundle hang off it), ManagerAuthorityURL is URL +
// ManagerAuthorityPath. agentProvisioningUrl, optional upstream, is never set: this project has
// no agent provisioning endpoint.
type Endpoints struct {
	URL                 string `json:"url"`
	ManagerAuthorityURL string `json:"managerAuthorityUrl"`
}

func (h *Handler) serveWellKnown(w http.ResponseWriter, r *http.Request) {
	f := h.public
	if f.pin == nil {
		writeError(w, http.StatusServiceUnavailable, "no IdP is pinned: run `authd idp pin URL`")
		return
	}
	pin, err := f.pin()
	switch {
	case errors.Is(err, idp.ErrNotPinned):
		writeError(w, http.StatusServiceUnavailable, "no IdP is pinned: run `authd idp pin URL`")
		return
	case err != nil:
		h.log.Warn("exchange: well-known: idp pin", "err", err)
		writeError(w, http.StatusServiceUnavailable, "the IdP pin is unreadable")
		return
	}
	creds, err := f.sentinelCreds(r.Context(), h)
	if err != nil {
		h.log.Warn("exchange: well-known: sentinel", "reason", signerclient.ReasonOf(err).String(), "err", err)
		writeError(w, http.StatusServiceUnavailable, "the signer is unavailable")
		return
	}
	b := Bundle{
		Space: h.cfg.Space, Server: f.server, TLSRequired: true,
		UserAuth: UserAuth{
			Provider:  Provider,
			IdP:       BundleIdP{URL: pin.URL, Issuer: pin.Issuer, Audience: pin.Audience},
			Endpoints: Endpoints{URL: f.url, ManagerAuthorityURL: f.url + ManagerAuthorityPath},
		},
		SentinelCreds: creds,
	}
	body, err := json.Marshal(b)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}

// sentinelCreds renders the space's sentinel (signerd's GetSpace sentinel_jwt, asked once and
// kept) as NATS creds text: the decorated JWT and the face's throwaway seed, laid out as
// jwt.FormatUserConfig lays out a creds file. The seed is not the JWT subject's (signerd keeps no
// sentinel seed); the sentinel is a bearer JWT, so the broker checks no nonce signature and any
// user seed presents it. The seed carries no authority and is published on purpose.
func (f *publicFace) sentinelCreds(ctx context.Context, h *Handler) (string, error) {
	f.sentMu.Lock()
	defer f.sentMu.Unlock()
	if f.sentinel == "" {
		ctx, cancel := context.WithTimeout(ctx, signerTimeout)
		defer cancel()
		resp, err := h.cfg.Signer.API().GetSpace(ctx, &signerv1.GetSpaceRequest{Space: h.cfg.Space})
		if err != nil {
			return "", signerclient.AsError(err)
		}
		uc, err := jwt.DecodeUserClaims(resp.GetSentinelJwt())
		if err != nil {
			return "", fmt.Errorf("sentinel: %w", err)
		}
		if !uc.BearerToken {
			return "", errors.New("sentinel is not a bearer user JWT")
		}
		f.sentinel = resp.GetSentinelJwt()
	}
	dj, err := jwt.DecorateJWT(f.sentinel)
	if err != nil {
		return "", err
	}
	ds, err := jwt.DecorateSeed(f.seed)
	if err != nil {
		return "", err
	}
	return string(dj) + string(ds), nil
}

// CheckPublicURL refuses a public URL that is not an absolute https URL with a host, or that
// carries user info, a query or a fragment. A path (a tenant prefix on a shared proxy) is kept;
// the answer has no trailing slash.
func CheckPublicURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "", fmt.Errorf("public url %.200q: %w", raw, err)
	case u.Scheme != "https":
		return "", fmt.Errorf("public url %.200q: must be https (the proxy terminates TLS in front of this face)", raw)
	case u.Host == "" || u.Opaque != "" || u.Hostname() == "":
		return "", fmt.Errorf("public url %.200q is not an absolute URL with a host", raw)
	case u.User != nil:
		return "", fmt.Errorf("public url %.200q carries user info", raw)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(raw, "#"):
		return "", fmt.Errorf("public url %.200q has a query or fragment", raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// CheckAdvertisedServer refuses a broker URL the bundle could not advertise: anything but
// nats://, tls://, ws:// or wss:// with a host, or one carrying user info, a query or a fragment.
func CheckAdvertisedServer(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("public server %.200q: %w", raw, err)
	case u.Scheme != "nats" && u.Scheme != "tls" && u.Scheme != "ws" && u.Scheme != "wss":
		return fmt.Errorf("public server %.200q: must be a broker URL (nats://, tls://, ws:// or wss://)", raw)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("public server %.200q has no host", raw)
	case u.User != nil:
		return fmt.Errorf("public server %.200q carries user info", raw)
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("public server %.200q has a query or fragment", raw)
	}
	return nil
}

// peerLimiter is one token bucket per peer in a table of at most size peers; a new peer past it
// evicts the least recently seen one (which at worst gives that peer a fresh burst).
type peerLimiter struct {
	every rate.Limit
	burst int
	size  int
	now   func() time.Time

	mu     sync.Mutex
	order  *list.List // of *peerBucket; front: most recently seen
	byPeer map[string]*list.Element
}

type peerBucket struct {
	peer string
	lim  *rate.Limiter
}

func newPeerLimiter(every rate.Limit, burst, size int, now func() time.Time) *peerLimiter {
	return &peerLimiter{every: every, burst: burst, size: size, now: now, order: list.New(), byPeer: map[string]*list.Element{}}
}

// allow takes a token from peer's bucket, or reports how long until one is due.
func (l *peerLimiter) allow(peer string) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b *peerBucket
	if el, ok := l.byPeer[peer]; ok {
		l.order.MoveToFront(el)
		b = el.Value.(*peerBucket)
	} else {
		if l.order.Len() >= l.size {
			oldest := l.order.Back()
			l.order.Remove(oldest)
			delete(l.byPeer, oldest.Value.(*peerBucket).peer)
		}
		b = &peerBucket{peer: peer, lim: rate.NewLimiter(l.every, l.burst)}
		l.byPeer[peer] = l.order.PushFront(b)
	}
	now := l.now()
	if b.lim.AllowN(now, 1) {
		return 0, true
	}
	r := b.lim.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return wait, false
}

// len is how many peers the table holds.
func (l *peerLimiter) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}
