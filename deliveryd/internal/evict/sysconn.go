package evict

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
)

// Minter asks signerd for one credential. *signerclient.Client implements it.
type Minter interface {
	Mint(ctx context.Context, req *signerv1.MintRequest) (*signerv1.Credential, error)
}

// Dialer opens the delivery daemon's $SYS connections: each has its own user nkey, generated in
// memory, and a credential signerd mints for it on deliveryd's identity (only deliveryd's policy
// may mint the two $SYS profiles). The data account every scan names is pinned at construction
// to the daemon's own credential account, and a minted observer that names another account is
// refused (upstream's tenancy check).
type Dialer struct {
	Minter Minter
	Space  string
	// Account is the data account the daemon's own credential lives in.
	Account string
	// Brokers are the broker URLs; Options are added to every connection (TLS settings).
	Brokers []string
	Options []nats.Option
	// TTL asks a lifetime for the observer; zero asks the profile's default.
	TTL time.Duration
}

// Conn is one $SYS connection and the credential it holds.
type Conn struct {
	*nats.Conn
	Profile signerv1.Profile
	// Expires is the current credential's exp; Issued its iat.
	Issued, Expires time.Time

	d   *Dialer
	key nkeys.KeyPair
	pub string
	mu  sync.Mutex
	jwt string
}

// check validates the dialer's fixed values.
func (d *Dialer) check() error {
	switch {
	case d == nil || d.Minter == nil:
		return errors.New("evict: no signer client")
	case len(d.Brokers) == 0:
		return errors.New("evict: no broker URL")
	}
	if _, err := space.SysAccountConnz(d.Account); err != nil {
		return fmt.Errorf("evict: the daemon's own account: %w", err)
	}
	return nil
}

// Dial mints a credential of profile for a fresh key and connects with it. reconnect keeps the
// connection reconnecting for ever (the feed's observer); otherwise it never reconnects (a
// per-call connection).
func (d *Dialer) Dial(ctx context.Context, profile signerv1.Profile, name string, reconnect bool, extra ...nats.Option) (*Conn, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		kp.Wipe()
		return nil, err
	}
	c := &Conn{Profile: profile, d: d, key: kp, pub: pub}
	if err := c.mint(ctx); err != nil {
		kp.Wipe()
		return nil, err
	}
	inbox, err := space.InboxPrefix(pub)
	if err != nil {
		kp.Wipe()
		return nil, err
	}
	opts := append([]nats.Option{
		nats.Name(name),
		nats.UserJWT(func() (string, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.jwt, nil
		}, c.sign),
		nats.CustomInboxPrefix(inbox),
		nats.Timeout(5 * time.Second),
	}, d.Options...)
	if reconnect {
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	} else {
		opts = append(opts, nats.NoReconnect())
	}
	opts = append(opts, extra...)
	nc, err := nats.Connect(strings.Join(d.Brokers, ","), opts...)
	if err != nil {
		kp.Wipe()
		return nil, fmt.Errorf("evict: connect as %s: %w", profileName(profile), err)
	}
	c.Conn = nc
	return c, nil
}

func (c *Conn) sign(nonce []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key == nil {
		return nil, errors.New("evict: connection key wiped")
	}
	return c.key.Sign(nonce)
}

// mint asks signerd for a credential for the connection's key and checks it: the right subject,
// an exp, and for the observer the daemon's own account in its CONNZ row.
func (c *Conn) mint(ctx context.Context) error {
	req := &signerv1.MintRequest{Space: c.d.Space, Profile: c.Profile, UserPublicKey: c.pub}
	if c.Profile == signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER && c.d.TTL > 0 {
		req.Ttl = durationpb.New(c.d.TTL)
	}
	cred, err := c.d.Minter.Mint(ctx, req)
	if err != nil {
		return fmt.Errorf("evict: no %s credential from signerd: %w", profileName(c.Profile), err)
	}
	uc, err := jwt.DecodeUserClaims(cred.GetJwt())
	if err != nil || uc.Subject != c.pub || uc.Expires == 0 {
		return fmt.Errorf("evict: signerd's %s credential is not for this key or carries no exp", profileName(c.Profile))
	}
	if c.Profile == signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER {
		want, _ := space.SysAccountConnz(c.d.Account)
		if len(uc.Pub.Allow) != 1 || uc.Pub.Allow[0] != want {
			return fmt.Errorf("evict: the %s credential names another account than the daemon's own %s (tenancy check)", profileName(c.Profile), c.d.Account)
		}
	}
	c.mu.Lock()
	c.jwt = cred.GetJwt()
	c.Issued, c.Expires = time.Unix(uc.IssuedAt, 0), time.Unix(uc.Expires, 0)
	c.mu.Unlock()
	return nil
}

// Renew mints a fresh credential for the same key and moves the connection onto it.
func (c *Conn) Renew(ctx context.Context) error {
	if err := c.mint(ctx); err != nil {
		return err
	}
	return c.ForceReconnect()
}

// RenewAt is when the credential reaches 75% of its lifetime.
func (c *Conn) RenewAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.Issued.Add(c.Expires.Sub(c.Issued) * 3 / 4)
}

// Close closes the connection and wipes its key.
func (c *Conn) Close() {
	if c.Conn != nil {
		c.Conn.Close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.key != nil {
		c.key.Wipe()
		c.key = nil
	}
	c.jwt = ""
}

func profileName(p signerv1.Profile) string {
	switch p {
	case signerv1.Profile_PROFILE_MEMBERSHIP_OBSERVER:
		return "membership-observer"
	case signerv1.Profile_PROFILE_CONNECTION_EVICTOR:
		return "connection-evictor"
	default:
		return p.String()
	}
}
