package yamlx

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCheckPlain(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		ok        bool
	}{
		{"ok/plain", "a: 1\nb: [x, y]\n", true},
		{"ok/empty", "", true},
		{"fail/anchor", "a: &x 1\n", false},
		{"fail/alias", "a: &x 1\nb: *x\n", false},
		{"fail/merge", "a: {k: 1}\nb:\n  <<: {k: 2}\n", false},
		{"fail/tag", "a: !!binary YQ==\n", false},
		{"fail/syntax", "a: [\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := CheckPlain([]byte(tc.src)); (err == nil) != tc.ok {
				t.Fatalf("CheckPlain = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

type testConfig struct {
	Name  string   `yaml:"name"`
	Wait  Duration `yaml:"wait"`
	Inner struct {
		Port int `yaml:"port"`
	} `yaml:"inner"`
}

// TestDecodeStrict: Decode refuses what a daemon configuration must not hold, naming the key,
// and reads a plain document.
func TestDecodeStrict(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"fail/unknown-key", "name: a\nbogus: 1\n", "bogus"},
		{"fail/unknown-nested-key", "inner:\n  port: 1\n  host: x\n", "host"},
		{"fail/second-document", "name: a\n---\nname: b\n", "more than one YAML document"},
		{"fail/anchor", "name: &n a\n", "anchor"},
		{"fail/merge", "inner: {port: 1}\nx:\n  <<: {port: 2}\n", "merge key"},
		{"fail/negative-duration", "wait: -1s\n", "negative"},
		{"fail/duration-not-string", "wait: [1]\n", "duration must be a string"},
		{"fail/wrong-type", "inner: {port: abc}\n", "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c testConfig
			err := Decode([]byte(tc.src), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	t.Run("ok/plain", func(t *testing.T) {
		var c testConfig
		if err := Decode([]byte("name: a\nwait: 3s\ninner: {port: 7}\n"), &c); err != nil {
			t.Fatal(err)
		}
		if c.Name != "a" || c.Wait.D() != 3*time.Second || c.Inner.Port != 7 {
			t.Fatalf("decoded %+v", c)
		}
	})
	t.Run("ok/empty", func(t *testing.T) {
		c := testConfig{Name: "kept"}
		if err := Decode(nil, &c); err != nil || c.Name != "kept" {
			t.Fatalf("Decode(empty) = %v, %+v", err, c)
		}
	})
	t.Run("ok/plain-error-typed", func(t *testing.T) {
		var pe *PlainError
		if err := Decode([]byte("a: !!str x\n"), &map[string]string{}); !errors.As(err, &pe) || pe.Line != 1 {
			t.Fatalf("Decode = %v, want *PlainError at line 1", err)
		}
	})
}
