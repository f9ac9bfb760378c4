package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cotalgo/cotal/pkg/daemon"
	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// provisionTimeout bounds one `managerd provision` run: a mint, a proof and a few dozen broker
// requests.
const provisionTimeout = 2 * time.Minute

const provisionSynopsis = `managerd provision --space S --config FILE

Creates the space's streams and buckets and its channel-defaults entry (pkg/provision), on a
one-shot provisioner credential that signerd mints for a key held only in memory; nothing is
written to disk. Idempotent: a second run creates nothing. A stream or bucket that exists with
another configuration, or a defaults entry that does not decode, is reported and left as it is
(exit 1). Prints what it created and what it found.

Configuration (strict YAML: an unknown key stops it, naming it):

  brokers: [nats://127.0.0.1:4222]            # nats:// or tls://, no credentials
  signer:                                     # signerd, with managerd's client certificate
    address: 127.0.0.1:7443                   #   (URI SAN spiffe://<td>/managerd/<space token>)
    ca: /etc/cotal/managerd/signerd-ca.pem
    cert: /etc/cotal/managerd/managerd.pem
    key: /etc/cotal/managerd/managerd.key
  delivery_class: durable                     # optional: durable (default) or live, written
                                              #   only when the defaults entry has no class
  credential_ttl: 5m                          # optional: the credential's asked lifetime
  replicas: 3                                 # optional: every stream's and bucket's replica
                                              #   count, 1 (default) to 5; 3 on a 3-node cluster`

// provisionConfig is `managerd provision --config FILE`.
type provisionConfig struct {
	// Brokers are the broker URLs. Required, at least one.
	Brokers []string `yaml:"brokers"`
	// Signer reaches signerd with managerd's client certificate. Required, except server_name
	// and server_id.
	Signer signerclient.FileConfig `yaml:"signer"`
	// DeliveryClass is provision.Options.DeliveryClass; empty means durable.
	DeliveryClass string `yaml:"delivery_class"`
	// CredentialTTL is the provisioner credential's asked lifetime; zero means the profile's.
	CredentialTTL yamlx.Duration `yaml:"credential_ttl"`
	// Replicas is provision.Options.Replicas; zero (absent) means 1.
	Replicas int `yaml:"replicas"`
}

// loadProvisionConfig reads path strictly (daemon.LoadConfig) and validates every value.
func loadProvisionConfig(path string) (*provisionConfig, error) {
	var c provisionConfig
	if err := daemon.LoadConfig(path, &c); err != nil {
		return nil, err
	}
	var missing []string
	if len(c.Brokers) == 0 {
		missing = append(missing, "brokers")
	}
	missing = append(missing, c.Signer.Missing("signer.")...)
	var err error
	switch {
	case len(missing) > 0:
		err = fmt.Errorf("missing required keys: %s", strings.Join(missing, ", "))
	case daemon.CheckBrokers(c.Brokers) != nil:
		err = daemon.CheckBrokers(c.Brokers)
	case c.DeliveryClass != "" && c.DeliveryClass != provision.ClassDurable && c.DeliveryClass != provision.ClassLive:
		err = fmt.Errorf("delivery_class %q: want %s or %s", c.DeliveryClass, provision.ClassDurable, provision.ClassLive)
	case provision.ValidateReplicas(c.Replicas) != nil:
		err = fmt.Errorf("replicas %d: want 1 to %d (odd: 1, 3 or 5)", c.Replicas, provision.MaxReplicas)
	case c.CredentialTTL < 0:
		err = fmt.Errorf("credential_ttl %v: want zero (profile default) or positive", c.CredentialTTL.D())
	}
	if err != nil {
		return nil, &daemon.ConfigError{Path: path, Err: err}
	}
	return &c, nil
}

// runProvision is `managerd provision --space S --config FILE`: provision.Run once, then print
// its report.
func runProvision(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := daemon.Flags("managerd provision", provisionSynopsis, stdout, stderr)
	spaceName := fs.String("space", "", "the space to provision (required)")
	cfgPath := fs.String("config", "", "the YAML configuration (required; unknown keys are refused)")
	if code, ok := daemon.ParseFlags(fs, args); !ok {
		return code
	}
	var missing []string
	if *spaceName == "" {
		missing = append(missing, "--space")
	}
	if *cfgPath == "" {
		missing = append(missing, "--config")
	}
	if len(missing) > 0 {
		fmt.Fprintf(stderr, "managerd provision: %s required\n", strings.Join(missing, " and "))
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "managerd provision: %v\n", err)
		return 1
	}
	if err := space.ValidateName(*spaceName); err != nil {
		return fail(fmt.Errorf("--space: %w", err))
	}
	cfg, err := loadProvisionConfig(*cfgPath)
	if err != nil {
		return fail(err)
	}
	signer, err := signerclient.Dial(cfg.Signer.ClientConfig())
	if err != nil {
		return fail(err)
	}
	defer signer.Close()
	ctx, stop := daemon.NotifyContext(ctx)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, provisionTimeout)
	defer cancel()
	rep, err := provision.Run(ctx, provision.Config{
		Signer: signer, Space: *spaceName, NatsURL: strings.Join(cfg.Brokers, ","),
		TTL: cfg.CredentialTTL.D(), Options: provision.Options{DeliveryClass: cfg.DeliveryClass, Replicas: cfg.Replicas},
	})
	if rep != nil {
		printReport(stdout, *spaceName, rep)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (gave up after %v)", err, provisionTimeout)
		}
		return fail(err)
	}
	return 0
}

// printReport writes what a run created and found, one list a line.
func printReport(w io.Writer, spaceName string, rep *provision.Report) {
	list := func(names []string) string {
		if len(names) == 0 {
			return "(none)"
		}
		return strings.Join(names, " ")
	}
	fmt.Fprintf(w, "space %s\ncreated: %s\nverified: %s\n", spaceName, list(rep.Created), list(rep.Verified))
	if rep.DeliveryClass != "" {
		how := "kept"
		if rep.DefaultsWritten {
			how = "written"
		}
		fmt.Fprintf(w, "delivery class: %s (%s)\n", rep.DeliveryClass, how)
	}
}
