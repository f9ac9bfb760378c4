package service

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/provision"
	"github.com/cotalgo/cotal/pkg/space"
)

// CodeStore refuses a start whose space lacks the auth store cotal_auth_<t> or the lifecycle
// records store cotal_records_<t>, or holds either in another configuration than
// provision.Plan's, or whose stream info cannot be read. The reason names the bucket; the cause
// is jetstream.ErrStreamNotFound for a missing one and a *provision.MismatchError for another
// configuration. Provisioning the space (provision.Run) makes both.
const CodeStore = "STORE"

// storeKinds are the buckets authd checks at start, in order.
var storeKinds = []space.BucketKind{space.Auth, space.Records}

// checkStores reads the stream info of each store on the auth-plane connection (the profile's
// STREAM.INFO rows on both streams) and compares it with provision.Plan's item field by field,
// the replica count aside: authd is not told the count the space was provisioned with.
func checkStores(ctx context.Context, nc *nats.Conn, n space.Names) error {
	items, err := provision.Plan(n)
	if err != nil {
		return &StartError{Code: CodeConfig, Reason: "space refused", Err: err}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return &StartError{Code: CodeBroker, Reason: "jetstream context refused", Err: err}
	}
	for _, k := range storeKinds {
		bucket, err := n.Bucket(k)
		if err != nil {
			return &StartError{Code: CodeConfig, Reason: "space refused", Err: err}
		}
		refuse := func(reason string, err error) error {
			return &StartError{Code: CodeStore, Reason: "bucket " + bucket + " " + reason, Details: map[string]string{"bucket": bucket}, Err: err}
		}
		var want *provision.Item
		for i := range items {
			if items[i].Kind == provision.Bucket && items[i].Name == bucket {
				want = &items[i]
			}
		}
		if want == nil {
			return refuse("is not in the provisioning plan", nil)
		}
		st, err := js.Stream(ctx, want.Config.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return refuse("does not exist (provision the space)", err)
		case err != nil:
			return refuse("could not be read", err)
		}
		got := st.CachedInfo().Config
		cfg := want.Config
		cfg.Replicas = got.Replicas
		if diffs := provision.Compare(cfg, got); len(diffs) > 0 {
			return refuse("exists with another configuration", &provision.MismatchError{Kind: provision.Bucket, Name: bucket, Fields: diffs})
		}
	}
	return nil
}
