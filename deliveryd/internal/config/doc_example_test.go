package config

import (
	"github.com/cotalgo/cotal/pkg/testkit"
	"path/filepath"
	"testing"
)

// TestDocExample: the configuration example in docs/deliveryd.md is accepted by the strict
// loader (every key known, every value valid), and the values it marks as defaults are the
// defaults. Validate creates and checks the state directory, so the example's
// /var/lib/cotal/... is replaced by a temporary one after decoding.
func TestDocExample(t *testing.T) {
	dir := t.TempDir()
	c, err := Decode(write(t, dir, testkit.DocBlock(t, filepath.Join("..", "..", "..", "docs", "deliveryd.md"), "yaml")))
	if err != nil {
		t.Fatalf("docs/deliveryd.md example: %v", err)
	}
	if c.StateDir == "" {
		t.Fatal("docs/deliveryd.md example: no state_dir")
	}
	c.StateDir = filepath.Join(dir, "state")
	if err := c.Validate(); err != nil {
		t.Fatalf("docs/deliveryd.md example: %v", err)
	}
	if c.Holder != "" || c.CredentialTTL != 0 || c.BrokerGone.D() != DefaultBrokerGone || c.BrokerGoneBackstop != 0 ||
		c.ShutdownTimeout.D() != DefaultShutdownTimeout || c.LogLevel != "info" {
		t.Errorf("docs/deliveryd.md example: a value marked default is not the default: %+v", c)
	}
}
