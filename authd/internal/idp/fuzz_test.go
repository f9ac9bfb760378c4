package idp

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzDecode feeds arbitrary strings to the IdP token decoder and the claim checks: nothing may
// panic, and a token that passes must have had its header rules and claims hold.
func FuzzDecode(f *testing.F) {
	f.Add("eyJhbGciOiJFZERTQSIsImtpZCI6ImsifQ.eyJpc3MiOiJodHRwOi8vMTI3LjAuMC4xIiwiYXVkIjoiaHR0cDovLzEyNy4wLjAuMSIsInN1YiI6InUiLCJpYXQiOjEsImV4cCI6OTk5OTk5OTk5OX0.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Add("a.b.c")
	f.Add("..")
	f.Add("eyJhbGciOiJFZERTQSIsImtpZCI6ImsiLCJqa3UiOiJ4In0.e30.AA")
	pin, err := NewPin("http://127.0.0.1")
	if err != nil {
		f.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, token string) {
		p, err := decode(token)
		if err != nil {
			return
		}
		if p.kid == "" || len(p.sig) != 64 {
			t.Fatalf("decode accepted kid %q, signature of %d bytes", p.kid, len(p.sig))
		}
		c, err := checkClaims(pin, p.claims, now)
		if err != nil {
			return
		}
		var iss string
		if json.Unmarshal(p.claims["iss"], &iss) != nil || iss != pin.Issuer || c.Subject == "" || c.Expires <= now.Unix() {
			t.Fatalf("checkClaims accepted %+v", c)
		}
	})
}
