// Package authclient is the client side of authd: it exchanges an IdP token (a human) or a
// managed actor's token (an agent) at authd's exchange for a Cotal user bearer, keeps that bearer
// renewed ahead of its expiry, and connects to NATS through the auth callout with it: the space's
// sentinel JWT as the user JWT, the bearer as the auth token (through a bearer function, so every
// reconnect presents the freshest one), and an inbox nonce bound to the client's principal
// (space.BoundInboxNonce: the tag of owner.actor, '-', a random suffix) as the connection name with
// `_INBOX_<nonce>` as the inbox prefix. The callout grants no other name: a client cannot take a
// minted credential's `_INBOX_<user key>` or another principal's inbox.
//
// It refuses: an exchange URL that is plain http to anything but a loopback address (the cap and
// the tokens would cross the network in the clear); a config naming both arms or neither; a
// sentinel that is not a bearer user JWT; and, on connect or reconnect, presenting a bearer it
// knows has expired: the connect fails on the client with ErrExpired instead of costing the
// broker a callout round trip that can only deny.
//
// Provider is the client of a space's /service-endpoint-authority (seed 002): it is pinned to the
// authority URL with its tenant path, refuses the same insecure URLs, follows no redirect, bounds
// every answer and returns only answers bound to their request. Its renewal source is a serving
// instance's bearer loop, keeping its requestIds in a private store before it sends them.
package authclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/grpc"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
)

const (
	// RenewFraction is how far into its lifetime a bearer is renewed.
	RenewFraction = 0.75
	// MinRetry and MaxRetry bound the wait between failed renewals.
	MinRetry = 2 * time.Second
	MaxRetry = 60 * time.Second
	// maxResponseBytes bounds an exchange answer.
	maxResponseBytes = 64 << 10
	// exchangeTimeout bounds one exchange when the context has no earlier deadline.
	exchangeTimeout = 10 * time.Second
	// clockSlack is taken off a bearer's usable lifetime for the whole-second resolution of its
	// times and the request's flight.
	clockSlack = time.Second
)

// ErrExpired reports that the current bearer has expired and a new one could not be had.
var ErrExpired = errors.New("authclient: bearer expired and could not be renewed")

// ExchangeError is an exchange authd answered with something other than a bearer.
type ExchangeError struct {
	// Status is the HTTP status (401 refused, 429 throttled, 503 signer or IdP unavailable...).
	Status int
	// Message is authd's error text.
	Message string
}

func (e *ExchangeError) Error() string {
	return fmt.Sprintf("authclient: exchange refused (%d): %s", e.Status, e.Message)
}

// Config is what New needs: the exchange URL, and exactly one arm.
type Config struct {
	// URL is the exchange's base URL (auth-service.json's url), e.g. http://127.0.0.1:8081.
	URL string
	// Cap is the capability of the loopback face (auth-service.json's cap); empty sends no
	// Authorization header (a face that needs none).
	Cap string
	// Actor is the actor to exchange for. Required.
	Actor string
	// IdPToken returns a current IdP token (the human arm); called for every exchange, so it
	// can refresh the token from the IdP.
	IdPToken func(ctx context.Context) (string, error)
	// Owner and ActorToken are the agent arm: the derived owner and the spawn-time secret.
	Owner, ActorToken string
	// TTL is the requested bearer lifetime; zero asks for authd's default (900 s human, 300 s
	// agent). Whole seconds.
	TTL time.Duration
	// View is the optional bearer view (authd issues only "admin").
	View string
	// HTTPClient makes the exchanges; nil means a client with no redirects.
	HTTPClient *http.Client
	// Logger receives renewal failures (never a token); nil discards.
	Logger *slog.Logger
}

// Bearer is one exchanged bearer. It prints as REDACTED in logs.
type Bearer struct {
	// Token is the bearer JWT: a secret.
	Token string
	// Owner is the derived owner it was issued to.
	Owner string
	// Expires is its exp.
	Expires time.Time

	received time.Time     // local clock when it arrived (carries the monotonic reading)
	lifetime time.Duration // exp - iat, from the bearer itself
}

// LogValue keeps the token out of logs.
func (b Bearer) LogValue() slog.Value {
	return slog.GroupValue(slog.String("token", "REDACTED"), slog.String("owner", b.Owner), slog.Time("exp", b.Expires))
}

