package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/authd/internal/admin"
	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/idp/idptest"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// TestHelp: every command answers --help on stdout with exit 0; unknown commands and flags are
// usage errors (2); serve without --config refuses.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"ok/top-help", []string{"--help"}, 0, "authd serve --config FILE"},
		{"ok/help-word", []string{"help"}, 0, "authd serve --config FILE"},
		{"ok/serve-help", []string{"serve", "--help"}, 0, "-config"},
		{"ok/actor-help", []string{"actor", "--help"}, 0, "authd actor grant"},
		{"ok/actor-grant-help", []string{"actor", "grant", "--help"}, 0, "owner"},
		{"ok/idp-help", []string{"idp", "--help"}, 0, "authd idp pin URL"},
		{"ok/idp-pin-help", []string{"idp", "pin", "--help"}, 0, "state-dir"},
		{"fail/actor-no-subcommand", []string{"actor"}, 2, ""},
		{"fail/idp-unknown-subcommand", []string{"idp", "unpin"}, 2, ""},
		{"fail/actor-bad-config", []string{"actor", "--config", "/nonexistent.yaml", "list"}, 1, ""},
		{"fail/no-args", nil, 2, ""},
		{"fail/unknown-command", []string{"srve"}, 2, ""},
		{"fail/unknown-flag", []string{"serve", "--cfg", "x"}, 2, ""},
		{"fail/positional", []string{"serve", "--config", "x", "extra"}, 2, ""},
		{"fail/serve-without-config", []string{"serve"}, 2, ""},
		{"fail/missing-config-file", []string{"serve", "--config", "/nonexistent/authd.yaml"}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.out) {
				t.Fatalf("stdout %q lacks %q", out.String(), tc.out)
			}
		})
	}
}

// TestActorWithConfig: `authd actor --config FILE list` reads the configured state dir.
func TestActorWithConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil { // the callout seed's directory, as signerd init makes it
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	seedPath := filepath.Join(dir, "callout.nk")
	state := filepath.Join(dir, "state")
	if err := os.WriteFile(seedPath, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "authd.yaml")
	if err := os.WriteFile(cfg, []byte("space: alpha\nbrokers: [nats://127.0.0.1:4222]\nsigner: {address: 127.0.0.1:1, ca: x, cert: x, key: x}\ncallout_seed: "+seedPath+"\nstate_dir: "+state+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"actor", "--config", cfg, "grant", "--owner", "u_abcdefghijklmnopqrstuvwxyz", "--actor", "bob"}, &out, &errb); code != 0 {
		t.Fatalf("grant exit %d: %s", code, errb.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"actor", "--config=" + cfg, "list"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "bob") {
		t.Fatalf("list exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// TestActorGrantBySubject: `authd actor --config FILE grant --subject SUB` has signerd derive the
// owner under the pinned IdP's issuer, with authd's identity from the configuration.
func TestActorGrantBySubject(t *testing.T) {
	sg := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha"}})
	fake := idptest.Start(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	seedPath := filepath.Join(dir, "callout.nk")
	state := filepath.Join(dir, "state")
	if err := os.WriteFile(seedPath, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := idp.PinURL(ctx, state, fake.URL, nil); err != nil {
		t.Fatal(err)
	}
	tls := sg.ClientFor(t, "authd", "alpha")
	cfg := filepath.Join(dir, "authd.yaml")
	if err := os.WriteFile(cfg, []byte("space: alpha\nbrokers: [nats://127.0.0.1:4222]\nsigner: {address: "+sg.Addr+", ca: "+tls.ServerCAFile+
		", cert: "+tls.CertFile+", key: "+tls.KeyFile+"}\ncallout_seed: "+seedPath+"\nstate_dir: "+state+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := signerclient.Dial(signerclient.Config{Addr: sg.Addr, TLS: tls})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want, err := admin.SignerDeriveOwner(c, "alpha")(ctx, fake.URL, "carol")
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"actor", "--config", cfg, "grant", "--subject", "carol", "--actor", "laptop"}, &out, &errb); code != 0 {
		t.Fatalf("grant exit %d: %s", code, errb.String())
	}
	out.Reset()
	if code := run(ctx, []string{"actor", "--config", cfg, "list"}, &out, &errb); code != 0 || !strings.Contains(out.String(), want) {
		t.Fatalf("list exit %d, stdout %q lacks the derived owner %s", code, out.String(), want)
	}
}
