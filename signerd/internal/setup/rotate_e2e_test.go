package setup_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// startConfBroker runs nats-server from DIR/broker/nats.conf itself (as `nats-server -c`), so
// Reload re-reads that file the way an operator's `nats-server --signal reload` does.
func startConfBroker(t *testing.T, dir string) *server.Server {
	t.Helper()
	conf := filepath.Join(dir, setup.BrokerDir, setup.BrokerConfigFile)
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refused %s: %v", conf, err)
	}
	if opts.ConfigFile != conf {
		t.Fatalf("config file %q, want %q", opts.ConfigFile, conf)
	}
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("broker not ready")
	}
	return s
}

// dialUser connects without reconnecting: a connection the broker drops stays closed.
func dialUser(url, userJWT string, kp nkeys.KeyPair) (*nats.Conn, error) {
	return nats.Connect(url,
		nats.UserJWT(func() (string, error) { return userJWT, nil }, kp.Sign),
		nats.NoReconnect(), nats.Timeout(5*time.Second))
}

// TestRotateDataKeyKeepsAgentsConnected walks the rotation procedure of docs/signerd.md against a real
// signerd and a real nats-server running from the rendered nats.conf: rotate, reload the broker,
// restart signerd, renew, retire, reload.
func TestRotateDataKeyKeepsAgentsConnected(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{})
	ns := startConfBroker(t, s.Dir)
	url := ns.ClientURL()
	c, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.ClientFor(t, mtls.KindDeliveryd, "alpha")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mint := func(t *testing.T) (*signerv1.Credential, nkeys.KeyPair) {
		t.Helper()
		kp, pub := newUser(t)
		var cred *signerv1.Credential
		// Right after a restart signerd may still be coming up: retry until it answers.
		testkit.Eventually(t, 10*time.Second, func() (err error) {
			cred, err = c.Mint(ctx, &signerv1.MintRequest{Space: "alpha", Profile: signerv1.Profile_PROFILE_DELIVERY, UserPublicKey: pub})
			return err
		})
		return cred, kp
	}
	oldPub := readPublic(t, s.Dir, "alpha").DataSigningKeys
	if len(oldPub) != 1 {
		t.Fatalf("data signing keys before rotation: %v", oldPub)
	}

	// An agent connected with a credential signed by the current (soon old) key.
	cred1, kp1 := mint(t)
	if cred1.GetSigningKey() != oldPub[0] {
		t.Fatalf("credential signed by %s, want %s", cred1.GetSigningKey(), oldPub[0])
	}
	nc1, err := dialUser(url, cred1.GetJwt(), kp1)
	if err != nil {
		t.Fatalf("old-key credential before rotation: %v", err)
	}
	defer nc1.Close()

	res, err := setup.Rotate(setup.RotateOptions{Dir: s.Dir, Space: "alpha"})
	if err != nil {
		t.Fatalf("rotate: %v", err)
	}
	newKey := res.Current
	if res.Old != oldPub[0] || newKey == oldPub[0] || !slices.Equal(res.SigningKeys, sorted(oldPub[0], newKey)) {
		t.Fatalf("rotate result old %s current %s keys %v; want old %s and both keys", res.Old, newKey, res.SigningKeys, oldPub[0])
	}
	if got := readPublic(t, s.Dir, "alpha").DataSigningKeys; !slices.Equal(got, res.SigningKeys) {
		t.Fatalf("public facts list %v, want %v", got, res.SigningKeys)
	}

	// The broker reloads nats.conf; the old-key connection is not dropped.
	if err := ns.Reload(); err != nil {
		t.Fatalf("broker reload after rotate: %v", err)
	}
	if err := nc1.Flush(); err != nil || nc1.IsClosed() {
		t.Fatalf("old-key connection after rotate and reload: flush %v, closed %v", err, nc1.IsClosed())
	}
	if nc, err := dialUser(url, cred1.GetJwt(), kp1); err != nil {
		t.Fatalf("old-key credential, new connection, after rotate: %v", err)
	} else {
		nc.Close()
	}

	// signerd restarted signs with the new key; the broker accepts it.
	s.Restart(t)
	cred2, kp2 := mint(t)
	if cred2.GetSigningKey() != newKey {
		t.Fatalf("after restart: credential signed by %s, want the new key %s", cred2.GetSigningKey(), newKey)
	}
	nc2, err := dialUser(url, cred2.GetJwt(), kp2)
	if err != nil {
		t.Fatalf("new-key credential: %v", err)
	}
	defer nc2.Close()

	// The agent renews its old-key credential: it comes back on the new key.
	re, err := c.Remint(ctx, "alpha", cred1.GetJwt(), kp1, 0)
	if err != nil {
		t.Fatalf("remint of the old-key credential: %v", err)
	}
	if re.GetSigningKey() != newKey || re.GetUserPublicKey() != cred1.GetUserPublicKey() {
		t.Fatalf("remint: signed by %s for %s; want %s for %s", re.GetSigningKey(), re.GetUserPublicKey(), newKey, cred1.GetUserPublicKey())
	}
	nc3, err := dialUser(url, re.GetJwt(), kp1)
	if err != nil {
		t.Fatalf("reminted credential: %v", err)
	}
	defer nc3.Close()

	// Retire and reload: the old key is gone from the broker; its connection is closed and its
	// credential refused, the new-key ones keep working.
	ret, err := setup.Rotate(setup.RotateOptions{Dir: s.Dir, Space: "alpha", Retire: true})
	if err != nil {
		t.Fatalf("retire: %v", err)
	}
	if ret.Old != oldPub[0] || ret.Current != newKey || !slices.Equal(ret.SigningKeys, []string{newKey}) {
		t.Fatalf("retire result old %s current %s keys %v", ret.Old, ret.Current, ret.SigningKeys)
	}
	oldFile := keystore.SecretPath(filepath.Join(s.Dir, setup.SignerDir), "alpha", keystore.FileDataSigning, false) + setup.OldSuffix
	if _, err := os.Lstat(oldFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("retired seed %s: %v, want removed", oldFile, err)
	}
	if err := ns.Reload(); err != nil {
		t.Fatalf("broker reload after retire: %v", err)
	}
	testkit.Eventually(t, 5*time.Second, func() error {
		if !nc1.IsClosed() {
			return errors.New("old-key connection still open after retire and reload")
		}
		return nil
	})
	if nc, err := dialUser(url, cred1.GetJwt(), kp1); err == nil {
		nc.Close()
		t.Fatal("old-key credential accepted after retire")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("old-key credential after retire: %v, want an authorization violation", err)
	}
	for name, nc := range map[string]*nats.Conn{"new-key": nc2, "reminted": nc3} {
		if err := nc.Flush(); err != nil || nc.IsClosed() {
			t.Fatalf("%s connection after retire: flush %v, closed %v", name, err, nc.IsClosed())
		}
	}
	if nc, err := dialUser(url, re.GetJwt(), kp1); err != nil {
		t.Fatalf("reminted credential after retire: %v", err)
	} else {
		nc.Close()
	}

	// signerd loads the retired layout too.
	s.Restart(t)
	if cred, _ := mint(t); cred.GetSigningKey() != newKey {
		t.Fatalf("after retire and restart: signed by %s, want %s", cred.GetSigningKey(), newKey)
	}
}

func sorted(v ...string) []string {
	slices.Sort(v)
	return v
}
