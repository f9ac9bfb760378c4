package testkit_test

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/pkg/testkit"
)

func TestNoDeps(t *testing.T) {
	const (
		connect = "github.com/cotalgo/cotal/examples/connect"
		kit     = "github.com/cotalgo/cotal/pkg/testkit"
		trust   = "github.com/cotalgo/cotal/pkg/trust"
	)
	t.Run("ok/nothing-forbidden-linked", func(t *testing.T) {
		f := &fakeTB{TB: t}
		testkit.NoDeps(f, []string{connect}, "github.com/nats-io/nats.go", "github.com/cotalgo/cotal/signerd")
		if f.failed != "" || len(f.errors) != 0 {
			t.Fatalf("failed %q, errors %q", f.failed, f.errors)
		}
	})
	t.Run("ok/a-prefix-is-a-path-not-a-string", func(t *testing.T) {
		f := &fakeTB{TB: t}
		testkit.NoDeps(f, []string{kit}, trust, "github.com/cotalgo/cotal/pkg/tr")
		if f.failed != "" || len(f.errors) != 0 {
			t.Fatalf("failed %q, errors %q", f.failed, f.errors)
		}
	})
	t.Run("fail/a-forbidden-package-is-named", func(t *testing.T) {
		f := &fakeTB{TB: t}
		testkit.NoDeps(f, []string{kit}, trust, "github.com/cotalgo/cotal/pkg")
		if len(f.errors) == 0 || !strings.Contains(strings.Join(f.errors, "\n"), trust) {
			t.Fatalf("errors %q; want one naming %s", f.errors, trust)
		}
	})
	t.Run("fail/looking-at-nothing", func(t *testing.T) {
		f := &fakeTB{TB: t}
		testkit.NoDeps(f, []string{connect}, trust, "github.com/cotalgo/cotal/signerd")
		if !strings.Contains(f.failed, "do not include "+trust) {
			t.Fatalf("failed %q; want the missing %s named", f.failed, trust)
		}
	})
	t.Run("fail/unknown-package", func(t *testing.T) {
		f := &fakeTB{TB: t}
		testkit.NoDeps(f, []string{"github.com/cotalgo/cotal/no/such"}, trust, "github.com/cotalgo/cotal/signerd")
		if !strings.HasPrefix(f.failed, "go list -deps") || !strings.Contains(f.failed, "no/such") {
			t.Fatalf("failed %q; want go list's refusal naming the package", f.failed)
		}
	})
}
