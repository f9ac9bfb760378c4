// Package servicetest is the test environment of deliveryd as a whole: a deliveryd
// configuration for a plane3test environment (real signerd, broker and provisioned space), a
// short lease TTL, receiving members on pkg/dlvclient, and reads of what landed in DLV_<t> and
// in the lease row. Tests only.
package servicetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/deliveryd/internal/config"
	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit/plane3test"
	"github.com/cotalgo/cotal/pkg/yamlx"
)

// Config is a deliveryd configuration for e with a deliveryd client certificate signerd's
// policy knows, holder name holder and a fresh state directory.
func Config(t testing.TB, e *plane3test.Env, holder string) *config.Config {
	t.Helper()
	cf := e.S.ClientFor(t, mtls.KindDeliveryd, plane3test.Space)
	return &config.Config{
		Space: plane3test.Space, Brokers: []string{e.URL},
		Signer:   signerclient.FileConfig{Address: e.S.Addr, CA: cf.ServerCAFile, Cert: cf.CertFile, Key: cf.KeyFile},
		StateDir: filepath.Join(t.TempDir(), "state"), Holder: holder,
		BrokerGone: yamlx.Duration(15 * time.Second), ShutdownTimeout: yamlx.Duration(5 * time.Second),
	}
}

// YAML renders c as a configuration file.
func YAML(c *config.Config) string {
	q := strconv.Quote
	brokers := make([]string, len(c.Brokers))
	for i, b := range c.Brokers {
		brokers[i] = q(b)
	}
	return fmt.Sprintf("space: %s\nbrokers: [%s]\nsigner: {address: %s, ca: %s, cert: %s, key: %s}\nstate_dir: %s\nholder: %s\nbroker_gone: %s\nlog_level: debug\n",
		q(c.Space), strings.Join(brokers, ", "), q(c.Signer.Address), q(c.Signer.CA), q(c.Signer.Cert), q(c.Signer.Key),
		q(c.StateDir), q(c.Holder), c.BrokerGone.D())
}

// ShortenLease sets the delivery bucket's TTL (max_age) to ttl with the provisioner credential,
// which may update that bucket: pkg/provision makes it 30 s, and a crash test waits one TTL.
func ShortenLease(t testing.TB, e *plane3test.Env, pjs jetstream.JetStream, ttl time.Duration) {
	t.Helper()
	bucket, _ := e.N.Bucket(space.Delivery)
	s, err := pjs.Stream(plane3test.Ctx(t), "KV_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxAge = ttl
	cfg.Duplicates = min(cfg.Duplicates, ttl)
	if _, err := pjs.UpdateStream(plane3test.Ctx(t), cfg); err != nil {
		t.Fatalf("shorten the lease TTL: %v", err)
	}
}

// Exactly checks that ids hold each of want exactly once and nothing else.
func Exactly(ids, want []string) error {
	count := map[string]int{}
	for _, id := range ids {
		count[id]++
	}
	var missing, extra []string
	for _, w := range want {
		if count[w] == 0 {
			missing = append(missing, w)
		}
		if count[w] > 1 {
			extra = append(extra, fmt.Sprintf("%s×%d", w, count[w]))
		}
		delete(count, w)
	}
	for id := range count {
		extra = append(extra, id)
	}
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		return fmt.Errorf("missing %v, duplicated or unexpected %v (of %d handed over)", missing, extra, len(ids))
	}
	return nil
}

// Seq is ids prefix-1 ... prefix-n.
func Seq(prefix string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, prefix+"-"+strconv.Itoa(i))
	}
	return out
}

// DLVCount is how many messages DLV_<t> holds for lifecycle local.<actor>.<uid>, read with the
// provisioner's stream info: a copy stored twice would count twice, whatever the client dedups.
func DLVCount(t testing.TB, e *plane3test.Env, pjs jetstream.JetStream, actor, uid string) uint64 {
	t.Helper()
	subj, err := e.N.Dlv(plane3test.Owner, actor, uid)
	if err != nil {
		t.Fatal(err)
	}
	s, err := pjs.Stream(plane3test.Ctx(t), e.N.DLVStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(plane3test.Ctx(t), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// ErrNoRow: lease.0 has no row.
var ErrNoRow = errors.New("servicetest: no lease row")

// LeaseRow reads lease.0 with kv (a delivery or agent credential's view of the delivery bucket).
func LeaseRow(ctx context.Context, kv jetstream.KeyValue) (lease.Row, uint64, error) {
	e, err := kv.Get(ctx, space.DeliveryLeaseKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return lease.Row{}, 0, ErrNoRow
	}
	if err != nil {
		return lease.Row{}, 0, err
	}
	var r lease.Row
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return lease.Row{}, 0, err
	}
	return r, e.Revision(), nil
}

// DeliveryKV is the delivery bucket on a fresh delivery-credential connection.
func DeliveryKV(t testing.TB, e *plane3test.Env) jetstream.KeyValue {
	t.Helper()
	bucket, _ := e.N.Bucket(space.Delivery)
	kv, err := plane3test.JS(t, e.Delivery(t)).KeyValue(plane3test.Ctx(t), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// WaitReady polls lease.0 until holder's row says ready.
func WaitReady(t testing.TB, kv jetstream.KeyValue, holder string, within time.Duration) lease.Row {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		r, _, err := LeaseRow(plane3test.Ctx(t), kv)
		if err == nil && r.Holder == holder && r.Ready {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease.0 of %s not ready within %v: %+v %v", holder, within, r, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
