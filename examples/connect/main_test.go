package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestReadmeConnectExample runs docs/connecting.md's "Connecting with a minted credential" example against
// a real signerd and broker: it mints through signerd over mTLS, writes a .creds file and
// connects with the _INBOX_<user nkey> prefix. docs/connecting.md must quote this directory's main.go
// verbatim, and the nats CLI command the example prints must work.
func TestReadmeConnectExample(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"demo"}})
	url := s.StartBroker(t)
	c := config{
		signerd: s.Addr, natsURL: url, space: "demo",
		credsPath: filepath.Join(t.TempDir(), "creds", "agent.creds"),
		tls:       s.ClientFor(t, "managerd", "demo"),
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(ctx, c, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Logf("%s", out.String())

	t.Run("ok/prints the stored post and the nats command, never a secret", func(t *testing.T) {
		text := out.String()
		for _, want := range []string{`stored as CHAT_demo #1, received "hello from the README" on cotal.demo.chat.demo.readme.general`,
			"--inbox-prefix _INBOX_U"} {
			if !strings.Contains(text, want) {
				t.Fatalf("output lacks %q:\n%s", want, text)
			}
		}
		if regexp.MustCompile(`SU[A-Z2-7]{50,}|eyJ[A-Za-z0-9_-]{20,}`).MatchString(text) {
			t.Fatalf("output carries a seed or a JWT")
		}
	})

	t.Run("ok/the creds file is 0600 and holds the minted user", func(t *testing.T) {
		if err := creds.CheckSecretFile(c.credsPath); err != nil {
			t.Fatal(err)
		}
		userJWT, seed, err := creds.ReadCreds(c.credsPath)
		if err != nil {
			t.Fatal(err)
		}
		defer seed.Wipe()
		uc, err := jwt.DecodeUserClaims(userJWT)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := seed.Public()
		if err != nil || pub != uc.Subject || !strings.Contains(out.String(), "for user "+pub) {
			t.Fatalf("creds subject %s, seed key %s (%v)", uc.Subject, pub, err)
		}
	})

	t.Run("ok/docs connecting.md quotes main.go verbatim", func(t *testing.T) {
		src, err := os.ReadFile("main.go")
		if err != nil {
			t.Fatal(err)
		}
		readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "connecting.md"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(readme, append(append([]byte("```go\n"), src...), "```\n"...)) {
			t.Fatal("docs/connecting.md does not show examples/connect/main.go verbatim in a go block")
		}
	})

	t.Run("ok/the printed nats CLI command publishes with the inbox prefix", func(t *testing.T) {
		bin := natsCLI(t)
		line := out.String()[strings.Index(out.String(), "nats --server"):]
		args := strings.Fields(strings.TrimSpace(line))[1:]
		cmd := exec.CommandContext(ctx, bin, append(args, "--timeout", "5s")...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
		got, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nats %v: %v\n%s", args, err, got)
		}
		if !strings.Contains(string(got), "Stream: CHAT_demo Sequence: 2") {
			t.Fatalf("nats pub -J did not store the message:\n%s", got)
		}
		// Without the prefix every reply is refused, and the publish times out.
		var noPrefix []string
		for i := 0; i < len(args); i++ {
			if args[i] == "--inbox-prefix" {
				i++
				continue
			}
			noPrefix = append(noPrefix, args[i])
		}
		cmd = exec.CommandContext(ctx, bin, append(noPrefix, "--timeout", "2s")...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
		got, err = cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("nats without --inbox-prefix: err = %v, want a failure\n%s", err, got)
		}
		if !strings.Contains(string(got), `Permissions Violation for Subscription to "_INBOX.`) {
			t.Fatalf("nats without --inbox-prefix failed for another reason:\n%s", got)
		}
	})
}

// natsCLI finds the real nats CLI: $NATS_CLI (make test builds the version pinned in
// tools/natscli.mod into bin/nats and sets it), else nats on PATH. Under CI a missing CLI fails
// the test instead of skipping it, so the CLI commands of docs/connecting.md are always proven there.
func natsCLI(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("NATS_CLI"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("nats")
	if err == nil {
		return bin
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("the nats CLI is required under CI: set NATS_CLI (make test does) or put nats on PATH: %v", err)
	}
	t.Skip("the nats CLI is not on PATH: make test builds it (tools/natscli.mod), or set NATS_CLI")
	return ""
}
