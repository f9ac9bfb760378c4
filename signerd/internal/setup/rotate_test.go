package setup_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"

	"github.com/cotalgo/cotal/signerd/internal/keystore"
	"github.com/cotalgo/cotal/signerd/internal/setup"
)

// openStore loads the init directory the way signerd does at start.
func openStore(t *testing.T, dir string) *keystore.Store {
	t.Helper()
	st, err := keystore.Open(keystore.Config{KeyDir: filepath.Join(dir, setup.SignerDir), PublicDir: filepath.Join(dir, setup.PublicDir)})
	if err != nil {
		t.Fatalf("keystore.Open: %v", err)
	}
	t.Cleanup(st.Close)
	return st
}

// TestRotateAuthAccount rotates the callout account: its JWT lists both keys, the sentinel is
// re-signed by the new key, signerd's key store loads at each step, and the broker accepts the
// rendered nats.conf; after --retire only the new key is listed and the old seed is gone.
func TestRotateAuthAccount(t *testing.T) {
	dir := newDir(t)
	mustInit(t, setup.Options{Dir: dir, Spaces: []string{"alpha", "beta"}})
	before := readPublic(t, dir, "alpha")
	beta := readPublic(t, dir, "beta")
	secrets := secretValues(t, dir)

	res, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Account: setup.AccountAuth})
	if err != nil {
		t.Fatal(err)
	}
	after := readPublic(t, dir, "alpha")
	if !slices.Equal(after.AuthSigningKeys, sorted(before.AuthSigningKeys[0], res.Current)) || res.Old != before.AuthSigningKeys[0] {
		t.Fatalf("auth signing keys %v, want old %s and new %s", after.AuthSigningKeys, before.AuthSigningKeys[0], res.Current)
	}
	if !slices.Equal(after.DataSigningKeys, before.DataSigningKeys) || after.DataAccountJWT != before.DataAccountJWT {
		t.Fatal("an auth rotation changed the data account")
	}
	if got := readPublic(t, dir, "beta"); got.AuthAccountJWT != beta.AuthAccountJWT || got.DataAccountJWT != beta.DataAccountJWT {
		t.Fatal("rotating alpha changed beta")
	}
	uc, err := jwt.DecodeUserClaims(after.SentinelJWT)
	if err != nil || uc.Issuer != res.Current {
		t.Fatalf("sentinel issued by %v (%v), want the new key %s", uc, err, res.Current)
	}
	ac, err := jwt.DecodeAccountClaims(after.AuthAccountJWT)
	if err != nil || ac.Name != "AUTH_"+before.Token || !slices.Equal([]string(ac.Authorization.AuthUsers), before.CalloutUsers) {
		t.Fatalf("re-issued callout account lost its claims: %v %v", ac, err)
	}
	st := openStore(t, dir)
	if sp, _ := st.Space("alpha"); sp.AuthSigning.Public() != res.Current {
		t.Fatalf("signerd would sign callouts with %s, want %s", sp.AuthSigning.Public(), res.Current)
	}
	startBroker(t, dir)

	// Modes: both seeds 0600; no seed in any public file.
	seedFile := filepath.Join(dir, setup.SignerDir, seg("alpha"), keystore.FileAuthSigning)
	for _, p := range []string{seedFile, seedFile + setup.OldSuffix} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want 0600", p, fi, err)
		}
	}
	if m := modes(t, dir)[filepath.Join(setup.SignerDir, seg("alpha"))+"/"]; m != 0o700 {
		t.Fatalf("signer dir mode %v", m)
	}
	// The old seed is the one init wrote.
	if !bytes.Equal(bytes.TrimSpace(readFile(t, seedFile+setup.OldSuffix)), secrets[seedFile]) {
		t.Fatal("the .old file is not the previous seed")
	}
	noSeedsIn(t, dir)

	ret, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Account: setup.AccountAuth, Retire: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := readPublic(t, dir, "alpha").AuthSigningKeys; !slices.Equal(got, []string{res.Current}) || ret.Old != res.Old {
		t.Fatalf("after retire: keys %v, retired %s", got, ret.Old)
	}
	if _, err := os.Lstat(seedFile + setup.OldSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("retired seed still there: %v", err)
	}
	openStore(t, dir)
	startBroker(t, dir)
	noSeedsIn(t, dir)
}

