package trust

import (
	"fmt"
	"slices"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/nkey"
	"github.com/cotalgo/cotal/pkg/space"
)

// AuthAccountPrefix prefixes the space token in the name of a space's callout account.
const AuthAccountPrefix = "AUTH_"

// Space holds the public facts of one space's two accounts, all read from their JWTs: the data
// account (named by the space token, JetStream on) and the quarantined callout account
// AUTH_<token> (JetStream off, external authorization). It holds no seed.
type Space struct {
	name    string
	dataJWT string
	data    *jwt.AccountClaims
	authJWT string
	auth    *jwt.AccountClaims
}

// SpaceIdentity is a space's account identity seeds. They stay in the offline operator directory
// with the OperatorIdentity: they are needed only to re-issue the account JWTs (rotation), never
// to sign users.
type SpaceIdentity struct {
	// DataAccount is the data account identity seed (SA…).
	DataAccount *creds.Seed
	// AuthAccount is the callout account identity seed (SA…).
	AuthAccount *creds.Seed
}

// SpaceSigning is a space's signing material: the only secrets that go to signerd.
type SpaceSigning struct {
	// DataSigning is the data account signing seed (SA…); it signs every data-account user.
	DataSigning *creds.Seed
	// AuthSigning is the callout account signing seed (SA…); it signs the callout-service and
	// sentinel users and the authorization responses.
	AuthSigning *creds.Seed
	// XKey is the callout curve seed (SX…) that opens the server's sealed callout requests.
	XKey *creds.Seed
}

// NewSpace creates the two accounts of space name on broker b, both signed by the operator
// signing key in op:
//   - the data account: identity key plus one signing key, named space.Token(name), JetStream
//     enabled with unlimited (-1) limits;
//   - the callout account AUTH_<token>: identity key plus its own signing key, JetStream off,
//     authorization with auth_users = calloutUsers, allowed_accounts = the data account, and a
//     new xkey.
//
// calloutUsers are the user public keys allowed to answer callouts (authd's service users); at
// least one is required, each must be a valid user public key, and none may repeat. NewSpace
// refuses an op that does not belong to b and a name space.ValidateName refuses.
func NewSpace(b *Broker, op *OperatorIdentity, name string, calloutUsers []string) (*Space, *SpaceIdentity, *SpaceSigning, error) {
	if err := op.Verify(b); err != nil {
		return nil, nil, nil, err
	}
	if err := space.ValidateName(name); err != nil {
		return nil, nil, nil, fmt.Errorf("trust: %w", err)
	}
	if err := validateCalloutUsers(name, calloutUsers); err != nil {
		return nil, nil, nil, err
	}
	opSKP, err := keyPair("operator signing", op.OperatorSigning)
	if err != nil {
		return nil, nil, nil, err
	}
	defer opSKP.Wipe()

	token := space.Token(name)
	var kps []nkeys.KeyPair
	defer func() {
		for _, kp := range kps {
			kp.Wipe()
		}
	}()
	mk := func(create func() (nkeys.KeyPair, error)) (string, error) {
		kp, pub, err := newKey(create)
		if err != nil {
			return "", err
		}
		kps = append(kps, kp)
		return pub, nil
	}
	dataPub, err := mk(nkeys.CreateAccount)
	if err != nil {
		return nil, nil, nil, err
	}
	dataSPub, err := mk(nkeys.CreateAccount)
	if err != nil {
		return nil, nil, nil, err
	}
	authPub, err := mk(nkeys.CreateAccount)
	if err != nil {
		return nil, nil, nil, err
	}
	authSPub, err := mk(nkeys.CreateAccount)
	if err != nil {
		return nil, nil, nil, err
	}
	xPub, err := mk(nkeys.CreateCurveKeys)
	if err != nil {
		return nil, nil, nil, err
	}
	dataKP, dataSKP, authKP, authSKP, xKP := kps[0], kps[1], kps[2], kps[3], kps[4]

	dc := jwt.NewAccountClaims(dataPub)
	dc.Name = token
	dc.SigningKeys.Add(dataSPub)
	dc.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit,
		DiskStorage:   jwt.NoLimit,
		Streams:       jwt.NoLimit,
		Consumer:      jwt.NoLimit,
		MaxAckPending: jwt.NoLimit,
	}
	dataJWT, err := dc.Encode(opSKP)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("trust: encode data account JWT: %w", err)
	}

	ac := jwt.NewAccountClaims(authPub)
	ac.Name = AuthAccountPrefix + token
	ac.SigningKeys.Add(authSPub)
	// JetStream stays off (NewAccountClaims default): the callout account only carries callouts.
	ac.EnableExternalAuthorization(calloutUsers...)
	ac.Authorization.AllowedAccounts.Add(dataPub)
	ac.Authorization.XKey = xPub
	authJWT, err := ac.Encode(opSKP)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("trust: encode callout account JWT: %w", err)
	}

	sp, err := LoadSpace(b, name, dataJWT, authJWT)
	if err != nil {
		return nil, nil, nil, err
	}
	seeds := make([]*creds.Seed, 0, len(kps))
	for _, kp := range []nkeys.KeyPair{dataKP, authKP, dataSKP, authSKP, xKP} {
		s, err := creds.SeedFromKeyPair(kp)
		if err != nil {
			for _, s := range seeds {
				s.Wipe()
			}
			return nil, nil, nil, err
		}
		seeds = append(seeds, s)
	}
	id := &SpaceIdentity{DataAccount: seeds[0], AuthAccount: seeds[1]}
	sg := &SpaceSigning{DataSigning: seeds[2], AuthSigning: seeds[3], XKey: seeds[4]}
	return sp, id, sg, nil
}

