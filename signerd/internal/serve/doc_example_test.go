package serve_test

import (
	"github.com/cotalgo/cotal/pkg/testkit"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/serve"
)

// TestDocExample: the `signerd serve` example in docs/signerd.md is accepted by ParseConfig (strict
// decoding and validation; it reads none of the files the example names), its limits: and
// idempotency: blocks, documented as "the defaults are shown", equal the defaults a config
// without them gets, and so does audit.max_bytes.
func TestDocExample(t *testing.T) {
	doc, err := serve.ParseConfig([]byte(testkit.DocBlock(t, filepath.Join("..", "..", "..", "docs", "signerd.md"), "yaml")))
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