// noSeedsIn checks that no public file holds a seed.
func noSeedsIn(t *testing.T, dir string) {
	t.Helper()
	for _, sub := range []string{setup.PublicDir, setup.BrokerDir} {
		for _, p := range regularFiles(t, filepath.Join(dir, sub)) {
			if seedPattern.Match(readFile(t, p)) {
				t.Fatalf("%s holds a seed", p)
			}
		}
	}
}

// TestRotateRefusals: each ambiguous or impossible request is refused before anything changes.
func TestRotateRefusals(t *testing.T) {
	dir := newDir(t)
	mustInit(t, setup.Options{Dir: dir, Spaces: []string{"alpha"}})
	snapshot := func() map[string]string {
		out := map[string]string{}
		for _, p := range regularFiles(t, dir) {
			out[p] = string(readFile(t, p))
		}
		return out
	}
	refuse := func(name string, opts setup.RotateOptions, want string) {
		t.Helper()
		before := snapshot()
		_, err := setup.Rotate(opts)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v, want an error containing %q", name, err, want)
		}
		if seedPattern.MatchString(err.Error()) {
			t.Fatalf("%s: the error quotes a seed", name)
		}
		after := snapshot()
		if len(before) != len(after) {
			t.Fatalf("%s: files changed: %d → %d", name, len(before), len(after))
		}
		for p, v := range before {
			if after[p] != v {
				t.Fatalf("%s: %s changed", name, p)
			}
		}
	}
	var inProgress *setup.InProgressError

	refuse("retire without rotation", setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true}, "no rotation of the data account")
	refuse("unknown account", setup.RotateOptions{Dir: dir, Space: "alpha", Account: "sys"}, `--account "sys"`)
	refuse("unknown space", setup.RotateOptions{Dir: dir, Space: "gamma"}, seg("gamma")+".json")

	// Operator signing seed missing (operator/ partly moved away): named.
	opSigning := filepath.Join(dir, setup.OperatorDir, "operator-signing.nk")
	if err := os.Rename(opSigning, opSigning+".away"); err != nil {
		t.Fatal(err)
	}
	refuse("operator signing seed missing", setup.RotateOptions{Dir: dir, Space: "alpha"}, opSigning)
	if err := os.Rename(opSigning+".away", opSigning); err != nil {
		t.Fatal(err)
	}
	// operator/ moved off the machine: named.
	opDir := filepath.Join(dir, setup.OperatorDir)
	if err := os.Rename(opDir, opDir+".offline"); err != nil {
		t.Fatal(err)
	}
	refuse("operator directory missing", setup.RotateOptions{Dir: dir, Space: "alpha"}, opDir)
	if err := os.Rename(opDir+".offline", opDir); err != nil {
		t.Fatal(err)
	}

	if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha"}); err != nil {
		t.Fatal(err)
	}
	refuse("second rotation", setup.RotateOptions{Dir: dir, Space: "alpha"}, "in progress")
	if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha"}); !errors.As(err, &inProgress) {
		t.Fatalf("second rotation: %v, want *InProgressError", err)
	}
	// The other account rotates independently.
	if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Account: setup.AccountAuth}); err != nil {
		t.Fatalf("auth rotation during a data rotation: %v", err)
	}
	// A seed that the account does not list (a foreign .old) refuses the retire.
	old := filepath.Join(dir, setup.SignerDir, seg("alpha"), keystore.FileDataSigning+setup.OldSuffix)
	authOld := filepath.Join(dir, setup.SignerDir, seg("alpha"), keystore.FileAuthSigning+setup.OldSuffix)
	saved := readFile(t, old)
	if err := os.WriteFile(old, readFile(t, authOld), 0o600); err != nil {
		t.Fatal(err)
	}
	refuse("foreign old seed", setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true}, "are not the two signing keys")
	if err := os.WriteFile(old, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true}); err != nil {
		t.Fatalf("retire: %v", err)
	}
	if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Account: setup.AccountAuth, Retire: true}); err != nil {
		t.Fatalf("retire auth: %v", err)
	}
	// After both retirements a new rotation may start.
	if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha"}); err != nil {
		t.Fatalf("rotation after retire: %v", err)
	}
	openStore(t, dir)
}