// usable is how long after receipt the bearer may be presented. It is measured on the local
// monotonic clock from the bearer's own lifetime, so a client whose wall clock is off still
// renews in time.
func (b *Bearer) usable() time.Duration { return b.lifetime - clockSlack }

func (b *Bearer) expired(now time.Time) bool { return !now.Before(b.received.Add(b.usable())) }

func (b *Bearer) renewAt() time.Time {
	return b.received.Add(time.Duration(float64(b.usable()) * RenewFraction))
}

// Client exchanges, caches and renews bearers. It is safe for concurrent use.
type Client struct {
	cfg  Config
	url  string
	http *http.Client
	log  *slog.Logger
	now  func() time.Time
	// suffix is the random part of the inbox nonce; the nonce itself is bound to the principal
	// once the owner is known (at New for an agent, at the first exchange for a human).
	suffix string

	// exMu serialises exchanges, so concurrent callers that find the bearer due share one;
	// mu guards cur, owner and nonce and is never held across a request, so the bearer function a
	// reconnect calls never waits on the network.
	exMu  sync.Mutex
	mu    sync.Mutex
	cur   *Bearer
	owner string // the owner the nonce is bound to; "" until known
	nonce string
}

// New validates cfg. It makes no request.
func New(cfg Config) (*Client, error) {
	u, err := exchangeURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	if err := space.ValidateActor(cfg.Actor); err != nil {
		return nil, fmt.Errorf("authclient: %w", err)
	}
	switch human, agent := cfg.IdPToken != nil, cfg.Owner != "" || cfg.ActorToken != ""; {
	case human && agent:
		return nil, errors.New("authclient: IdPToken (human) and Owner/ActorToken (agent) are exclusive")
	case !human && !agent:
		return nil, errors.New("authclient: IdPToken (human) or Owner and ActorToken (agent) is required")
	case agent:
		if err := space.ValidateDerivedOwner(cfg.Owner); err != nil {
			return nil, fmt.Errorf("authclient: %w", err)
		}
		if cfg.ActorToken == "" {
			return nil, errors.New("authclient: ActorToken is empty")
		}
	}
	if cfg.TTL < 0 || cfg.TTL%time.Second != 0 {
		return nil, errors.New("authclient: TTL must be whole seconds, zero for the default")
	}
	suffix, err := NewNonce()
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, url: u, http: cfg.HTTPClient, log: cfg.Logger, now: time.Now, suffix: suffix}
	if cfg.Owner != "" {
		if err := c.bind(cfg.Owner); err != nil {
			return nil, err
		}
	}
	if c.http == nil {
		c.http = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// exchangeURL checks the base URL and returns its /exchange endpoint.
func exchangeURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("authclient: URL: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return "", fmt.Errorf("authclient: URL %.200q is not an http(s) URL with a host", raw)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("authclient: URL %.200q carries user info, a query or a fragment", raw)
	case u.Scheme == "http":
		host := u.Hostname()
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return "", fmt.Errorf("authclient: URL %.200q: plain http only to a loopback address", raw)
		}
	}
	return strings.TrimSuffix(u.String(), "/") + "/exchange", nil
}

// NewNonce returns a random nonce: 16 random bytes, base64url, 22 characters of [A-Za-z0-9_-].
// The client uses one as the random suffix of its bound inbox nonce.
func NewNonce() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	n := base64.RawURLEncoding.EncodeToString(b)
	if err := space.ValidateInboxNonce(n); err != nil {
		return "", err
	}
	return n, nil
}

// Nonce is this client's inbox nonce, the connection name it presents: bound to its principal
// (space.BoundInboxNonce). It is "" until the owner is known: an agent client knows it from New, a
// human client from its first exchange (NatsOptions exchanges first when needed).
func (c *Client) Nonce() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nonce
}

// InboxPrefix is the inbox prefix the callout grants this client, _INBOX_<nonce>; "" while the
// nonce is not yet bound.
func (c *Client) InboxPrefix() string {
	if n := c.Nonce(); n != "" {
		return "_INBOX_" + n
	}
	return ""
}

