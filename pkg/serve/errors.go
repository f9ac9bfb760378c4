package serve

import (
	"errors"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// EpEnvelopeError is a refusal in the authority envelope's vocabulary: Code is one of
// serviceaccess's denial codes (serviceaccess.CodePermissionDenied, ...). Message is a fixed
// sentence; it never holds token text.
type EpEnvelopeError struct {
	Code    string
	Message string
}

func (e *EpEnvelopeError) Error() string {
	if e.Message == "" {
		return "serve: " + e.Code
	}
	return "serve: " + e.Code + ": " + e.Message
}

// ServiceAccessNotYetValidError is a signed access bearer issued more than
// serviceaccess.IssuedAtTolerance (five seconds) ahead of the process clock. It unwraps to an
// *EpEnvelopeError with code permission-denied and to serviceaccess.ErrNotYetValid, so a caller
// tells this clock refusal from a transport failure with errors.As, not by parsing text. It
// carries no bearer material.
type ServiceAccessNotYetValidError struct{}

func (e *ServiceAccessNotYetValidError) Error() string {
	return "serve: permission-denied: the service access bearer was issued more than 5 s ahead of the process clock"
}

// Unwrap returns the envelope error (permission-denied) and serviceaccess.ErrNotYetValid.
func (e *ServiceAccessNotYetValidError) Unwrap() []error {
	return []error{
		&EpEnvelopeError{Code: serviceaccess.CodePermissionDenied, Message: "the service access bearer is not valid yet"},
		serviceaccess.ErrNotYetValid,
	}
}

// Grant refusals (GrantError.Refusal). They are stable: callers and tests compare them.
const (
	RefuseAuthenticity  = "authenticity"   // the authenticity is the zero value (not from ServeAuthenticityOf)
	RefuseAccount       = "account"        // another account
	RefuseResult        = "result"         // not a credential answer, or no access bearer in it
	RefuseRegistration  = "registration"   // the embedded registration is malformed
	RefuseIssuer        = "issuer"         // a bearer from another issuer
	RefuseSpace         = "space"          // another space
	RefuseSubject       = "subject"        // another subject (owner)
	RefuseKey           = "key"            // a kid the authority does not publish, or another key's signature
	RefuseWitness       = "witness"        // another witness
	RefuseDuty          = "duty"           // no serve duty
	RefuseEndpoint      = "endpoint"       // a bearer for another endpoint or instance
	RefuseRoot          = "root"           // a bearer under another root
	RefuseClosures      = "closures"       // a closure set that is not the embedded one
	RefuseArtifact      = "artifact"       // an artifact that is not the embedded one
	RefuseClosureDigest = "closure-digest" // a closure that does not read at its digest (or breaks the contract rules)
	RefuseBearer        = "bearer"         // any other refusal of the bearer (format, typ, lifetime, expiry, ...)
)

// GrantError is a refused grant or bearer: Refusal is one of the Refuse* constants, Err the
// cause (a *serviceaccess.TokenError for a refused bearer). Neither holds token text.
type GrantError struct {
	Refusal string
	Err     error
}

func (e *GrantError) Error() string {
	if e.Err == nil {
		return "serve: serving grant refused: " + e.Refusal
	}
	return "serve: serving grant refused: " + e.Refusal + ": " + e.Err.Error()
}

func (e *GrantError) Unwrap() error { return e.Err }

func refuse(refusal string, err error) error { return &GrantError{Refusal: refusal, Err: err} }

func refusef(refusal, msg string) error { return &GrantError{Refusal: refusal, Err: errors.New(msg)} }
