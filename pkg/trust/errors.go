package trust

import (
	"fmt"
	"strings"
)

// ForeignAccountError reports an account JWT that this broker's operator did not sign (neither
// with a signing key nor, when usage is not strict, with its identity key). nats-server would
// refuse such an account at run time; we refuse it when building or rendering.
type ForeignAccountError struct {
	Account  string // the account public key (JWT subject)
	Name     string // the account name in the JWT
	Issuer   string // who signed it
	Operator string // this broker's operator public key
}

func (e *ForeignAccountError) Error() string {
	return fmt.Sprintf("trust: account %s (%q) is signed by %s, not by operator %s or its signing keys", e.Account, e.Name, e.Issuer, e.Operator)
}

// DuplicateAccountError reports two accounts with the same public key or the same name in one
// server configuration. Two spaces whose tokens collide cannot share a broker.
type DuplicateAccountError struct {
	Account string
	Name    string
}

func (e *DuplicateAccountError) Error() string {
	return fmt.Sprintf("trust: duplicate account %s (%q) in server configuration", e.Account, e.Name)
}

// KeyMismatchError reports secret material that does not belong to the public facts it is
// checked against: a seed of the wrong kind, missing, or for another key. Got and Want are public
// keys, never seeds.
type KeyMismatchError struct {
	Role   string
	Got    string
	Want   []string
	Reason string
}

func (e *KeyMismatchError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("trust: %s seed: %s", e.Role, e.Reason)
	}
	return fmt.Sprintf("trust: %s seed is for %s, want %s", e.Role, e.Got, strings.Join(e.Want, " or "))
}

// SpaceError reports a space account JWT that does not have the shape NewSpace gives it (name,
// JetStream, signing key, callout authorization).
type SpaceError struct {
	Space  string
	Reason string
}

func (e *SpaceError) Error() string {
	return fmt.Sprintf("trust: space %q: %s", e.Space, e.Reason)
}

// ConfigError reports a ServerConfig field that cannot be rendered safely.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("trust: server config %s: %s", e.Field, e.Reason)
}