func validateCalloutUsers(name string, users []string) error {
	if len(users) == 0 {
		return &SpaceError{Space: name, Reason: "at least one callout user public key is required"}
	}
	for i, u := range users {
		if !nkey.IsUser(u) {
			return &SpaceError{Space: name, Reason: fmt.Sprintf("callout user %q is not a user public key", u)}
		}
		if slices.Contains(users[:i], u) {
			return &SpaceError{Space: name, Reason: fmt.Sprintf("callout user %s is listed twice", u)}
		}
	}
	return nil
}

// LoadSpace rebuilds the public facts of space name from its two account JWTs, checking them
// against broker b. It refuses accounts not signed by b's operator (*ForeignAccountError), and
// accounts without the shape NewSpace gives them (*SpaceError): the data account must be named
// space.Token(name), have a signing key and JetStream, and no external authorization (its users
// would otherwise be sent to the callout); the callout account must be named AUTH_<token>, have
// a signing key, no JetStream, at least one auth user, exactly the data account as allowed
// account, and an xkey.
func LoadSpace(b *Broker, name, dataAccountJWT, authAccountJWT string) (*Space, error) {
	if err := space.ValidateName(name); err != nil {
		return nil, fmt.Errorf("trust: %w", err)
	}
	token := space.Token(name)
	dc, err := b.decodeAccount(dataAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("trust: space %q data %w", name, err)
	}
	ac, err := b.decodeAccount(authAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("trust: space %q callout %w", name, err)
	}
	bad := func(format string, args ...any) error {
		return &SpaceError{Space: name, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case dc.Name != token:
		return nil, bad("data account is named %q, want %q", dc.Name, token)
	case len(dc.SigningKeys) == 0:
		return nil, bad("data account %s has no signing key", dc.Subject)
	case !dc.Limits.IsJSEnabled():
		return nil, bad("data account %s has JetStream disabled", dc.Subject)
	case dc.Authorization.IsEnabled() || len(dc.Authorization.AllowedAccounts) > 0 || dc.Authorization.XKey != "":
		return nil, bad("data account %s has external authorization", dc.Subject)
	case ac.Name != AuthAccountPrefix+token:
		return nil, bad("callout account is named %q, want %q", ac.Name, AuthAccountPrefix+token)
	case ac.Subject == dc.Subject:
		return nil, bad("callout account and data account are the same key %s", ac.Subject)
	case ac.Subject == b.SystemAccountPublicKey() || dc.Subject == b.SystemAccountPublicKey():
		return nil, bad("space account is the system account")
	case len(ac.SigningKeys) == 0:
		return nil, bad("callout account %s has no signing key", ac.Subject)
	case ac.Limits.IsJSEnabled():
		return nil, bad("callout account %s has JetStream enabled", ac.Subject)
	case len(ac.Authorization.AuthUsers) == 0:
		return nil, bad("callout account %s has no auth users", ac.Subject)
	case len(ac.Authorization.AllowedAccounts) != 1 || ac.Authorization.AllowedAccounts[0] != dc.Subject:
		return nil, bad("callout account %s must allow exactly the data account %s, allows %v", ac.Subject, dc.Subject, []string(ac.Authorization.AllowedAccounts))
	case !nkey.IsCurve(ac.Authorization.XKey):
		return nil, bad("callout account %s has no xkey", ac.Subject)
	}
	if err := validateCalloutUsers(name, ac.Authorization.AuthUsers); err != nil {
		return nil, err
	}
	return &Space{name: name, dataJWT: dataAccountJWT, data: dc, authJWT: authAccountJWT, auth: ac}, nil
}

// Name returns the space name.
func (s *Space) Name() string { return s.name }

// Token returns the space's wire token (the data account name).
func (s *Space) Token() string { return s.data.Name }

// DataAccountPublicKey returns the data account identity public key (A…).
func (s *Space) DataAccountPublicKey() string { return s.data.Subject }

// DataAccountJWT returns the data account JWT.
func (s *Space) DataAccountJWT() string { return s.dataJWT }

// DataSigningKeys returns the data account signing public keys, sorted.
func (s *Space) DataSigningKeys() []string { return sortedKeys(s.data.SigningKeys) }

// AuthAccountName returns the callout account name, AUTH_<token>.
func (s *Space) AuthAccountName() string { return s.auth.Name }

// AuthAccountPublicKey returns the callout account identity public key (A…).
func (s *Space) AuthAccountPublicKey() string { return s.auth.Subject }

// AuthAccountJWT returns the callout account JWT.
func (s *Space) AuthAccountJWT() string { return s.authJWT }

// AuthSigningKeys returns the callout account signing public keys, sorted.
func (s *Space) AuthSigningKeys() []string { return sortedKeys(s.auth.SigningKeys) }

// XKey returns the callout curve public key (X…) the server seals callout requests to.
func (s *Space) XKey() string { return s.auth.Authorization.XKey }

// CalloutUsers returns the user public keys registered as auth_users: the only users of the
// callout account that bypass the callout and may answer it.
func (s *Space) CalloutUsers() []string {
	return slices.Clone([]string(s.auth.Authorization.AuthUsers))
}

func sortedKeys(sk jwt.SigningKeys) []string {
	ks := sk.Keys()
	slices.Sort(ks)
	return ks
}

// Verify checks that the identity seeds are present and are sp's two account keys.
func (id *SpaceIdentity) Verify(sp *Space) error {
	if id == nil {
		return &KeyMismatchError{Role: "space identity", Reason: "missing"}
	}
	if err := checkSeed("data account identity", id.DataAccount, nkeys.PrefixByteAccount, sp.DataAccountPublicKey()); err != nil {
		return err
	}
	return checkSeed("callout account identity", id.AuthAccount, nkeys.PrefixByteAccount, sp.AuthAccountPublicKey())
}

// Wipe zeroes both seeds.
func (id *SpaceIdentity) Wipe() {
	if id == nil {
		return
	}
	id.DataAccount.Wipe()
	id.AuthAccount.Wipe()
}

// Verify checks that the signing seeds are present and belong to sp: a data signing key, a
// callout signing key, and the callout xkey. signerd should call it at start-up so a key
// directory from another space or broker is refused.
func (sg *SpaceSigning) Verify(sp *Space) error {
	if sg == nil {
		return &KeyMismatchError{Role: "space signing", Reason: "missing"}
	}
	if err := checkSeed("data signing", sg.DataSigning, nkeys.PrefixByteAccount, sp.DataSigningKeys()...); err != nil {
		return err
	}
	if err := checkSeed("callout signing", sg.AuthSigning, nkeys.PrefixByteAccount, sp.AuthSigningKeys()...); err != nil {
		return err
	}
	return checkSeed("callout xkey", sg.XKey, nkeys.PrefixByteCurve, sp.XKey())
}

// VerifySigningKeys is Verify for keys already derived from the signing seeds, given by their
// public keys: dataSigning and authSigning must be signing keys of sp's data and callout
// accounts, xkey its callout xkey. signerd's key store derives each key once and checks the
// derived keys here, so it never decodes a seed a second time just to compare public keys.
func (sp *Space) VerifySigningKeys(dataSigning, authSigning, xkey string) error {
	if err := checkPublic("data signing", dataSigning, nkeys.PrefixByteAccount, sp.DataSigningKeys()...); err != nil {
		return err
	}
	if err := checkPublic("callout signing", authSigning, nkeys.PrefixByteAccount, sp.AuthSigningKeys()...); err != nil {
		return err
	}
	return checkPublic("callout xkey", xkey, nkeys.PrefixByteCurve, sp.XKey())
}

// Wipe zeroes every seed.
func (sg *SpaceSigning) Wipe() {
	if sg == nil {
		return
	}
	sg.DataSigning.Wipe()
	sg.AuthSigning.Wipe()
	sg.XKey.Wipe()
}
