package signerclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
)

// Rail defaults.
const (
	// DefaultRetryInterval is how long a failed renewal waits before the next attempt (less
	// when that would pass the current credential's expiry).
	DefaultRetryInterval = 60 * time.Second
	// DefaultProveTimeout bounds the throwaway broker connection that proves a credential.
	DefaultProveTimeout = 10 * time.Second
	// RenewFraction is the point of a credential's usable life (exp - iat less a second, timed
	// from its receipt) at which Run renews it.
	RenewFraction = 0.75
	// minRetry is the shortest wait between renewal attempts (unless RetryInterval is shorter),
	// so retries near expiry never spin.
	minRetry = 100 * time.Millisecond
)

// Rail errors.
var (
	// ErrNotStarted: Run or a connection was used before Start adopted a credential.
	ErrNotStarted = errors.New("signerclient: rail not started")
	// ErrStarted: Start was called twice.
	ErrStarted = errors.New("signerclient: rail already started")
	// ErrClosed: the rail was closed and its key wiped.
	ErrClosed = errors.New("signerclient: rail closed")
	// ErrExpired: the current credential expired before any renewal succeeded. Remint cannot
	// renew an expired credential, so Run gives up and returns an *ExpiredError.
	ErrExpired = errors.New("signerclient: credential expired without renewal")
	// ErrSubjectChanged: a renewed credential names another user key than the rail's.
	ErrSubjectChanged = errors.New("signerclient: renewed credential has another subject")
)

// ExpiredError says the current credential expired while renewals kept failing. It matches
// ErrExpired and wraps the last renewal error (nil when NatsOptions' JWT callback refuses an
// expired credential).
type ExpiredError struct {
	JTI     string
	Expires time.Time
	Last    error
}

