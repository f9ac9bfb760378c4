package signerclient

import "github.com/nats-io/jwt/v2"

// Account is the account of the credential in use: its issuer_account, or its issuer when the
// account key signed it itself. It is "" before Start. A host that was assigned an account
// compares it with this after Start, before it connects with the rail.
func (r *Rail) Account() string {
	c := r.cur.Load()
	if c == nil {
		return ""
	}
	if c.account != "" {
		return c.account
	}
	uc, err := jwt.DecodeUserClaims(c.jwt) // accept decoded it once already
	if err != nil {
		return ""
	}
	if uc.IssuerAccount != "" {
		return uc.IssuerAccount
	}
	return uc.Issuer
}
