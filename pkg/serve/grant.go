package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
	"github.com/cotalgo/cotal/pkg/space"
)

// Registration is the service's own embedded registration: the endpoint and instance it serves,
// the contract (closures and artifacts) compiled into it, and the snapshot bytes its
// registered answer carried (the exact canonical bytes the witness hashes). The grant binds the
// closure to this contract, never to the bearer.
type Registration struct {
	Endpoint string
	Instance string
	Contract serviceaccess.Contract
	Snapshot []byte
}

// GrantInput is AuthorizeGuestServeGrant's input.
type GrantInput struct {
	// AccountPublicKey is the data account the service registered in.
	AccountPublicKey string
	// Result is the parsed credential answer (a renewal source's Credential).
	Result *serviceaccess.Answer
	// Registration is the service's own embedded registration.
	Registration Registration
	// Authenticity is ServeAuthenticityOf(info) of the pinned authority's answer.
	Authenticity Authenticity
	// Now is the process clock; time.Now when nil. The grant's Check uses it too.
	Now func() time.Time
}

// Grant is a verified serving grant: the endpoint instance an access bearer the pinned issuer
// signed lets this process serve. AuthorizeGuestServeGrant is its sole constructor; its fields
// are unexported so nothing else can brand one.
type Grant struct {
	account  string
	space    string
	issuer   string
	endpoint string
	epTok    string
	instance string
	owner    string
	witness  string
	root     string
	exp      time.Time
	v        *serviceaccess.Validator
}

// Endpoint is the dotted endpoint name the grant serves.
func (g *Grant) Endpoint() string { return g.endpoint }

// Instance is the instance id the grant serves.
func (g *Grant) Instance() string { return g.instance }

// Owner is the registration's owner (the bearers' sub).
func (g *Grant) Owner() string { return g.owner }

// Witness is the registration's witness.
func (g *Grant) Witness() string { return g.witness }

// Root is the activation root the bearers name.
func (g *Grant) Root() string { return g.root }

// Space is the space the grant serves in.
func (g *Grant) Space() string { return g.space }

// Exp is the authorized access bearer's expiry.
func (g *Grant) Exp() time.Time { return g.exp }

// AuthorizeGuestServeGrant verifies a credential answer's access bearer under the pinned
// authenticity and binds it to the service's embedded registration; it is the sole
// constructor of a Grant. See the package doc for what it refuses; a refusal is a *GrantError,
// except a bearer issued more than five seconds ahead of the clock, which is a
// *ServiceAccessNotYetValidError.
func AuthorizeGuestServeGrant(in GrantInput) (*Grant, error) {
	if in.Authenticity.zero() {
		return nil, refusef(RefuseAuthenticity, "no pinned issuer and keys (use ServeAuthenticityOf)")
	}
	auth := in.Authenticity
	if in.AccountPublicKey == "" || in.AccountPublicKey != auth.account {
		return nil, refusef(RefuseAccount, "the authority serves another account")
	}
	reg := in.Registration
	epTok, err := serviceaccess.EndpointTokenOf(reg.Endpoint)
	if err != nil {
		return nil, refuse(RefuseRegistration, err)
	}
	if err := space.ValidateUID(reg.Instance); err != nil {
		return nil, refuse(RefuseRegistration, err)
	}
	loose, err := looseSnapshot(reg.Snapshot)
	if err != nil {
		return nil, refuse(RefuseRegistration, err)
	}
	switch {
	case loose.Account != in.AccountPublicKey:
		return nil, refusef(RefuseAccount, "the registered snapshot names another account")
	case loose.Space != auth.space:
		return nil, refusef(RefuseSpace, "the registered snapshot names another space")
	case loose.Endpoint != reg.Endpoint || loose.Instance != reg.Instance:
		return nil, refusef(RefuseEndpoint, "the registered snapshot names another endpoint instance")
	}
	// The embedded contract must hold by itself: every closure read at its digest.
	if _, err := reg.Contract.Check(reg.Endpoint); err != nil {
		return nil, refuse(RefuseClosureDigest, err)
	}
	// The registered contract is compared with the embedded one before the snapshot is parsed
	// closed, so a foreign closure set or artifact is named as such.
	if err := sameContract(loose.Contract, reg.Contract); err != nil {
		return nil, err
	}
	snap, err := serviceaccess.ParseSnapshot(reg.Snapshot)
	if err != nil {
		return nil, refuse(RefuseRegistration, err)
	}
	witness := serviceaccess.WitnessOf(reg.Snapshot)

	res := in.Result
	switch {
	case res == nil || res.Kind != serviceaccess.AnswerCredential:
		return nil, refusef(RefuseResult, "not a credential answer")
	case res.Access == nil || res.Access.Token == "":
		return nil, refusef(RefuseResult, "the credential answer carries no access bearer")
	case res.Witness != witness:
		return nil, refusef(RefuseWitness, "the credential names another witness than the embedded registration's")
	case !serviceaccess.ValidRoot(res.Root):
		return nil, refusef(RefuseResult, "the credential's root is not a root id")
	}
	now := in.Now
	if now == nil {
		now = time.Now
	}
	g := &Grant{
		account:  in.AccountPublicKey,
		space:    auth.space,
		issuer:   auth.issuer,
		endpoint: reg.Endpoint,
		epTok:    epTok,
		instance: reg.Instance,
		owner:    snap.Owner,
		witness:  witness,
		root:     res.Root,
		v:        &serviceaccess.Validator{Space: auth.space, Keys: serviceaccess.StaticKeys(auth.keys), Now: now},
	}
	c, err := g.check(res.Access.Token)
	if err != nil {
		return nil, err
	}
	if c.Exp != res.Access.Exp {
		return nil, refusef(RefuseResult, "the credential's access expiry is not its bearer's")
	}
	g.exp = time.Unix(c.Exp, 0)
	return g, nil
}

