package signerdtest

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/serve"
)

// TestReplicaAuditFiles: replicas on one init directory each write their own audit file, named
// by the replica id; a second signerd pointed at a file another one holds is refused at start
// (the file lock), and so is one with another replica id on a file that holds a chain (the
// chain's id), so two replicas never write one chain.
func TestReplicaAuditFiles(t *testing.T) {
	s := Start(t, Options{Replicas: 2})
	a, b := s.Replicas[0], s.Replicas[1]
	if a.AuditPath == b.AuditPath || filepath.Base(b.AuditPath) != b.ID+".audit" || a.ID == b.ID {
		t.Fatalf("replicas %s (%s) and %s (%s), want distinct ids and files", a.ID, a.AuditPath, b.ID, b.AuditPath)
	}
	for _, r := range s.Replicas {
		c, err := signerclient.Dial(signerclient.Config{Addr: r.Addr, TLS: s.ClientFor(t, mtls.KindManagerd, "alpha")})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = c.GetSpace(ctx, "alpha")
		cancel()
		_ = c.Close()
		if err != nil {
			t.Fatalf("GetSpace on %s: %v", r.ID, err)
		}
		if got := r.Audit(t); got.Lines != 1 || !slices.Equal(got.Replicas, []string{r.ID}) {
			t.Fatalf("%s's file: %+v, want one line of its own chain", r.ID, got)
		}
	}
	start := func(id, path string) error {
		cfg, err := serve.ParseConfig([]byte("listen: 127.0.0.1:0\n" + s.cfgText + "audit: {path: " + strconv.Quote(path) + ", replica: " + id + "}\n"))
		if err != nil {
			t.Fatal(err)
		}
		srv, err := serve.Start(cfg, nil, serve.Options{})
		if err == nil {
			go func() { _ = srv.Run(context.Background()) }()
			srv.Stop()
		}
		return err
	}
	if err := start(b.ID, a.AuditPath); !errors.Is(err, audit.ErrInUse) {
		t.Fatalf("a second signerd on %s's running file: %v, want ErrInUse", a.ID, err)
	}
	a.Stop(t)
	if err := start("test-9", a.AuditPath); err == nil || !strings.Contains(err.Error(), `holds replica "test-1"`) {
		t.Fatalf("replica test-9 on test-1's file: %v, want a refusal naming test-1's chain", err)
	}
	a.Restart(t)
	if got := a.Audit(t); got.Lines != 1 {
		t.Fatalf("test-1's file after the refusals: %+v, want its one line", got)
	}
}
