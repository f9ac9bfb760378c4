package serve_test

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/signerd/internal/serve"
)

// TestParseConfigRefusesHidingYAML: the configuration names the client CA, the policy and the
// key directory, so a reviewer must read exactly what signerd will use. A !!binary tag spelled
// client_ca in base64, and an anchor and alias could point the policy at another key's value;
// both parsed before.
func TestParseConfigRefusesHidingYAML(t *testing.T) {
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	f := fixture{cert: "/c.pem", key: "/k.pem", clientCA: "/ca.pem", publicDir: "/pub", policy: "/p.yaml", auditPath: "/a/log"}
	plain := f.yaml("127.0.0.1:0", "/keys", "")
	for _, tc := range []struct{ name, yaml, want string }{
		// "L290aGVyLWNhLnBlbQ==" is "/other-ca.pem".
		{"fail/binary-client-ca", strings.Replace(plain, "client_ca: /ca.pem", "client_ca: !!binary L290aGVyLWNhLnBlbQ==", 1), "tag"},
		{"fail/anchor-alias", strings.Replace(strings.Replace(plain, "public_dir: /pub", "public_dir: &d /pub", 1), "policy: /p.yaml", "policy: *d", 1), "anchor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.yaml == plain {
				t.Fatal("fixture changed shape; update this test's edit")
			}
			cfg, err := serve.ParseConfig([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseConfig = %+v, %v; want an error about %q", cfg, err, tc.want)
			}
		})
	}
	if _, err := serve.ParseConfig([]byte(plain)); err != nil {
		t.Fatalf("plain config refused: %v", err)
	}
}