// Check verifies a later access bearer for this grant: a valid signature under the pinned keys,
// the closed claims, and the grant's issuer, space, subject, witness, endpoint, instance, root
// and serve duty. It refuses like AuthorizeGuestServeGrant.
func (g *Grant) Check(token string) error {
	_, err := g.check(token)
	return err
}

func (g *Grant) check(token string) (*serviceaccess.AccessClaims, error) {
	if g == nil || g.v == nil {
		return nil, refusef(RefuseAuthenticity, "no grant")
	}
	c, err := g.v.Access(context.Background(), token)
	if err != nil {
		return nil, classify(err)
	}
	switch {
	case c.Iss != g.issuer:
		return nil, refusef(RefuseIssuer, "the bearer is from another issuer")
	case c.Aud != g.space:
		return nil, refusef(RefuseSpace, "the bearer is for another space")
	case c.Sub != g.owner:
		return nil, refusef(RefuseSubject, "the bearer names another subject")
	case c.Duty != serviceaccess.DutyServe:
		return nil, refusef(RefuseDuty, "the bearer carries no serve duty")
	case c.Wit != g.witness:
		return nil, refusef(RefuseWitness, "the bearer names another witness")
	case c.Ep != g.endpoint || c.Iid != g.instance:
		return nil, refusef(RefuseEndpoint, "the bearer names another endpoint instance")
	case c.Root != g.root:
		return nil, refusef(RefuseRoot, "the bearer names another root")
	}
	return c, nil
}

// classify maps a validator refusal to a grant refusal; a bearer issued ahead of the clock is a
// *ServiceAccessNotYetValidError.
func classify(err error) error {
	if errors.Is(err, serviceaccess.ErrNotYetValid) {
		return &ServiceAccessNotYetValidError{}
	}
	var te *serviceaccess.TokenError
	if errors.As(err, &te) {
		switch te.Check {
		case serviceaccess.CheckIss:
			return refuse(RefuseIssuer, err)
		case serviceaccess.CheckAud:
			return refuse(RefuseSpace, err)
		case serviceaccess.CheckSub:
			return refuse(RefuseSubject, err)
		case serviceaccess.CheckKID, serviceaccess.CheckSignature:
			return refuse(RefuseKey, err)
		case serviceaccess.CheckPurpose:
			return refuse(RefuseDuty, err)
		}
	}
	return refuse(RefuseBearer, err)
}

// looseSnapshot decodes the registered snapshot for its contract only; ParseSnapshot then
// checks it closed.
func looseSnapshot(b []byte) (*serviceaccess.Snapshot, error) {
	if len(b) == 0 {
		return nil, errors.New("serve: the registration holds no snapshot")
	}
	var s serviceaccess.Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, errors.New("serve: the registered snapshot does not parse")
	}
	return &s, nil
}

// sameContract refuses a registered contract whose closure set or artifacts are not the
// embedded ones.
func sameContract(got, want serviceaccess.Contract) error {
	if len(got.Closures) != len(want.Closures) {
		return refusef(RefuseClosures, "the registered closure set is not the embedded one")
	}
	for i := range got.Closures {
		if got.Closures[i] != want.Closures[i] {
			return refusef(RefuseClosures, "the registered closure set is not the embedded one")
		}
	}
	if len(got.Artifacts) != len(want.Artifacts) {
		return refusef(RefuseArtifact, "the registered artifacts are not the embedded ones")
	}
	for i := range got.Artifacts {
		if got.Artifacts[i].Digest != want.Artifacts[i].Digest || !bytes.Equal(got.Artifacts[i].Bytes, want.Artifacts[i].Bytes) {
			return refusef(RefuseArtifact, "the registered artifacts are not the embedded ones")
		}
	}
	return nil
}
