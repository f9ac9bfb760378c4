package bearer

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/space"
)

// FuzzDecode feeds arbitrary bytes to both halves of the decoder: as a compact token to split,
// and as a signed payload to decodePayload and check. Neither may panic, a header split accepts
// must carry typ JWT, and a payload check accepts must name a derived owner, a valid actor and an expiry inside the cap.
func FuzzDecode(f *testing.F) {
	now := time.Unix(1_800_000_000, 0)
	good := `{"scope":["spawn"],"ver":1,"act":{"owner":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","actor":"laptop","scope":["spawn"],"lifecycleUid":"lifecycle0000000000000000001"},"sub":"u_aaaaaaaaaaaaaaaaaaaaaaaaaa","iss":"urn:cotal:auth:alpha","aud":"alpha","iat":1800000000,"nbf":1800000000,"exp":1800000600,"jti":"x"}`
	f.Add([]byte(good))
	f.Add([]byte(`{"alg":"EdDSA","kid":"k","typ":"JWT"}`))
	f.Add([]byte(base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"EdDSA","kid":"k","typ":"JWT"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(good)) + "." + strings.Repeat("A", 86)))
	f.Add([]byte(base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"EdDSA","kid":"k"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(good)) + "." + strings.Repeat("A", 86)))
	f.Add([]byte(base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"EdDSA","kid":"k","typ":"cotal-service-access+jwt"}`)) + "." + base64.RawURLEncoding.EncodeToString([]byte(good)) + "." + strings.Repeat("A", 86)))
	f.Add([]byte(`{"act":{"view":"session-caller","session":{"endpoint":"e","sessionId":"ssssssssssssssssssssss","epoch":1,"exp":2}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if tok, err := split(string(data)); err == nil {
			if tok.kid == "" || len(tok.sig) != 64 {
				t.Fatalf("split accepted a token without kid or signature")
			}
			hdr, _ := base64.RawURLEncoding.DecodeString(strings.SplitN(string(data), ".", 2)[0])
			var h struct{ Typ *string }
			if json.Unmarshal(hdr, &h) != nil || h.Typ == nil || *h.Typ != Typ {
				t.Fatalf("split accepted a header whose typ is not %s", Typ)
			}
		}
		p, err := decodePayload(data)
		if err != nil {
			return
		}
		c, err := p.check("alpha", now)
		if err != nil {
			return
		}
		if space.ValidateDerivedOwner(c.Owner) != nil || space.ValidateActor(c.Actor) != nil {
			t.Fatalf("accepted principal %q.%q", c.Owner, c.Actor)
		}
		if !c.Expires.After(now) || c.Expires.Sub(now) > MaxLifetime+ClockTolerance {
			t.Fatalf("accepted exp %v at %v", c.Expires, now)
		}
	})
}