// bind binds the inbox nonce to owner (the actor is the configured one) the first time an owner
// is known, and refuses any other owner afterwards: the callout would refuse the nonce for it.
func (c *Client) bind(owner string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.owner != "" {
		if owner != c.owner {
			return fmt.Errorf("authclient: exchange answered for owner %s; this client's inbox nonce is bound to owner %s", owner, c.owner)
		}
		return nil
	}
	n, err := space.BoundInboxNonce(owner, c.cfg.Actor, c.suffix)
	if err != nil {
		return fmt.Errorf("authclient: inbox nonce: %w", err)
	}
	c.owner, c.nonce = owner, n
	return nil
}

// Exchange asks authd for a new bearer and makes it current.
func (c *Client) Exchange(ctx context.Context) (Bearer, error) {
	c.exMu.Lock()
	defer c.exMu.Unlock()
	b, err := c.exchangeLocked(ctx)
	if err != nil {
		return Bearer{}, err
	}
	return *b, nil
}

// Bearer returns the current bearer's token, exchanging for a new one first when none is held or
// the current one is due for renewal. A due renewal that fails keeps the current bearer while it
// lives; once it has expired the answer is ErrExpired (wrapping the exchange's error).
func (c *Client) Bearer(ctx context.Context) (string, error) {
	if cur := c.held(); cur != nil && c.now().Before(cur.renewAt()) {
		return cur.Token, nil
	}
	c.exMu.Lock()
	defer c.exMu.Unlock()
	// Another caller may have renewed while this one waited.
	if cur := c.held(); cur != nil && c.now().Before(cur.renewAt()) {
		return cur.Token, nil
	}
	b, err := c.exchangeLocked(ctx)
	if err == nil {
		return b.Token, nil
	}
	if cur := c.held(); cur != nil && !cur.expired(c.now()) {
		c.log.Warn("authclient: renewal failed; the current bearer is still valid", "err", err)
		return cur.Token, nil
	}
	return "", fmt.Errorf("%w: %w", ErrExpired, err)
}

// held returns the current bearer, if any.
func (c *Client) held() *Bearer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// current returns the held token if it has not expired.
func (c *Client) current() (string, bool) {
	cur := c.held()
	if cur == nil || cur.expired(c.now()) {
		return "", false
	}
	return cur.Token, true
}

