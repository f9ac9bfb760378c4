package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// docYAML returns the one ```yaml block of the Markdown file at path, failing unless there is
// exactly one.
func docYAML(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur []string
	in := false
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case !in && strings.TrimSpace(l) == "```yaml":
			in, cur = true, nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, l)
		}
	}
	if len(blocks) != 1 {
		t.Fatalf("%s: %d yaml blocks, want 1", path, len(blocks))
	}
	return blocks[0]
}

// TestDocExample: the configuration example in docs/deliveryd.md is accepted by the strict
// loader (every key known, every value valid), and the values it marks as defaults are the
// defaults. Validate creates and checks the state directory, so the example's
// /var/lib/cotal/... is replaced by a temporary one after decoding.
func TestDocExample(t *testing.T) {
	dir := t.TempDir()
	c, err := Decode(write(t, dir, docYAML(t, filepath.Join("..", "..", "..", "docs", "deliveryd.md"))))
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
