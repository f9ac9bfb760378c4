// Package trust builds and checks a broker's NATS trust chain: the operator, the system account
// SYS, and per space a data account and a quarantined auth-callout account AUTH_<token>. It also
// renders the nats-server configuration (and the equivalent in-process options) that trusts them.
//
// Public facts (Broker, Space) and secret material are separate types, and the secrets are split
// by where they must live: OperatorIdentity and SpaceIdentity stay in the offline operator
// directory; SpaceSigning is the only set that goes to signerd. A function that wants signing
// material takes *SpaceSigning, so an operator or account identity seed cannot be handed to it by
// mistake. Nothing here writes files or logs; a rendered configuration never contains a seed.
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

// SystemAccountName is the name of the system account in its JWT.
const SystemAccountName = "SYS"

// OperatorNamePrefix prefixes the space token of the broker name in the operator JWT name.
const OperatorNamePrefix = "cotal-"

// Broker holds the public facts of a broker's trust root: the operator and the system account.
// It holds no seed. Build one with NewBroker or LoadBroker; the zero value is not usable.
type Broker struct {
	operatorJWT string
	operator    *jwt.OperatorClaims
	sysJWT      string
	sys         *jwt.AccountClaims
}

// OperatorIdentity is the operator's secret material. It never leaves the offline operator
// directory: it signs account JWTs (init, --add-space, rotation) and nothing else.
type OperatorIdentity struct {
	// Operator is the operator identity seed (SO…). It signs only the operator JWT.
	Operator *creds.Seed
	// OperatorSigning is the operator signing seed (SO…). It signs every account JWT.
	OperatorSigning *creds.Seed
	// SystemAccount is the identity seed (SA…) of the system account SYS.
	SystemAccount *creds.Seed
	// SystemSigning is the signing seed (SA…) of SYS, set only by NewBroker: it is the one seed
	// of this set that goes to signerd (setup writes it into the signer directory), where it
	// signs the delivery daemon's two $SYS users (membership observer, connection evictor).
	// LoadBroker's callers leave it nil; Verify checks it only when set.
	SystemSigning *creds.Seed
}

// NewBroker creates an operator named OperatorNamePrefix+space.Token(name) with one signing key,
// StrictSigningKeyUsage set (so only signing keys sign accounts and users), and a system account
// SYS with JetStream off whose JWT is signed by the operator signing key. It refuses a name that
// space.ValidateName refuses.
func NewBroker(name string) (*Broker, *OperatorIdentity, error) {
	if err := space.ValidateName(name); err != nil {
		return nil, nil, fmt.Errorf("trust: broker name: %w", err)
	}
	opKP, opPub, err := newKey(nkeys.CreateOperator)
	if err != nil {
		return nil, nil, err
	}
	defer opKP.Wipe()
	opSKP, opSPub, err := newKey(nkeys.CreateOperator)
	if err != nil {
		return nil, nil, err
	}
	defer opSKP.Wipe()
	sysKP, sysPub, err := newKey(nkeys.CreateAccount)
	if err != nil {
		return nil, nil, err
	}
	defer sysKP.Wipe()
	sysSKP, sysSPub, err := newKey(nkeys.CreateAccount)
	if err != nil {
		return nil, nil, err
	}
	defer sysSKP.Wipe()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = OperatorNamePrefix + space.Token(name)
	oc.SigningKeys.Add(opSPub)
	oc.StrictSigningKeyUsage = true
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(opKP)
	if err != nil {
		return nil, nil, fmt.Errorf("trust: encode operator JWT: %w", err)
	}

	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = SystemAccountName
	sc.SigningKeys.Add(sysSPub)
	// NewAccountClaims leaves JetStream disabled (zero storage limits); SYS must not have it.
	sysJWT, err := sc.Encode(opSKP)
	if err != nil {
		return nil, nil, fmt.Errorf("trust: encode system account JWT: %w", err)
	}

	b, err := LoadBroker(opJWT, sysJWT)
	if err != nil {
		return nil, nil, err
	}
	id := &OperatorIdentity{}
	if id.Operator, err = creds.SeedFromKeyPair(opKP); err != nil {
		return nil, nil, err
	}
	if id.OperatorSigning, err = creds.SeedFromKeyPair(opSKP); err != nil {
		id.Wipe()
		return nil, nil, err
	}
	if id.SystemAccount, err = creds.SeedFromKeyPair(sysKP); err != nil {
		id.Wipe()
		return nil, nil, err
	}
	if id.SystemSigning, err = creds.SeedFromKeyPair(sysSKP); err != nil {
		id.Wipe()
		return nil, nil, err
	}
	return b, id, nil
}