// Run renews the bearer at RenewFraction of its lifetime until ctx ends, retrying a failed
// renewal after MinRetry, doubling to MaxRetry. It returns ErrExpired when the bearer expired
// without a renewal, and nil when ctx ends.
func (c *Client) Run(ctx context.Context) error {
	if _, err := c.Bearer(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	retry := MinRetry
	for {
		cur := c.held()
		wait := time.Duration(0)
		if cur != nil {
			wait = cur.renewAt().Sub(c.now())
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if _, err := c.Bearer(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if c.held() != cur {
			retry = MinRetry
			continue
		}
		// The renewal failed and the old bearer still lives: wait before the next try.
		t = time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		retry = min(2*retry, MaxRetry)
	}
}

// exchangeLocked performs one exchange and adopts its bearer. exMu must be held.
func (c *Client) exchangeLocked(ctx context.Context) (*Bearer, error) {
	ctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	body := map[string]any{"actor": c.cfg.Actor}
	if c.cfg.IdPToken != nil {
		tok, err := c.cfg.IdPToken(ctx)
		if err != nil {
			return nil, fmt.Errorf("authclient: IdP token: %w", err)
		}
		body["idpToken"] = tok
	} else {
		body["owner"], body["actorToken"] = c.cfg.Owner, c.cfg.ActorToken
	}
	if c.cfg.TTL > 0 {
		body["ttlSec"] = int64(c.cfg.TTL / time.Second)
	}
	if c.cfg.View != "" {
		body["view"] = c.cfg.View
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.cfg.Cap != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.Cap)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("authclient: exchange: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, fmt.Errorf("authclient: exchange: %w", err)
	}
	if len(raw) > maxResponseBytes {
		return nil, fmt.Errorf("authclient: exchange answer larger than %d bytes", maxResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		return nil, &ExchangeError{Status: resp.StatusCode, Message: e.Error}
	}
	var ok struct {
		Token string `json:"token"`
		Owner string `json:"owner"`
		Exp   int64  `json:"exp"`
	}
	if err := json.Unmarshal(raw, &ok); err != nil {
		return nil, fmt.Errorf("authclient: exchange answer: %w", err)
	}
	b, err := newBearer(ok.Token, ok.Owner, ok.Exp, c.now())
	if err != nil {
		return nil, err
	}
	if err := c.bind(b.Owner); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.cur = b
	c.mu.Unlock()
	return b, nil
}

// newBearer checks an exchange answer and reads the bearer's lifetime from its iat and exp. The
// bearer's signature is not checked here: the broker's callout does that, and this client got it
// from the exchange it was configured with.
func newBearer(token, owner string, exp int64, received time.Time) (*Bearer, error) {
	if err := space.ValidateDerivedOwner(owner); err != nil {
		return nil, fmt.Errorf("authclient: exchange answer: %w", err)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("authclient: exchange answer: token is not a compact JWS")
	}
	pb, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("authclient: exchange answer: token payload: %w", err)
	}
	var claims struct {
		Iat int64 `json:"iat"`
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(pb, &claims); err != nil {
		return nil, fmt.Errorf("authclient: exchange answer: token payload: %w", err)
	}
	lifetime := time.Duration(claims.Exp-claims.Iat) * time.Second
	if claims.Exp != exp || lifetime <= clockSlack {
		return nil, fmt.Errorf("authclient: exchange answer: exp %d does not match a bearer of iat %d exp %d", exp, claims.Iat, claims.Exp)
	}
	return &Bearer{Token: token, Owner: owner, Expires: time.Unix(exp, 0), received: received, lifetime: lifetime}, nil
}

// SpaceGetter is the one signerd call Sentinel needs; signerv1.SignerServiceClient satisfies it.
type SpaceGetter interface {
	GetSpace(ctx context.Context, in *signerv1.GetSpaceRequest, opts ...grpc.CallOption) (*signerv1.GetSpaceResponse, error)
}

// Sentinel returns the space's sentinel JWT from signerd's GetSpace, checked with CheckSentinel.
func Sentinel(ctx context.Context, api SpaceGetter, spaceName string) (string, error) {
	resp, err := api.GetSpace(ctx, &signerv1.GetSpaceRequest{Space: spaceName})
	if err != nil {
		return "", fmt.Errorf("authclient: GetSpace: %w", err)
	}
	s := resp.GetSentinelJwt()
	if err := CheckSentinel(s); err != nil {
		return "", err
	}
	return s, nil
}

// CheckSentinel refuses anything but a bearer user JWT (the sentinel is presented without a
// nonce signature, so only a bearer JWT can be).
func CheckSentinel(sentinel string) error {
	uc, err := jwt.DecodeUserClaims(sentinel)
	if err != nil {
		return fmt.Errorf("authclient: sentinel: %w", err)
	}
	if !uc.BearerToken {
		return errors.New("authclient: sentinel is not a bearer user JWT")
	}
	return nil
}

// NatsOptions are the options that connect through the callout: the sentinel as user JWT, the
// bearer through a bearer function (nats.TokenHandler), the bound nonce as connection name and
// _INBOX_<nonce> as inbox prefix. A human client whose owner is not known yet exchanges first
// (the owner is derived by the exchange, and the nonce is bound to it). Before each connect and reconnect the JWT callback makes sure
// a live bearer is held (exchanging if it is due); if none can be had it fails the attempt with
// ErrExpired rather than present a dead bearer. Run keeps the bearer fresh between reconnects.
func (c *Client) NatsOptions(sentinel string) ([]nats.Option, error) {
	if err := CheckSentinel(sentinel); err != nil {
		return nil, err
	}
	if c.Nonce() == "" {
		ctx, cancel := context.WithTimeout(context.Background(), exchangeTimeout)
		defer cancel()
		if _, err := c.Bearer(ctx); err != nil {
			return nil, fmt.Errorf("authclient: the inbox nonce needs the owner the exchange derives: %w", err)
		}
	}
	nonce := c.Nonce()
	// The sentinel is a bearer JWT: the server checks no nonce signature, but nats.go requires a
	// signer whenever a user JWT is set. A throwaway key answers it.
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	return []nats.Option{
		nats.Name(nonce),
		nats.CustomInboxPrefix("_INBOX_" + nonce),
		nats.UserJWT(func() (string, error) {
			ctx, cancel := context.WithTimeout(context.Background(), exchangeTimeout)
			defer cancel()
			if _, err := c.Bearer(ctx); err != nil {
				return "", err
			}
			return sentinel, nil
		}, kp.Sign),
		nats.TokenHandler(func() string {
			tok, _ := c.current()
			return tok
		}),
	}, nil
}
