package profiles_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/cotalgo/cotal/pkg/lease"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestAuthPlaneBroker proves the auth-plane profile's plane claim on the broker: it can do what
// authd's plane claim needs (bind cotal_auth_<space>, create, update, read and delete key "plane",
// through pkg/lease as authd uses it) and the broker refuses it every other bucket, stream,
// consumer and subject. TestAuthPlaneLifecycleRows proves the lifecycle keys and the rails.
func TestAuthPlaneBroker(t *testing.T) {
	b := testkit.StartBroker(t, brokerSpace)
	n, must := names(t), mustOf(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, kp := b.Space(brokerSpace).MintUnlimited(t)
	admin, err := b.Connect(t, tok, kp)
	if err != nil {
		t.Fatal(err)
	}
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	authBucket := must(n.Bucket(space.Auth))
	// As pkg/provision makes it: per-key TTLs, no max_age, direct gets on.
	akv, err := ajs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: authBucket, LimitMarkerTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := akv.Put(ctx, "other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := ajs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: must(n.Bucket(space.Presence))}); err != nil {
		t.Fatal(err)
	}

	recordsStream := must(n.BucketStream(space.Records))
	if _, err := ajs.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: must(n.Bucket(space.Records))}); err != nil {
		t.Fatal(err)
	}

	t.Run("ok/reads-records-stream-info", func(t *testing.T) {
		nc := connectAs(t, b, principal{profiles.AuthPlane, none})
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, recordsStream)
		if err != nil || st.CachedInfo().Config.Name != recordsStream {
			t.Fatalf("records stream info as auth-plane: %v (broker errors %v)", err, b.AsyncErrors(nc))
		}
		if errs := b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("broker errors: %v", errs)
		}
	})

	t.Run("ok/claims-and-releases-plane", func(t *testing.T) {
		nc := connectAs(t, b, principal{profiles.AuthPlane, none})
		l, err := lease.Acquire(ctx, lease.Config{Conn: nc, Bucket: authBucket, Key: profiles.PlaneKey, Holder: "authd test", OpTimeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("Acquire as auth-plane: %v (broker errors %v)", err, b.AsyncErrors(nc))
		}
		if err := l.SetReady(ctx, true); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Renew(ctx); st != lease.Held || err != nil {
			t.Fatalf("Renew = %v, %v", st, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := akv.Get(ctx, profiles.PlaneKey); err == nil {
			t.Fatal("plane row still there after Release")
		}
		if errs := b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("broker refused the plane profile: %v", errs)
		}
	})

	t.Run("ok/account-connz-sweep", func(t *testing.T) {
		// The plane-reclaim sweep: the account-scoped CONNZ, filtered on a user key, answered by
		// the server with that user's data-account connections only.
		tok, kp := b.Space(brokerSpace).MintUser(t, profiles.AuthPlane, none, 0)
		nc, err := b.Connect(t, tok, kp)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			user string
			want int
		}{{must(kp.PublicKey()), 1}, {"UDOESNOTEXISTAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 0}} {
			m, err := nc.Request(space.AccountConnzPing, []byte(`{"user":"`+tc.user+`"}`), 5*time.Second)
			if err != nil {
				t.Fatalf("CONNZ request: %v (broker errors %v)", err, b.AsyncErrors(nc))
			}
			var resp struct {
				Server struct {
					ID string `json:"id"`
				} `json:"server"`
				Data struct {
					Conns []struct {
						Account string `json:"account"`
					} `json:"connections"`
				} `json:"data"`
				Error *struct{ Description string } `json:"error"`
			}
			if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Error != nil || resp.Server.ID == "" || len(resp.Data.Conns) != tc.want {
				t.Fatalf("CONNZ answer for %s = %s (%v), want %d connections", tc.user, m.Data, err, tc.want)
			}
		}
		if errs := b.AsyncErrors(nc); len(errs) != 0 {
			t.Fatalf("broker refused the CONNZ request: %v", errs)
		}
	})

	authStream := must(n.BucketStream(space.Auth))
	presenceStream := must(n.BucketStream(space.Presence))
	for _, tc := range []struct {
		name, subject string
		sub           bool
	}{
		{"fail/put-other-key", must(n.KV(space.Auth, "other")), false},
		{"fail/put-other-bucket", must(n.KV(space.Presence, "o1.a1")), false},
		{"fail/direct-get-other-key", must(space.DirectGetSubject(authStream, must(n.KV(space.Auth, "other")))), false},
		{"fail/direct-get-by-body", must(space.DirectGet(authStream)), false},
		{"fail/watch-consumer-create", must(space.ConsumerCreate(authStream)), false},
		{"fail/watch-consumer-create-filtered", must(space.ConsumerCreateAny(authStream)) + "", false},
		{"fail/bind-other-bucket", must(space.StreamInfo(presenceStream)), false},
		{"fail/records-direct-get", must(space.DirectGet(recordsStream)), false},
		{"fail/records-put-other-key", must(n.KV(space.Records, "other")), false},
		{"fail/delete-records-bucket", "$JS.API.STREAM.DELETE." + recordsStream, false},
		{"fail/delete-bucket", "$JS.API.STREAM.DELETE." + authStream, false},
		{"fail/purge-bucket", "$JS.API.STREAM.PURGE." + authStream, false},
		{"fail/update-bucket", must(space.StreamUpdate(authStream)), false},
		{"fail/chat", must(n.Chat("o1", "a1", "general")), false},
		{"fail/server-ping-connz", "$SYS.REQ.SERVER.PING.CONNZ", false},
		{"fail/account-direct-connz", "$SYS.REQ.ACCOUNT." + b.Space(brokerSpace).Trust.DataAccountPublicKey() + ".CONNZ", false},
		{"fail/sub-plane-key", must(n.KV(space.Auth, profiles.PlaneKey)), true},
		{"fail/sub-other-key", must(n.KV(space.Auth, "other")), true},
		{"fail/sub-whole-bucket", must(n.KVAll(space.Auth)), true},
		{"fail/sub-chat", n.ChatAll(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := connectAs(t, b, principal{profiles.AuthPlane, none})
			if tc.sub {
				if _, err := nc.SubscribeSync(tc.subject); err != nil {
					t.Fatal(err)
				}
				b.WaitAsyncError(t, nc, testkit.SubscribeViolation(tc.subject))
				return
			}
			if err := nc.Publish(tc.subject, []byte("{}")); err != nil {
				t.Fatal(err)
			}
			b.WaitAsyncError(t, nc, testkit.PublishViolation(tc.subject))
		})
	}
}