// LoadBroker rebuilds a Broker from its two public JWTs (for --add-space and for rendering a
// configuration later). It refuses an operator JWT that is not self-signed, has no signing key,
// or names no system account; and a system account JWT that is not that account or is not signed
// by one of the operator's signing keys (or, without strict signing-key usage, the operator).
func LoadBroker(operatorJWT, systemAccountJWT string) (*Broker, error) {
	oc, err := jwt.DecodeOperatorClaims(operatorJWT)
	if err != nil {
		return nil, fmt.Errorf("trust: operator JWT: %w", err)
	}
	if err := validateClaims("operator JWT", oc); err != nil {
		return nil, err
	}
	if oc.Issuer != oc.Subject {
		return nil, fmt.Errorf("trust: operator JWT of %s is issued by %s, want self-signed", oc.Subject, oc.Issuer)
	}
	if len(oc.SigningKeys) == 0 {
		return nil, fmt.Errorf("trust: operator %s has no signing key", oc.Subject)
	}
	if err := canonicalKeys("operator JWT", nkeys.PrefixByteOperator, append([]string{oc.Subject, oc.Issuer}, oc.SigningKeys...)...); err != nil {
		return nil, err
	}
	if !nkey.IsAccount(oc.SystemAccount) {
		return nil, fmt.Errorf("trust: operator %s names no valid system account", oc.Subject)
	}
	b := &Broker{operatorJWT: operatorJWT, operator: oc}
	sc, err := b.decodeAccount(systemAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("trust: system account: %w", err)
	}
	if sc.Subject != oc.SystemAccount {
		return nil, fmt.Errorf("trust: system account JWT is for %s, operator names %s", sc.Subject, oc.SystemAccount)
	}
	b.sysJWT, b.sys = systemAccountJWT, sc
	return b, nil
}

// decodeAccount decodes an account JWT and refuses it unless this broker's operator signed it.
func (b *Broker) decodeAccount(accountJWT string) (*jwt.AccountClaims, error) {
	ac, err := jwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return nil, fmt.Errorf("account JWT: %w", err)
	}
	if err := validateClaims("account JWT of "+ac.Subject, ac); err != nil {
		return nil, err
	}
	if err := canonicalKeys("account JWT", nkeys.PrefixByteAccount, append([]string{ac.Subject}, ac.SigningKeys.Keys()...)...); err != nil {
		return nil, err
	}
	if !b.signedByOperator(ac.Issuer) {
		return nil, &ForeignAccountError{Account: ac.Subject, Name: ac.Name, Issuer: ac.Issuer, Operator: b.operator.Subject}
	}
	return ac, nil
}

// signedByOperator reports whether issuer may sign accounts for this operator, applying the
// same rule as nats-server: a signing key, or the identity key unless usage is strict.
func (b *Broker) signedByOperator(issuer string) bool {
	if b.operator.SigningKeys.Contains(issuer) {
		return true
	}
	return !b.operator.StrictSigningKeyUsage && issuer == b.operator.Subject
}

// Name returns the operator's name (OperatorNamePrefix + token).
func (b *Broker) Name() string { return b.operator.Name }

// OperatorPublicKey returns the operator identity public key (O…).
func (b *Broker) OperatorPublicKey() string { return b.operator.Subject }

// OperatorSigningKeys returns the operator signing public keys, sorted.
func (b *Broker) OperatorSigningKeys() []string {
	ks := slices.Clone([]string(b.operator.SigningKeys))
	slices.Sort(ks)
	return ks
}

// OperatorJWT returns the operator JWT. It is public: it goes into the server configuration.
func (b *Broker) OperatorJWT() string { return b.operatorJWT }

// SystemAccountPublicKey returns the public key (A…) of the system account SYS.
func (b *Broker) SystemAccountPublicKey() string { return b.sys.Subject }

