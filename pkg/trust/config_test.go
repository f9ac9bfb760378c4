package trust_test

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/trust"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// seedPattern matches an encoded nkey seed of any kind (operator, account, user, curve).
var seedPattern = regexp.MustCompile(`\bS[OAUX][A-Z2-7]{56}\b`)

// placeholders replaces every key and JWT of b and spaces by a stable name, so the golden file
// pins the layout while the keys stay random.
func placeholders(b *trust.Broker, spaces ...*trust.Space) *strings.Replacer {
	pairs := []string{
		b.OperatorJWT(), "<OPERATOR_JWT>",
		b.SystemAccountJWT(), "<SYS_JWT>",
		b.SystemAccountPublicKey(), "<SYS_PUB>",
		b.Name(), "<BROKER_NAME>",
	}
	for i, sp := range spaces {
		n := string(rune('A' + i))
		pairs = append(pairs,
			sp.DataAccountJWT(), "<DATA_JWT_"+n+">",
			sp.AuthAccountJWT(), "<AUTH_JWT_"+n+">",
			sp.DataAccountPublicKey(), "<DATA_PUB_"+n+">",
			sp.AuthAccountPublicKey(), "<AUTH_PUB_"+n+">",
		)
	}
	return strings.NewReplacer(pairs...)
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs (run with -update to accept):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// allSeeds returns the text of every seed, to prove none reaches a rendered config.
func allSeeds(t *testing.T, ss ...*creds.Seed) [][]byte {
	t.Helper()
	var out [][]byte
	for _, s := range ss {
		if err := s.Use(func(b []byte) error { out = append(out, bytes.Clone(b)); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestRenderServerConfigGolden(t *testing.T) {
	b, op := newBroker(t, "dev")
	a, aid, asg := newSpace(t, b, op, "alpha")
	c, cid, csg := newSpace(t, b, op, "beta team")
	tests := []struct {
		name string
		cfg  trust.ServerConfig
	}{
		{"ok/defaults", trust.ServerConfig{StoreDir: "/var/lib/cotal/jetstream", Broker: b, Spaces: []*trust.Space{a, c}}},
		{"ok/tls", trust.ServerConfig{Host: "0.0.0.0", Port: 4443, StoreDir: "/var/lib/cotal/js", TLSCertFile: "/etc/cotal/tls/server.crt", TLSKeyFile: "/etc/cotal/tls/server.key", Broker: b, Spaces: []*trust.Space{a, c}}},
		{"ok/no spaces", trust.ServerConfig{Port: -1, StoreDir: "/tmp/js", Broker: b}},
		{"ok/cluster node", trust.ServerConfig{Host: "10.0.0.2", Port: 4222, ServerName: "n2", MonitorPort: 8222, StoreDir: "jetstream",
			TLSCertFile: "tls/n2.crt", TLSKeyFile: "tls/n2.key", TLSCAFile: "tls/ca.pem", Broker: b, Spaces: []*trust.Space{a},
			Cluster: &trust.ClusterConfig{Name: "cotal", Port: 6222, Routes: []string{"nats-route://10.0.0.1:6222", "nats-route://10.0.0.2:6222", "nats-route://10.0.0.3:6222"}}}},
	}
	seeds := allSeeds(t, op.Operator, op.OperatorSigning, op.SystemAccount, aid.DataAccount, aid.AuthAccount,
		asg.DataSigning, asg.AuthSigning, asg.XKey, cid.DataAccount, cid.AuthAccount, csg.DataSigning, csg.AuthSigning, csg.XKey)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := trust.RenderServerConfig(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range seeds {
				if bytes.Contains(out, s) {
					t.Fatal("rendered config contains a seed")
				}
			}
			if m := seedPattern.Find(out); m != nil {
				t.Fatalf("rendered config contains seed-shaped text %.6s…", m)
			}
			golden(t, strings.ReplaceAll(tt.name, "/", "_")+".conf", []byte(placeholders(b, a, c).Replace(string(out))))
		})
	}
}

func TestRenderServerConfigRefusals(t *testing.T) {
	b, op := newBroker(t, "dev")
	other, otherOp := newBroker(t, "other")
	a, _, _ := newSpace(t, b, op, "alpha")
	foreign, _, _ := newSpace(t, other, otherOp, "gamma")
	// "a b" and "a_b" share the token a_b, so their accounts share names.
	ab1, _, _ := newSpace(t, b, op, "a b")
	ab2, _, _ := newSpace(t, b, op, "a_b")
	// A space named SYS would give its data account the system account's name.
	sys, _, _ := newSpace(t, b, op, "SYS")
	cl := func(mod func(*trust.ClusterConfig)) *trust.ClusterConfig {
		c := &trust.ClusterConfig{Name: "cotal", Port: 6222, Routes: []string{"nats-route://h1:6222"}}
		if mod != nil {
			mod(c)
		}
		return c
	}
	base := func(mod func(*trust.ServerConfig)) trust.ServerConfig {
		c := trust.ServerConfig{StoreDir: "/js", Broker: b, Spaces: []*trust.Space{a}}
		mod(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  trust.ServerConfig
		want any
	}{
		{"fail/foreign-signed space", base(func(c *trust.ServerConfig) { c.Spaces = append(c.Spaces, foreign) }), &trust.ForeignAccountError{}},
		{"fail/space of another broker only", base(func(c *trust.ServerConfig) { c.Spaces = []*trust.Space{foreign} }), &trust.ForeignAccountError{}},
		{"fail/same space twice", base(func(c *trust.ServerConfig) { c.Spaces = []*trust.Space{a, a} }), &trust.DuplicateAccountError{}},
		{"fail/colliding tokens", base(func(c *trust.ServerConfig) { c.Spaces = []*trust.Space{ab1, ab2} }), &trust.DuplicateAccountError{}},
		{"fail/space named SYS", base(func(c *trust.ServerConfig) { c.Spaces = []*trust.Space{sys} }), &trust.DuplicateAccountError{}},
		{"fail/nil space", base(func(c *trust.ServerConfig) { c.Spaces = []*trust.Space{nil} }), &trust.ConfigError{}},
		{"fail/no broker", base(func(c *trust.ServerConfig) { c.Broker = nil }), &trust.ConfigError{}},
		{"fail/no store dir", base(func(c *trust.ServerConfig) { c.StoreDir = "" }), &trust.ConfigError{}},
		{"fail/quote in store dir", base(func(c *trust.ServerConfig) { c.StoreDir = `/js"\n}` }), &trust.ConfigError{}},
		{"fail/newline in host", base(func(c *trust.ServerConfig) { c.Host = "127.0.0.1\nport: 1" }), &trust.ConfigError{}},
		{"fail/cert without key", base(func(c *trust.ServerConfig) { c.TLSCertFile = "/c.pem" }), &trust.ConfigError{}},
		{"fail/port out of range", base(func(c *trust.ServerConfig) { c.Port = 70000 }), &trust.ConfigError{}},
		{"fail/ca without cert", base(func(c *trust.ServerConfig) { c.TLSCAFile = "/ca.pem" }), &trust.ConfigError{}},
		{"fail/monitor port out of range", base(func(c *trust.ServerConfig) { c.MonitorPort = -2 }), &trust.ConfigError{}},
		{"fail/cluster without server name", base(func(c *trust.ServerConfig) { c.Cluster = cl(nil) }), &trust.ConfigError{}},
		{"fail/cluster without name", base(func(c *trust.ServerConfig) {
			c.ServerName, c.Cluster = "n1", cl(func(k *trust.ClusterConfig) { k.Name = "" })
		}), &trust.ConfigError{}},
		{"fail/cluster without port", base(func(c *trust.ServerConfig) {
			c.ServerName, c.Cluster = "n1", cl(func(k *trust.ClusterConfig) { k.Port = 0 })
		}), &trust.ConfigError{}},
		{"fail/cluster without routes", base(func(c *trust.ServerConfig) {
			c.ServerName, c.Cluster = "n1", cl(func(k *trust.ClusterConfig) { k.Routes = nil })
		}), &trust.ConfigError{}},
		{"fail/route not nats-route", base(func(c *trust.ServerConfig) {
			c.ServerName, c.Cluster = "n1", cl(func(k *trust.ClusterConfig) { k.Routes = []string{"nats://h:6222"} })
		}), &trust.ConfigError{}},
		{"fail/route without port", base(func(c *trust.ServerConfig) {
			c.ServerName, c.Cluster = "n1", cl(func(k *trust.ClusterConfig) { k.Routes = []string{"nats-route://h"} })
		}), &trust.ConfigError{}},
		{"fail/space in server name", base(func(c *trust.ServerConfig) { c.ServerName = "n 1" }), &trust.ConfigError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := trust.RenderServerConfig(tt.cfg)
			if err == nil || out != nil {
				t.Fatalf("RenderServerConfig = %q, nil; want an error", out)
			}
			opts, oerr := trust.ServerOptions(tt.cfg)
			if oerr == nil || opts != nil {
				t.Fatalf("ServerOptions accepted what RenderServerConfig refused")
			}
			var ok bool
			switch tt.want.(type) {
			case *trust.ForeignAccountError:
				var e *trust.ForeignAccountError
				ok = errors.As(err, &e) && e.Issuer == pubOf(t, otherOp.OperatorSigning)
			case *trust.DuplicateAccountError:
				var e *trust.DuplicateAccountError
				ok = errors.As(err, &e)
			case *trust.ConfigError:
				var e *trust.ConfigError
				ok = errors.As(err, &e)
			}
			if !ok {
				t.Fatalf("err = %v, want %T", err, tt.want)
			}
		})
	}
}
