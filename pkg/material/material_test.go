package material

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// valid builds a material with a real user JWT (signed by a throwaway account) for a fresh key.
func valid(t testing.TB) (Material, nkeys.KeyPair) {
	t.Helper()
	acct, _ := nkeys.CreateAccount()
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Expires = time.Now().Add(time.Hour).Unix()
	tok, err := uc.Encode(acct)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := user.Seed()
	creds, err := FormatCreds(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	return Material{
		Version: Version, Space: "alpha", Servers: []string{"nats://127.0.0.1:4222"}, Owner: "local", Actor: "alice",
		LifecycleUID: "abcdefghijklmnopqrstuvwxyz", InstanceID: "inst1", Subscribe: []string{"general"},
		AllowSubscribe: []string{"general", "team.>"}, AllowPublish: []string{"general"}, Creds: creds,
	}, user
}

func TestRoundTrip(t *testing.T) {
	m, user := valid(t)
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Creds != m.Creds || got.Actor != "alice" || len(got.AllowSubscribe) != 2 {
		t.Fatalf("round trip: %v", got)
	}
	tok, kp, err := got.Credential()
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Wipe()
	pub, _ := kp.PublicKey()
	want, _ := user.PublicKey()
	uc, _ := jwt.DecodeUserClaims(tok)
	if pub != want || uc.Subject != want {
		t.Fatalf("credential key %s subject %s, want %s", pub, uc.Subject, want)
	}
	if s := m.String(); strings.Contains(s, "SU") || strings.Contains(s, "eyJ") {
		t.Fatalf("String shows the credential: %s", s)
	}
}

func TestDecodeRefuses(t *testing.T) {
	m, _ := valid(t)
	other, _ := valid(t)
	enc := func(f func(*Material)) []byte {
		c := m
		f(&c)
		b, _ := json.Marshal(c)
		return b
	}
	good, _ := Encode(m)
	for _, tt := range []struct {
		name, want string
		in         []byte
	}{
		{"unknown field", "unknown field", bytes.Replace(good, []byte(`{"version"`), []byte(`{"extra":1,"version"`), 1)},
		{"trailing data", "data after", append(append([]byte{}, good...), []byte(" {}")...)},
		{"version", "version", enc(func(c *Material) { c.Version = 2 })},
		{"space", "space", enc(func(c *Material) { c.Space = "" })},
		{"no servers", "no servers", enc(func(c *Material) { c.Servers = nil })},
		{"http server", "server", enc(func(c *Material) { c.Servers = []string{"http://x:1"} })},
		{"server with user", "server", enc(func(c *Material) { c.Servers = []string{"nats://u:p@x:1"} })},
		{"actor", "principal", enc(func(c *Material) { c.Actor = "a-b" })},
		{"uid", "principal", enc(func(c *Material) { c.LifecycleUID = "UPPER" })},
		{"instance", "instance_id", enc(func(c *Material) { c.InstanceID = "" })},
		{"role", "role", enc(func(c *Material) { c.Role = "a.b" })},
		{"subscribe pattern", "subscribe", enc(func(c *Material) { c.Subscribe = []string{"team.>"} })},
		{"allow pattern", "channel pattern", enc(func(c *Material) { c.AllowPublish = []string{"a..b"} })},
		{"no creds nor exchange form", "no creds, and exchange_url", enc(func(c *Material) { c.Creds = "" })},
		{"seed of another key", "not the JWT subject", enc(func(c *Material) {
			c.Creds = m.Creds[:strings.Index(m.Creds, "------END NATS USER JWT------")] + other.Creds[strings.Index(other.Creds, "------END NATS USER JWT------"):]
		})},
		{"oversized", "limit", append(good, bytes.Repeat([]byte(" "), MaxBytes)...)},
	} {
		t.Run("fail/"+tt.name, func(t *testing.T) {
			_, err := Decode(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want an error with %q, got %v", tt.want, err)
			}
			if err != nil && (strings.Contains(err.Error(), "eyJ") || strings.Contains(err.Error(), "SUA")) {
				t.Fatalf("error quotes the credential: %v", err)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	m, _ := valid(t)
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "launch-material")
	if err := os.WriteFile(good, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadFile(good); err != nil || got.Actor != "alice" {
		t.Fatalf("ReadFile: %v %v", got, err)
	}
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, b, 0o640); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, path, want string }{
		{"looser than 0600", loose, "looser than 0600"},
		{"symbolic link", link, "too many levels"},
		{"directory", dir, "not a regular file"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	} {
		t.Run("fail/"+tt.name, func(t *testing.T) {
			_, err := ReadFile(tt.path)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("want %q, got %v", tt.want, err)
			}
		})
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(dir, "other")
		if err := os.WriteFile(other, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFile(other); err == nil || !strings.Contains(err.Error(), "not owned by uid 0") {
			t.Fatalf("another uid's file: %v", err)
		}
	}
}

// FuzzDecode: Decode never panics, and what it accepts encodes back to something it accepts
// equally.
func FuzzDecode(f *testing.F) {
	m, _ := valid(f)
	good, _ := Encode(m)
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"version":1}`))
	if ex, err := Encode(exchangeForm(f)); err == nil {
		f.Add(ex)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Encode(got)
		if err != nil {
			t.Fatalf("accepted material does not encode: %v", err)
		}
		back, err := Decode(again)
		if err != nil || back.Creds != got.Creds || back.Token != got.Token || back.LifecycleUID != got.LifecycleUID {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// exchangeForm is a valid exchange-form material: a bearer sentinel, a token, an https base.
func exchangeForm(t testing.TB) Material {
	t.Helper()
	m, user := valid(t)
	user.Wipe()
	sentinel, _ := testkit.SentinelJWT(t, true)
	m.Creds, m.ExchangeURL, m.Token, m.Sentinel = "", "https://auth.example/t", strings.Repeat("T", 43), sentinel
	return m
}

// TestExchangeForm: the exchange form (no creds) round-trips, is written and read 0600, and is
// refused mixed with creds or with an unusable URL, token or sentinel.
func TestExchangeForm(t *testing.T) {
	t.Run("ok/round trip through a 0600 file", func(t *testing.T) {
		m := exchangeForm(t)
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(`"creds"`)) {
			t.Fatalf("the exchange form encodes a creds key: %s", b)
		}
		path := filepath.Join(t.TempDir(), "m")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFile(path)
		if err != nil || !got.Exchange() || got.ExchangeURL != m.ExchangeURL || got.Token != m.Token || got.Sentinel != m.Sentinel {
			t.Fatalf("read exchange %v url %q err %v", got.Exchange(), got.ExchangeURL, err)
		}
		if _, _, err := got.Credential(); err == nil {
			t.Fatal("the exchange form yielded a credential")
		}
		if strings.Contains(got.String(), m.Token) || strings.Contains(got.String(), m.Sentinel) {
			t.Fatal("String shows the token or the sentinel")
		}
	})
	t.Run("ok/http to loopback", func(t *testing.T) {
		m := exchangeForm(t)
		m.ExchangeURL = "http://127.0.0.1:8081"
		if err := m.Validate(); err != nil {
			t.Fatal(err)
		}
	})
	for name, edit := range map[string]func(*Material){
		"creds and exchange together": func(m *Material) { c, u := valid(t); u.Wipe(); m.Creds = c.Creds },
		"http to a remote host":       func(m *Material) { m.ExchangeURL = "http://auth.example" },
		"url with a query":            func(m *Material) { m.ExchangeURL = "https://auth.example/?a=b" },
		"no url":                      func(m *Material) { m.ExchangeURL = "" },
		"short token":                 func(m *Material) { m.Token = "short" },
		"token with a space":          func(m *Material) { m.Token = strings.Repeat("a", 20) + " b" },
		"sentinel not a JWT":          func(m *Material) { m.Sentinel = "x" },
		"sentinel not bearer": func(m *Material) {
			c, u := valid(t)
			u.Wipe()
			tok, _ := jwt.ParseDecoratedJWT([]byte(c.Creds))
			m.Sentinel = tok
		},
	} {
		t.Run("fail/"+name, func(t *testing.T) {
			m := exchangeForm(t)
			edit(&m)
			if _, err := Encode(m); err == nil {
				t.Fatal("encoded")
			}
		})
	}
}