// SystemSigningKeys returns the system account's signing public keys, sorted; empty for a broker
// created before SYS had one (its $SYS users cannot be minted by signerd).
func (b *Broker) SystemSigningKeys() []string {
	ks := b.sys.SigningKeys.Keys()
	slices.Sort(ks)
	return ks
}

// SystemAccountJWT returns the system account JWT.
func (b *Broker) SystemAccountJWT() string { return b.sysJWT }

// Verify checks that the seeds are present and belong to b: the identity seed is the operator,
// the signing seed is one of its signing keys, and the system account seed is SYS. It returns a
// *KeyMismatchError naming the role that does not match.
func (o *OperatorIdentity) Verify(b *Broker) error {
	if o == nil {
		return &KeyMismatchError{Role: "operator identity", Reason: "missing"}
	}
	if err := checkSeed("operator identity", o.Operator, nkeys.PrefixByteOperator, b.OperatorPublicKey()); err != nil {
		return err
	}
	if err := checkSeed("operator signing", o.OperatorSigning, nkeys.PrefixByteOperator, b.OperatorSigningKeys()...); err != nil {
		return err
	}
	if err := checkSeed("system account identity", o.SystemAccount, nkeys.PrefixByteAccount, b.SystemAccountPublicKey()); err != nil {
		return err
	}
	if o.SystemSigning != nil {
		return checkSeed("system account signing", o.SystemSigning, nkeys.PrefixByteAccount, b.SystemSigningKeys()...)
	}
	return nil
}

// Wipe zeroes every seed.
func (o *OperatorIdentity) Wipe() {
	if o == nil {
		return
	}
	o.Operator.Wipe()
	o.OperatorSigning.Wipe()
	o.SystemAccount.Wipe()
	o.SystemSigning.Wipe()
}

// checkSeed refuses a seed that is missing, of the wrong kind, or not one of want. It decodes
// the seed once.
func checkSeed(role string, s *creds.Seed, kind nkeys.PrefixByte, want ...string) error {
	pub, err := s.Public()
	if err != nil {
		return &KeyMismatchError{Role: role, Reason: err.Error()}
	}
	return checkPublic(role, pub, kind, want...)
}

// checkPublic refuses a public key, derived from a seed of role, that is of the wrong kind or
// not one of want.
func checkPublic(role, pub string, kind nkeys.PrefixByte, want ...string) error {
	if p := nkeys.Prefix(pub); p != kind {
		return &KeyMismatchError{Role: role, Reason: fmt.Sprintf("seed is a %s key, want %s", p, kind)}
	}
	if !slices.Contains(want, pub) {
		return &KeyMismatchError{Role: role, Got: pub, Want: want}
	}
	return nil
}

// newKey creates a key pair with create and returns it with its public key.
func newKey(create func() (nkeys.KeyPair, error)) (nkeys.KeyPair, string, error) {
	kp, err := create()
	if err != nil {
		return nil, "", fmt.Errorf("trust: create key: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		kp.Wipe()
		return nil, "", fmt.Errorf("trust: public key: %w", err)
	}
	return kp, pub, nil
}

// keyPair decodes a seed checked by checkSeed into a key pair; the caller wipes it.
func keyPair(role string, s *creds.Seed) (nkeys.KeyPair, error) {
	kp, err := s.KeyPair()
	if err != nil {
		return nil, &KeyMismatchError{Role: role, Reason: err.Error()}
	}
	return kp, nil
}

// validateClaims runs the jwt library's own validation and refuses blocking issues and time
// checks (expired, not yet valid, malformed keys).
// canonicalKeys refuses any key that is not the canonical spelling of a public key with prefix
// (see pkg/nkey): every key these files carry is compared as a string later.
func canonicalKeys(what string, prefix nkeys.PrefixByte, keys ...string) error {
	for _, k := range keys {
		if err := nkey.Check(k, prefix); err != nil {
			return fmt.Errorf("trust: %s: %w", what, err)
		}
	}
	return nil
}

func validateClaims(what string, c interface{ Validate(*jwt.ValidationResults) }) error {
	vr := jwt.CreateValidationResults()
	c.Validate(vr)
	for _, i := range vr.Issues {
		if i.Blocking || i.TimeCheck {
			return fmt.Errorf("trust: %s: %s", what, i.Description)
		}
	}
	return nil
}