// Error names the credential and the last failure.
func (e *ExpiredError) Error() string {
	if e.Last == nil {
		return fmt.Sprintf("signerclient: credential %s expired at %s without renewal", e.JTI, e.Expires.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("signerclient: credential %s expired at %s without renewal: %v", e.JTI, e.Expires.UTC().Format(time.RFC3339), e.Last)
}

// Is reports whether target is ErrExpired.
func (e *ExpiredError) Is(target error) bool { return target == ErrExpired }

// Unwrap returns the last renewal error.
func (e *ExpiredError) Unwrap() error { return e.Last }

// ProofError says the broker refused a credential on the throwaway proof connection; the
// credential was not adopted.
type ProofError struct {
	JTI string
	Err error
}

// Error names the credential (by jti, never the JWT) and the broker's answer.
func (e *ProofError) Error() string {
	return fmt.Sprintf("signerclient: broker refused credential %s: %v", e.JTI, e.Err)
}

// Unwrap returns the connection error.
func (e *ProofError) Unwrap() error { return e.Err }

// Source issues a rail's credentials when they do not come from signerd: a remote managerd's
// supervisor credential, which authd's manager-service authority mints (prepare) and renews
// (renew) for the rail's public key. Mint and Renew answer a user JWT for userPublicKey; the
// rail checks and proves it on the broker before it adopts it, exactly as it does signerd's, and
// renews at RenewFraction of its life. Renew is given the JWT in use. A Source never sees the
// rail's seed.
type Source interface {
	Mint(ctx context.Context, userPublicKey string) (jwt string, err error)
	Renew(ctx context.Context, userPublicKey, currentJWT string) (jwt string, err error)
}

// RailConfig is what NewRail needs. Space and NatsURL or NatsURLs are required, and either Source
// or Client and Profile.
type RailConfig struct {
	// Client calls signerd (Mint, and Remint proven by the rail's key). Ignored with Source.
	Client *Client
	// Source, if set, issues the credentials instead of signerd: Client, Profile, Params and TTL
	// are then not used.
	Source Source
	// Space is the space to mint in.
	Space string
	// Profile and Params describe the credential; signerd builds the permissions.
	Profile signerv1.Profile
	Params  *signerv1.ProfileParams
	// TTL is the requested lifetime of each credential; zero means the profile default (signerd
	// caps it at the profile maximum and the caller's policy). Negative values are refused.
	TTL time.Duration
	// NatsURL is the broker every credential is proven against before it is adopted (a
	// comma-separated list is taken as NatsURLs).
	NatsURL string
	// NatsURLs are a cluster's brokers, each its own entry; the proof connection tries them in
	// turn, so a credential is proven while any node is up. They follow NatsURL when both are set.
	NatsURLs []string
	// Logger receives adoption and renewal lines; nil discards. No JWT or seed is ever logged.
	Logger *slog.Logger
	// Now is the rail's clock; nil means time.Now. The rail uses it only to measure time
	// elapsed since a credential arrived (by the monotonic reading time.Now carries), never
	// compares its wall-clock value with a credential's iat or exp: proofs, expiry and renewal
	// are timed from the credential's iat, signerd's clock, so a client whose wall clock is off
	// still renews.
	Now func() time.Time
	// RetryInterval is the wait after a failed renewal; zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// ProveTimeout bounds each proof connection; zero means DefaultProveTimeout.
	ProveTimeout time.Duration
	// OnRenew, if set, is called after each renewed credential is adopted (not for the first,
	// which Start adopts), with its jti and expiry.
	OnRenew func(jti string, expires time.Time)
	// OnRenewFailed, if set, is called by Run after each failed renewal, with its error and the
	// wait before the next attempt (the current credential stays): the nonfatal condition a
	// host's warning event reports. It runs on Run's goroutine and must not block.
	OnRenewFailed func(err error, retryIn time.Duration)
	// UserSeed, if set, is the user seed the rail uses instead of generating one: for a key the
	// broker must already know, such as authd's callout-service user registered in the AUTH
	// account's auth_users (read it with creds.ReadSeedFile, which checks the file's mode and
	// owner). It must be a user seed ("SU..."). NewRail decodes its own key pair from it; the
	// caller keeps the Seed and should wipe it once NewRail returns. Nothing else changes: the
	// rail mints for that key's public key, proves each credential on the broker with it and
	// renews by Remint proofs signed with it.
	UserSeed *creds.Seed
}

// credential is one adopted JWT with the facts read from its own claims. issued and expires
// are signerd's clock (iat and exp); received is the rail's clock when signerd's answer
// arrived, the origin of every duration the rail measures for this credential.
type credential struct {
	jwt      string
	jti      string
	account  string // issuer_account: empty when the account's identity key signed it
	issuer   string
	issued   time.Time
	expires  time.Time
	received time.Time
}

// lifetime is the credential's life as signerd granted it, exp - iat.
func (c *credential) lifetime() time.Duration { return c.expires.Sub(c.issued) }

// iatResolution is the precision of iat and exp: whole seconds. signerd signed c at some
// instant of the second iat names, so its clock read up to this much more than iat when c
// arrived.
const iatResolution = time.Second

// usable is how long after receipt the rail uses c: its lifetime less iatResolution, so the
// rail stops presenting c no later than signerd and the broker (on signerd's clock) see it
// expire.
func (c *credential) usable() time.Duration { return c.lifetime() - iatResolution }

// localExpiry is when c expires on the rail's clock: usable after receipt.
func (c *credential) localExpiry() time.Time { return c.received.Add(c.usable()) }

// signerNow estimates signerd's clock at now (the rail's clock): c's iat plus the time elapsed
// since c arrived. It trails signerd by less than iatResolution plus the network trip, well
// inside signerd's ProofWindow.
func signerNow(c *credential, now time.Time) time.Time { return c.issued.Add(now.Sub(c.received)) }

// expired reports whether c has expired at now (the rail's clock).
func expired(c *credential, now time.Time) bool { return !now.Before(c.localExpiry()) }

// Rail keeps one broker credential alive for a process. Its user nkey is generated in memory by
// NewRail (or decoded from RailConfig.UserSeed) and never leaves it: not to disk, not to a log,
// not to signerd (which sees only the public key and proofs). A Rail is safe for concurrent use.
type Rail struct {
	cfg    RailConfig
	log    *slog.Logger
	pub    string
	inbox  string
	cur    atomic.Pointer[credential]
	closed chan struct{}

	// mu guards key: sign holds it for reading, Close for writing while it wipes the key.
	mu  sync.RWMutex
	key nkeys.KeyPair

	startOnce atomic.Bool
	closeOnce sync.Once
	// renewMu serializes Run's renewals with RenewNow's.
	renewMu sync.Mutex
}

// NewRail validates cfg and generates the rail's user nkey, or decodes it from cfg.UserSeed. It
// refuses a nil client without a Source, an invalid space name, an unspecified profile, an empty broker URL,
// negative durations, and a UserSeed that is wiped, not canonically encoded or not a user seed.
func NewRail(cfg RailConfig) (*Rail, error) {
	switch {
	case cfg.Source == nil && cfg.Client == nil:
		return nil, errors.New("signerclient: RailConfig.Client and Source are nil")
	case cfg.Source == nil && cfg.Profile == signerv1.Profile_PROFILE_UNSPECIFIED:
		return nil, errors.New("signerclient: RailConfig.Profile is unspecified")
	case cfg.NatsURL == "" && len(cfg.NatsURLs) == 0:
		return nil, errors.New("signerclient: RailConfig.NatsURL and NatsURLs are empty")
	case cfg.TTL < 0 || cfg.RetryInterval < 0 || cfg.ProveTimeout < 0:
		return nil, fmt.Errorf("signerclient: negative duration in RailConfig (TTL %v, RetryInterval %v, ProveTimeout %v)", cfg.TTL, cfg.RetryInterval, cfg.ProveTimeout)
	}
	if err := space.ValidateName(cfg.Space); err != nil {
		return nil, fmt.Errorf("signerclient: RailConfig.Space: %w", err)
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.ProveTimeout == 0 {
		cfg.ProveTimeout = DefaultProveTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key, err := railKey(cfg.UserSeed)
	if err != nil {
		return nil, err
	}
	cfg.UserSeed = nil // the rail keeps its own key pair, not the caller's Seed
	pub, err := key.PublicKey()
	if err != nil {
		key.Wipe()
		return nil, fmt.Errorf("signerclient: user nkey: %w", err)
	}
	r := &Rail{cfg: cfg, pub: pub, inbox: "_INBOX_" + pub, key: key, closed: make(chan struct{})}
	r.log = log.With("space", cfg.Space, "profile", cfg.Profile.String(), "user", pub)
	return r, nil
}

// railKey is a fresh user key pair, or the one seed encodes.
func railKey(seed *creds.Seed) (nkeys.KeyPair, error) {
	if seed == nil {
		key, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("signerclient: generate user nkey: %w", err)
		}
		return key, nil
	}
	kind, err := seed.Prefix()
	if err != nil {
		return nil, fmt.Errorf("signerclient: RailConfig.UserSeed: %w", err)
	}
	if kind != nkeys.PrefixByteUser {
		return nil, fmt.Errorf("signerclient: RailConfig.UserSeed is a %s seed, want a user seed", kind)
	}
	key, err := seed.KeyPair()
	if err != nil {
		return nil, fmt.Errorf("signerclient: RailConfig.UserSeed: %w", err)
	}
	return key, nil
}

// PublicKey returns the rail's user public key, the subject of every credential it holds.
func (r *Rail) PublicKey() string { return r.pub }

// Current returns the jti and expiry of the credential in use; zero values before Start.
func (r *Rail) Current() (jti string, expires time.Time) {
	c := r.cur.Load()
	if c == nil {
		return "", time.Time{}
	}
	return c.jti, c.expires
}

// Account returns the account the credential in use belongs to: its issuer_account, or its
// issuer when the account's identity key signed it; "" before Start. A host that was assigned an
// account checks it before it uses the credential.
func (r *Rail) Account() string {
	c := r.cur.Load()
	if c == nil {
		return ""
	}
	if c.account != "" {
		return c.account
	}
	return c.issuer
}

// LogValue describes the rail without its key or JWT.
func (r *Rail) LogValue() slog.Value {
	jti, exp := r.Current()
	return slog.GroupValue(slog.String("user", r.pub), slog.String("space", r.cfg.Space), slog.String("jti", jti), slog.Time("expires", exp))
}

// Close wipes the key. Connections made with NatsOptions can no longer authenticate, and Run
// returns ErrClosed.
func (r *Rail) Close() {
	r.closeOnce.Do(func() {
		close(r.closed)
		r.mu.Lock()
		r.key.Wipe()
		r.key = nil
		r.mu.Unlock()
	})
}

// sign signs with the rail's key; it refuses after Close.
func (r *Rail) sign(b []byte) ([]byte, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.key == nil {
		return nil, ErrClosed
	}
	return r.key.Sign(b)
}

// NatsOptions returns the options a broker connection needs to authenticate with the rail:
// the current JWT, read again at every connect and reconnect (the broker closes a connection
// when the JWT it connected with expires, and nats.go then reconnects with the freshest one),
// the nonce signed with the rail's key, and the reply-inbox prefix _INBOX_<user public key>,
// the only inbox a data-account credential may subscribe to.
//
// The JWT callback refuses with an *ExpiredError (ErrExpired) once the current credential has
// expired (its lifetime, exp - iat, less one second for iat's resolution, elapsed on the rail's
// clock since it arrived), so after Run gives up a connect or reconnect fails on the client
// instead of presenting an expired JWT.
//
// It also sets IgnoreAuthErrorAbort: by default nats.go gives up for good after the same auth
// error twice on one server, and every renewal ends an old connection with the same
// "authentication expired" error. And it sets an ErrorHandler that logs asynchronous errors to
// the rail's logger (an expiry at debug level, since it is the normal end of a credential)
// instead of nats.go's default, which prints to stderr; append your own ErrorHandler after
// these options to replace it.
func (r *Rail) NatsOptions() []nats.Option {
	return []nats.Option{
		nats.UserJWT(func() (string, error) {
			c := r.cur.Load()
			if c == nil {
				return "", ErrNotStarted
			}
			if expired(c, r.cfg.Now()) {
				return "", &ExpiredError{JTI: c.jti, Expires: c.expires}
			}
			return c.jwt, nil
		}, r.sign),
		nats.CustomInboxPrefix(r.inbox),
		nats.IgnoreAuthErrorAbort(),
		nats.ErrorHandler(r.asyncError),
	}
}

// asyncError logs a broker connection's asynchronous error.
func (r *Rail) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrAuthExpired) {
		r.log.Debug("broker closed a connection whose credential expired; reconnecting with the current one")
		return
	}
	if sub != nil {
		r.log.Warn("broker connection error", "subject", sub.Subject, "err", err)
		return
	}
	r.log.Warn("broker connection error", "err", err)
}

// Start mints the first credential, proves it on a throwaway broker connection and adopts it.
// It refuses to run twice or after Close, and fails if signerd refuses the Mint or the broker
// refuses the credential.
func (r *Rail) Start(ctx context.Context) error {
	select {
	case <-r.closed:
		return ErrClosed
	default:
	}
	if !r.startOnce.CompareAndSwap(false, true) {
		return ErrStarted
	}
	cred, err := r.mint(ctx)
	if err != nil {
		r.startOnce.Store(false)
		return fmt.Errorf("signerclient: start: mint: %w", err)
	}
	c, err := r.accept(ctx, cred, "")
	if err != nil {
		r.startOnce.Store(false)
		return fmt.Errorf("signerclient: start: %w", err)
	}
	r.cur.Store(c)
	r.log.Info("credential adopted", "jti", c.jti, "expires", c.expires)
	return nil
}

// mint is the first credential: from the Source, else a signerd Mint.
func (r *Rail) mint(ctx context.Context) (*signerv1.Credential, error) {
	if r.cfg.Source != nil {
		j, err := r.cfg.Source.Mint(ctx, r.pub)
		if err != nil {
			return nil, err
		}
		return &signerv1.Credential{Jwt: j}, nil
	}
	req := &signerv1.MintRequest{Space: r.cfg.Space, Profile: r.cfg.Profile, UserPublicKey: r.pub, Params: r.cfg.Params}
	if r.cfg.TTL > 0 {
		req.Ttl = durationpb.New(r.cfg.TTL)
	}
	return r.cfg.Client.Mint(ctx, req)
}

// accept checks a credential from signerd and proves it on the broker. account, when set, is
// the issuer account the credential must keep (a renewal stays in the first one's account). It
// refuses a credential without iat, or whose exp is not after its iat; it does not compare them
// with the local wall clock, which may be off.
func (r *Rail) accept(ctx context.Context, cred *signerv1.Credential, account string) (*credential, error) {
	received := r.cfg.Now()
	uc, err := jwt.DecodeUserClaims(cred.GetJwt())
	if err != nil {
		return nil, &ResponseError{Field: "jwt", Want: "a valid user JWT", Got: "undecodable"}
	}
	if uc.Subject != r.pub {
		return nil, fmt.Errorf("%w: %s, want %s", ErrSubjectChanged, uc.Subject, r.pub)
	}
	if account != "" && uc.IssuerAccount != account {
		return nil, &ResponseError{Field: "issuer_account", Want: account, Got: uc.IssuerAccount}
	}
	if uc.Expires == 0 {
		return nil, &ResponseError{Field: "expires", Want: "an expiry", Got: "none"}
	}
	if uc.IssuedAt == 0 {
		return nil, &ResponseError{Field: "issued_at", Want: "an issued-at", Got: "none"}
	}
	c := &credential{
		jwt: cred.GetJwt(), jti: uc.ID, account: uc.IssuerAccount, issuer: uc.Issuer,
		issued: time.Unix(uc.IssuedAt, 0), expires: time.Unix(uc.Expires, 0), received: received,
	}
	if c.lifetime() <= 0 {
		return nil, &ResponseError{Field: "expires", Want: "after issued-at " + c.issued.UTC().Format(time.RFC3339), Got: c.expires.UTC().Format(time.RFC3339)}
	}
	if err := r.prove(ctx, c); err != nil {
		return nil, err
	}
	return c, nil
}

// proofServers is NatsURL and NatsURLs as the one comma-separated list nats.Connect takes.
func (r *Rail) proofServers() string {
	var all []string
	if r.cfg.NatsURL != "" {
		all = append(all, r.cfg.NatsURL)
	}
	return strings.Join(append(all, r.cfg.NatsURLs...), ",")
}

// prove connects to the broker with c alone, flushes and closes: the broker has then checked
// the JWT's signature chain, expiry and our nonce signature. A connection that never comes up
// is a refusal.
func (r *Rail) prove(ctx context.Context, c *credential) error {
	timeout := r.cfg.ProveTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if timeout <= 0 {
		return &ProofError{JTI: c.jti, Err: context.DeadlineExceeded}
	}
	nc, err := nats.Connect(r.proofServers(),
		nats.Name("cotal-credential-proof"),
		nats.NoReconnect(),
		nats.Timeout(timeout),
		nats.UserJWT(func() (string, error) { return c.jwt, nil }, r.sign),
		nats.CustomInboxPrefix(r.inbox),
		// The outcome is read from Connect and Flush; nothing asynchronous is of interest.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	)
	if err != nil {
		return &ProofError{JTI: c.jti, Err: err}
	}
	defer nc.Close()
	if err := nc.FlushTimeout(timeout); err != nil {
		return &ProofError{JTI: c.jti, Err: err}
	}
	return nil
}

// renewAt is when Run renews c on the rail's clock: RenewFraction of its usable life after it
// arrived.
func renewAt(c *credential) time.Time {
	return c.received.Add(time.Duration(float64(c.usable()) * RenewFraction))
}

// retryDelay is the wait after a failed renewal at now: RetryInterval, or half of what is left
// when RetryInterval would pass expiry, but never less than minRetry (or RetryInterval, if that
// is shorter).
func retryDelay(now, expires time.Time, interval time.Duration) time.Duration {
	d := interval
	if left := expires.Sub(now); now.Add(d).After(expires) {
		d = left / 2
	}
	return max(d, min(minRetry, interval))
}

// Run renews the credential until ctx is done (returns nil) or the rail is closed (ErrClosed).
// Renewal and expiry are timed by the rail's clock from when each credential arrived (see
// RailConfig.Now). Each renewal is a Remint proven by the rail's key; the new credential must name the same
// subject and account and pass a proof connection before it replaces the current one, in one
// atomic swap. A failed renewal logs a warning and is retried after RetryInterval (sooner near
// expiry) while the current credential stays in use; if it expires first, Run returns an
// *ExpiredError, because signerd does not renew an expired credential.
func (r *Rail) Run(ctx context.Context) error {
	if r.cur.Load() == nil {
		return ErrNotStarted
	}
	planned := r.cur.Load()
	next := renewAt(planned)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var last error
	for {
		timer.Reset(max(next.Sub(r.cfg.Now()), 0))
		select {
		case <-ctx.Done():
			return nil
		case <-r.closed:
			return ErrClosed
		case <-timer.C:
		}
		r.renewMu.Lock()
		cur := r.cur.Load()
		if cur != planned {
			// RenewNow adopted a newer credential: renew that one when its time comes.
			r.renewMu.Unlock()
			planned, next, last = cur, renewAt(cur), nil
			continue
		}
		now := r.cfg.Now()
		if expired(cur, now) {
			r.renewMu.Unlock()
			if last == nil {
				last = errors.New("no renewal attempted before expiry")
			}
			r.log.Error("credential expired without renewal", "jti", cur.jti, "expires", cur.expires, "err", last)
			return &ExpiredError{JTI: cur.jti, Expires: cur.expires, Last: last}
		}
		c, err := r.renew(ctx, cur)
		if err == nil {
			r.cur.Store(c)
		}
		r.renewMu.Unlock()
		if err != nil {
			select {
			case <-ctx.Done():
				return nil
			case <-r.closed:
				return ErrClosed
			default:
			}
			last = err
			now = r.cfg.Now()
			delay := retryDelay(now, cur.localExpiry(), r.cfg.RetryInterval)
			next = now.Add(delay)
			r.log.Warn("credential renewal failed; keeping the current credential",
				"err", err, "jti", cur.jti, "expires", cur.expires, "retry_in", delay)
			if r.cfg.OnRenewFailed != nil {
				r.cfg.OnRenewFailed(err, delay)
			}
			continue
		}
		last = nil
		planned, next = c, renewAt(c)
		r.log.Info("credential renewed", "jti", c.jti, "expires", c.expires, "previous_jti", cur.jti)
		if r.cfg.OnRenew != nil {
			r.cfg.OnRenew(c.jti, c.expires)
		}
	}
}

// Renewed is a credential RenewNow adopted: its jti and signerd's iat and exp.
type Renewed struct {
	JTI             string
	Issued, Expires time.Time
}

// RenewNow renews the credential at once (deliveryd's reloadCreds): a Remint proven on a
// throwaway broker connection and adopted exactly as Run's renewals are, serialized with them,
// so the caller learns the proven credential's identity. A failure keeps the current credential.
// Run then times its next renewal from the adopted credential.
func (r *Rail) RenewNow(ctx context.Context) (Renewed, error) {
	select {
	case <-r.closed:
		return Renewed{}, ErrClosed
	default:
	}
	r.renewMu.Lock()
	cur := r.cur.Load()
	if cur == nil {
		r.renewMu.Unlock()
		return Renewed{}, ErrNotStarted
	}
	c, err := r.renew(ctx, cur)
	if err != nil {
		r.renewMu.Unlock()
		return Renewed{}, err
	}
	r.cur.Store(c)
	r.renewMu.Unlock()
	r.log.Info("credential renewed on request", "jti", c.jti, "expires", c.expires, "previous_jti", cur.jti)
	if r.cfg.OnRenew != nil {
		r.cfg.OnRenew(c.jti, c.expires)
	}
	return Renewed{JTI: c.jti, Issued: c.issued, Expires: c.expires}, nil
}

// renew remints cur and accepts the result. The proof is dated signerNow, signerd's clock as
// cur's iat and the time since it arrived tell it, not the local wall clock.
func (r *Rail) renew(ctx context.Context, cur *credential) (*credential, error) {
	if r.cfg.Source != nil {
		j, err := r.cfg.Source.Renew(ctx, r.pub, cur.jwt)
		if err != nil {
			return nil, fmt.Errorf("renew: %w", err)
		}
		return r.accept(ctx, &signerv1.Credential{Jwt: j}, cur.account)
	}
	cred, err := r.cfg.Client.remint(ctx, r.cfg.Space, cur.jwt, r.sign, r.cfg.TTL, signerNow(cur, r.cfg.Now()))
	if err != nil {
		return nil, fmt.Errorf("remint: %w", err)
	}
	return r.accept(ctx, cred, cur.account)
}
