package creds

import (
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// FuzzParseCreds feeds arbitrary file content to the creds decoder: it must never panic, and
// whatever it accepts must be a user JWT whose subject is the returned seed's public key.
func FuzzParseCreds(f *testing.F) {
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	useed, _ := ukp.Seed()
	akp, _ := nkeys.CreateAccount()
	uc := jwt.NewUserClaims(upub)
	tok, _ := uc.Encode(akp)
	good, _ := jwt.FormatUserConfig(tok, useed)
	f.Add(good)
	f.Add([]byte(""))
	f.Add([]byte("-----BEGIN NATS USER JWT-----\n" + tok + "\n------END NATS USER JWT------\n"))
	f.Add([]byte(strings.Replace(string(good), string(useed), "SUAAAA", 1)))
	f.Add(append([]byte(nil), useed...))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, seed, err := parseCreds("fuzz.creds", data)
		if err != nil {
			if seed != nil || got != "" {
				t.Fatalf("error with a result")
			}
			return
		}
		c, derr := jwt.DecodeUserClaims(got)
		if derr != nil {
			t.Fatalf("accepted an undecodable JWT: %v", derr)
		}
		pub, perr := seed.Public()
		if perr != nil || pub != c.Subject {
			t.Fatalf("accepted seed %q (%v) not matching subject %q", pub, perr, c.Subject)
		}
	})
}
