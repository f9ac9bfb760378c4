package serve_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/serve"
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

// TestDocExample: the `signerd serve` example in docs/signerd.md is accepted by ParseConfig (strict
// decoding and validation; it reads none of the files the example names), its limits: and
// idempotency: blocks, documented as "the defaults are shown", equal the defaults a config
// without them gets, and so does audit.max_bytes.
func TestDocExample(t *testing.T) {
	doc, err := serve.ParseConfig([]byte(docYAML(t, filepath.Join("..", "..", "..", "docs", "signerd.md"))))
	if err != nil {
		t.Fatalf("docs/signerd.md example: %v", err)
	}
	bare, err := serve.ParseConfig([]byte(`listen: 127.0.0.1:7443
tls: {cert: /x/s.pem, key: /x/s.key, client_ca: /x/ca.pem}
key_dir: /x/signer
public_dir: /x/public
policy: /x/policy.yaml
audit: {path: /x/a.audit, replica: r1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(doc.Limits, bare.Limits) {
		t.Errorf("docs/signerd.md example limits:\n%+v\nwant the defaults\n%+v", doc.Limits, bare.Limits)
	}
	if !reflect.DeepEqual(doc.Idempotency, bare.Idempotency) {
		t.Errorf("docs/signerd.md example idempotency: %+v, want the defaults %+v", doc.Idempotency, bare.Idempotency)
	}
	if doc.Audit.MaxBytes != audit.DefaultMaxBytes {
		t.Errorf("docs/signerd.md example audit.max_bytes %d, documented as the default %d", doc.Audit.MaxBytes, audit.DefaultMaxBytes)
	}
}