// TestRotateResumesInterruptedRuns builds each state a crash between Rotate's writes leaves and
// shows a rerun finishes it: signerd's key store loads and the broker accepts the result.
func TestRotateResumesInterruptedRuns(t *testing.T) {
	type state func(t *testing.T, cur, old string, saved []byte)
	for _, tc := range []struct {
		name string
		// crash turns a completed start into the interrupted state.
		crash state
		rerun setup.RotateOptions
	}{
		{
			// public facts and nats.conf written, nothing else: the new key has no seed.
			name: "ok/start-before-link",
			crash: func(t *testing.T, cur, old string, saved []byte) {
				mustWriteSeed(t, cur, saved)
				if err := os.Remove(old); err != nil {
					t.Fatal(err)
				}
			},
			rerun: setup.RotateOptions{Space: "alpha"},
		},
		{
			// .old linked, the new seed not yet in place.
			name: "ok/start-after-link",
			crash: func(t *testing.T, cur, old string, saved []byte) {
				mustWriteSeed(t, cur, saved)
				if err := os.Remove(old); err != nil {
					t.Fatal(err)
				}
				if err := os.Link(cur, old); err != nil {
					t.Fatal(err)
				}
			},
			rerun: setup.RotateOptions{Space: "alpha"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := newDir(t)
			mustInit(t, setup.Options{Dir: dir, Spaces: []string{"alpha"}})
			cur := filepath.Join(dir, setup.SignerDir, seg("alpha"), keystore.FileDataSigning)
			old := cur + setup.OldSuffix
			saved := readFile(t, cur)
			first, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha"})
			if err != nil {
				t.Fatal(err)
			}
			tc.crash(t, cur, old, saved)
			// A retire now would drop the key signerd signs with: refused.
			if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true}); err == nil {
				t.Fatal("retire of an interrupted start accepted")
			}
			tc.rerun.Dir = dir
			res, err := setup.Rotate(tc.rerun)
			if err != nil {
				t.Fatalf("rerun: %v", err)
			}
			if res.Old != first.Old || res.Current == first.Current || !slices.Equal(res.SigningKeys, sorted(first.Old, res.Current)) {
				t.Fatalf("rerun: old %s current %s keys %v; first run old %s current %s", res.Old, res.Current, res.SigningKeys, first.Old, first.Current)
			}
			if !bytes.Equal(readFile(t, old), saved) {
				t.Fatal(".old is not the original seed")
			}
			if sp, _ := openStore(t, dir).Space("alpha"); sp.DataSigning.Public() != res.Current {
				t.Fatalf("signerd would sign with %s, want %s", sp.DataSigning.Public(), res.Current)
			}
			startBroker(t, dir)
			if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true}); err != nil {
				t.Fatalf("retire: %v", err)
			}
		})
	}

	t.Run("ok/retire-before-remove", func(t *testing.T) {
		dir := newDir(t)
		mustInit(t, setup.Options{Dir: dir, Spaces: []string{"alpha"}})
		cur := filepath.Join(dir, setup.SignerDir, seg("alpha"), keystore.FileDataSigning)
		saved := readFile(t, cur)
		first, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true}); err != nil {
			t.Fatal(err)
		}
		// The JWT lists the new key only; the old seed was not removed yet.
		mustWriteSeed(t, cur+setup.OldSuffix, saved)
		if _, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha"}); err == nil {
			t.Fatal("start during an interrupted retire accepted")
		}
		res, err := setup.Rotate(setup.RotateOptions{Dir: dir, Space: "alpha", Retire: true})
		if err != nil {
			t.Fatalf("rerun retire: %v", err)
		}
		if res.Old != first.Old || !slices.Equal(res.SigningKeys, []string{first.Current}) {
			t.Fatalf("rerun retire: old %s keys %v", res.Old, res.SigningKeys)
		}
		if _, err := os.Lstat(cur + setup.OldSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("old seed still there: %v", err)
		}
		openStore(t, dir)
	})
}

// mustWriteSeed replaces a seed file with data, 0600.
func mustWriteSeed(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
