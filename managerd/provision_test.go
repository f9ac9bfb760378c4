package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// provisionFixture is a real signerd and broker and a config naming them with managerd's client
// certificate.
func provisionFixture(t *testing.T) (cfgPath string, srv *server.Server) {
	t.Helper()
	s := signerdtest.Start(t, signerdtest.Options{Spaces: []string{"alpha"}})
	srv = s.StartBrokerServer(t)
	f := s.ClientFor(t, mtls.KindManagerd, "alpha")
	q := strconv.Quote
	cfg := "brokers: [" + q(srv.ClientURL()) + "]\nsigner: {address: " + q(s.Addr) + ", ca: " + q(f.ServerCAFile) +
		", cert: " + q(f.CertFile) + ", key: " + q(f.KeyFile) + "}\n"
	return writeProvisionConfig(t, cfg), srv
}

func writeProvisionConfig(t *testing.T, cfg string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "provision.yaml")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// streams lists the streams the broker holds, sorted, from its own monitoring state.
func streams(t *testing.T, srv *server.Server) []string {
	t.Helper()
	jsz, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, acc := range jsz.AccountDetails {
		for _, sd := range acc.Streams {
			out = append(out, sd.Name)
		}
	}
	sort.Strings(out)
	return out
}

// planStreams lists the stream names provision.Plan wants, sorted, and its item names in order.
func planStreams(t *testing.T) (streams, items []string) {
	t.Helper()
	n, err := space.NewNames("alpha")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := provision.Plan(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range plan {
		streams = append(streams, it.Config.Name)
		items = append(items, it.Name)
	}
	sort.Strings(streams)
	return streams, items
}

// TestProvisionCommand: `managerd provision` creates every stream and bucket of the space through
// a signerd-minted provisioner and says so; a second run creates nothing and says what it found.
func TestProvisionCommand(t *testing.T) {
	cfg, srv := provisionFixture(t)
	wantStreams, items := planStreams(t)
	args := []string{"provision", "--space", "alpha", "--config", cfg}

	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("first run: exit %d: %s", code, errb.String())
	}
	if got := streams(t, srv); strings.Join(got, " ") != strings.Join(wantStreams, " ") {
		t.Fatalf("broker holds %v, want %v", got, wantStreams)
	}
	want := "space alpha\ncreated: " + strings.Join(items, " ") + "\nverified: (none)\ndelivery class: durable (written)\n"
	if out.String() != want {
		t.Fatalf("first run printed %q, want %q", out.String(), want)
	}

	out.Reset()
	errb.Reset()
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("second run: exit %d: %s", code, errb.String())
	}
	want = "space alpha\ncreated: (none)\nverified: " + strings.Join(items, " ") + "\ndelivery class: durable (kept)\n"
	if out.String() != want {
		t.Fatalf("second run printed %q, want %q", out.String(), want)
	}
}

// TestProvisionCommandRefuses: usage errors exit 2, bad configurations and refusals exit 1
// naming the cause, and nothing is created.
func TestProvisionCommandRefuses(t *testing.T) {
	cfg, srv := provisionFixture(t)
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	with := func(extra string) string { return writeProvisionConfig(t, string(good)+extra) }
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
		err  string
	}{
		{"ok/help", []string{"provision", "--help"}, 0, "delivery_class:", ""},
		{"ok/top-help-lists-it", []string{"--help"}, 0, "managerd provision --space S --config FILE", ""},
		{"fail/no-space", []string{"provision", "--config", cfg}, 2, "", "--space required"},
		{"fail/nothing", []string{"provision"}, 2, "", "--space and --config required"},
		{"fail/positional", []string{"provision", "--space", "alpha", "--config", cfg, "x"}, 2, "", "unexpected arguments: x"},
		{"fail/bad-space", []string{"provision", "--space", " alpha", "--config", cfg}, 1, "", "--space: invalid space name"},
		{"fail/unknown-key", []string{"provision", "--space", "alpha", "--config", with("owner: x\n")}, 1, "", "owner"},
		{"fail/replicas-too-many", []string{"provision", "--space", "alpha", "--config", with("replicas: 6\n")}, 1, "", "replicas 6: want 1 to 5"},
		{"fail/replicas-negative", []string{"provision", "--space", "alpha", "--config", with("replicas: -1\n")}, 1, "", "replicas -1"},
		{"fail/delivery-class", []string{"provision", "--space", "alpha", "--config", with("delivery_class: sometimes\n")}, 1, "", "delivery_class"},
		{"fail/missing-signer-key", []string{"provision", "--space", "alpha", "--config", writeProvisionConfig(t, "brokers: [nats://127.0.0.1:1]\nsigner: {address: x:1, ca: /a}\n")}, 1, "", "signer.cert, signer.key"},
		{"fail/broker-credentials", []string{"provision", "--space", "alpha", "--config", writeProvisionConfig(t, strings.Replace(string(good), "nats://", "nats://u:p@", 1))}, 1, "", "without credentials"},
		{"fail/space-signerd-refuses", []string{"provision", "--space", "beta", "--config", cfg}, 1, "", "provisioner credential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, errb.String())
			}
			if !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.err) {
				t.Fatalf("stdout %q stderr %q, want %q and %q", out.String(), errb.String(), tc.out, tc.err)
			}
		})
	}
	if got := streams(t, srv); len(got) != 0 {
		t.Fatalf("a refused run created %v", got)
	}
}
