package setup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/pkg/trust"
	"github.com/cotalgo/cotal/signerd/internal/keystore"
)

// OldSuffix marks the previous signing seed kept beside the current one during a rotation:
// signer/<seg>/data-signing.nk.old. signerd never reads it; its presence means a rotation is in
// progress and only --retire may follow.
const OldSuffix = ".old"

// Account names the account a rotation acts on.
type Account string

// The two accounts of a space.
const (
	AccountData Account = "data"
	AccountAuth Account = "auth"
)

// RotateOptions configures Rotate.
type RotateOptions struct {
	// Dir is the init directory; its operator/ must be present. Required.
	Dir string
	// Space is the space name. Required.
	Space string
	// Account is data (the default when empty) or auth.
	Account Account
	// Retire ends a rotation: the account JWT lists only the new key and the old seed is removed.
	Retire bool
	// Now is the clock (the callout sentinel's issue time); nil means time.Now.
	Now func() time.Time
}

// RotateResult says what Rotate did. It names public keys and paths only.
type RotateResult struct {
	// SigningKeys are the account's signing public keys after the rotation, sorted.
	SigningKeys []string
	// Current is the signing key signerd signs with from now on (after its restart).
	Current string
	// Old is the key being (or, with Retire, just) retired.
	Old string
	// Changed are the files rewritten or removed, in the order they were.
	Changed []string
}

// InProgressError refuses a rotation while the previous one has not been retired, or a retire
// without a rotation.
type InProgressError struct{ Reason string }

func (e *InProgressError) Error() string { return "setup: rotate: " + e.Reason }

// Rotate starts (or, with Retire, ends) an account signing key rotation for one space:
//
//   - start: a new signing seed is generated; the account JWT is re-issued with the operator
//     signing key listing the current and the new key; public/<seg>.json (and for auth, its
//     sentinel, re-signed by the new key) and broker/nats.conf are rewritten; the current seed
//     is kept as <file>.old (a hard link, so it is never absent) and the new seed replaces
//     <file>, the name signerd reads.
//   - retire: the account JWT lists only the key in <file>; the same files are rewritten and
//     <file>.old is overwritten with zeros and removed.
//
// Every file is replaced atomically. Anything unexpected refuses before the first write: a
// missing operator seed (named), a rotation already in progress, a retire without one, a seed
// that the account JWT does not list. An interrupted run is recognised from the files and run
// again: a start that listed the new key but did not install its seed starts over with a fresh
// key; a retire that rewrote the JWT but did not remove the old seed removes it.
func Rotate(opts RotateOptions) (*RotateResult, error) {
	if opts.Dir == "" || opts.Space == "" {
		return nil, errors.New("setup: rotate: --dir and --space are required")
	}
	if err := space.ValidateName(opts.Space); err != nil {
		return nil, fmt.Errorf("setup: rotate: %w", err)
	}
	if opts.Account == "" {
		opts.Account = AccountData
	}
	var seedFile string
	switch opts.Account {
	case AccountData:
		seedFile = keystore.FileDataSigning
	case AccountAuth:
		seedFile = keystore.FileAuthSigning
	default:
		return nil, fmt.Errorf("setup: rotate: --account %q: want data or auth", opts.Account)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	root, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("setup: rotate: --dir: %w", err)
	}
	d := dirs(root)
	for _, p := range []string{d.operator, d.signer} {
		if err := creds.CheckSecretDir(p); err != nil {
			return nil, fmt.Errorf("setup: rotate needs %s (the operator seeds stay on the machine that rotates): %w", p, err)
		}
	}
	// The operator signing seed is what re-issues an account JWT: refuse, naming it, when it is
	// absent (operator/ moved off this machine).
	if _, err := os.Lstat(filepath.Join(d.operator, fileOperatorSigning)); err != nil {
		return nil, fmt.Errorf("setup: rotate needs the operator signing seed %s: %w", filepath.Join(d.operator, fileOperatorSigning), err)
	}
	broker, op, err := d.loadOperator()
	if err != nil {
		return nil, err
	}
	defer op.Wipe()

	pubPath := keystore.PublicSpacePath(d.public, opts.Space)
	ps, err := keystore.ReadPublicSpace(pubPath)
	if err != nil {
		return nil, fmt.Errorf("setup: rotate: %w", err)
	}
	sp, err := trust.LoadSpace(broker, opts.Space, ps.DataAccountJWT, ps.AuthAccountJWT)
	if err != nil {
		return nil, fmt.Errorf("setup: rotate: %s: %w", pubPath, err)
	}
	listed := sp.DataSigningKeys()
	accountJWT := ps.DataAccountJWT
	if opts.Account == AccountAuth {
		listed, accountJWT = sp.AuthSigningKeys(), ps.AuthAccountJWT
	}
	host, port, err := brokerListen(filepath.Join(d.broker, BrokerConfigFile))
	if err != nil {
		return nil, err
	}

	cur := keystore.SecretPath(d.signer, opts.Space, seedFile, false)
	old := cur + OldSuffix
	curPub, err := seedPublic(cur)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(listed, curPub) {
		return nil, fmt.Errorf("setup: rotate: the seed in %s (%s) is not a signing key of the %s account in %s (%v)", cur, curPub, opts.Account, pubPath, listed)
	}
	oldExists := exists(old)
	oldPub := ""
	if oldExists {
		if oldPub, err = seedPublic(old); err != nil {
			return nil, err
		}
	}
	res := &RotateResult{}

	var (
		newSeed *creds.Seed
		keys    []string
		// dropLink: a start interrupted after keeping the current seed as .old but before the
		// new seed replaced it left .old naming the current key; it is unlinked (not wiped: it
		// may be the same file) before the start runs again.
		dropLink bool
	)
	if !opts.Retire {
		switch {
		case len(listed) == 1 && !oldExists:
			// The ordinary start.
		case len(listed) == 2 && (!oldExists || oldPub == curPub):
			// A start interrupted before the new seed was installed: the account lists a key
			// whose seed exists nowhere. Run the start again with a fresh key in its place.
			dropLink = oldExists
		default:
			return nil, &InProgressError{Reason: fmt.Sprintf("a rotation of the %s account of space %q is in progress (%s exists, the account lists %d signing keys); finish it with --retire", opts.Account, opts.Space, old, len(listed))}
		}
		kp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, fmt.Errorf("setup: rotate: %w", err)
		}
		defer kp.Wipe()
		if newSeed, err = creds.SeedFromKeyPair(kp); err != nil {
			return nil, fmt.Errorf("setup: rotate: %w", err)
		}
		defer newSeed.Wipe()
		newPub, _ := kp.PublicKey()
		keys = []string{curPub, newPub}
		res.Old, res.Current = curPub, newPub
	} else {
		switch {
		case !oldExists:
			return nil, &InProgressError{Reason: fmt.Sprintf("no rotation of the %s account of space %q to retire: %s does not exist", opts.Account, opts.Space, old)}
		case oldPub == curPub:
			return nil, &InProgressError{Reason: fmt.Sprintf("%s holds the current key %s: the start was interrupted; run it again without --retire", old, curPub)}
		case len(listed) == 2 && slices.Contains(listed, oldPub):
			// The ordinary retire.
		case len(listed) == 1 && !slices.Contains(listed, oldPub):
			// A retire interrupted before the old seed was removed: finish it.
		default:
			return nil, &InProgressError{Reason: fmt.Sprintf("%s (%s) and %s (%s) are not the two signing keys the %s account lists (%v)", old, oldPub, cur, curPub, opts.Account, listed)}
		}
		keys = []string{curPub}
		res.Old, res.Current = oldPub, curPub
	}

	// Re-issue the account JWT: the same claims, the new signing key list, signed by the
	// operator signing key.
	newJWT, err := reissue(op, accountJWT, keys)
	if err != nil {
		return nil, err
	}
	dataJWT, authJWT := ps.DataAccountJWT, newJWT
	if opts.Account == AccountData {
		dataJWT, authJWT = newJWT, ps.AuthAccountJWT
	}
	nsp, err := trust.LoadSpace(broker, opts.Space, dataJWT, authJWT)
	if err != nil {
		return nil, fmt.Errorf("setup: rotate: re-issued account JWT: %w", err)
	}
	nps := *ps
	nps.DataAccountJWT, nps.DataSigningKeys = nsp.DataAccountJWT(), nsp.DataSigningKeys()
	nps.AuthAccountJWT, nps.AuthSigningKeys = nsp.AuthAccountJWT(), nsp.AuthSigningKeys()
	if opts.Account == AccountAuth && newSeed != nil {
		// The sentinel is signed by the callout signing key: re-sign it with the new key now,
		// so it stays valid after --retire.
		if nps.SentinelJWT, err = mintSentinel(nsp, &trust.SpaceSigning{AuthSigning: newSeed}, now()); err != nil {
			return nil, err
		}
	}

	// Writes. The public facts and nats.conf first: they list both keys, so a signerd restarted
	// at any point loads whichever seed it finds. Then the seed: the current one is kept as
	// .old (a hard link: the name signerd reads never disappears), and the new one replaces it.
	if err := keystore.WriteJSON(pubPath, nps, 0o644); err != nil {
		return nil, fmt.Errorf("setup: rotate: %w", err)
	}
	res.Changed = append(res.Changed, pubPath)
	conf, err := d.renderBroker(broker, host, port)
	if err != nil {
		return nil, err
	}
	res.Changed = append(res.Changed, conf)
	if newSeed != nil {
		if dropLink {
			if err := os.Remove(old); err != nil {
				return nil, fmt.Errorf("setup: rotate: %w", err)
			}
		}
		if err := os.Link(cur, old); err != nil {
			return nil, fmt.Errorf("setup: rotate: keep the current seed: %w", err)
		}
		res.Changed = append(res.Changed, old)
		if err := creds.WriteSeedFile(cur, newSeed); err != nil {
			return nil, fmt.Errorf("setup: rotate: %w", err)
		}
		res.Changed = append(res.Changed, cur)
	}
	if opts.Retire {
		if err := wipeFile(old); err != nil {
			return nil, fmt.Errorf("setup: rotate: remove the retired seed: %w", err)
		}
		res.Changed = append(res.Changed, old)
	}
	res.SigningKeys = slices.Clone(nps.DataSigningKeys)
	if opts.Account == AccountAuth {
		res.SigningKeys = slices.Clone(nps.AuthSigningKeys)
	}
	return res, nil
}

// reissue decodes an account JWT, replaces its signing keys and signs it with the operator
// signing key.
func reissue(op *trust.OperatorIdentity, accountJWT string, keys []string) (string, error) {
	ac, err := jwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return "", fmt.Errorf("setup: rotate: %w", err)
	}
	ac.SigningKeys = jwt.SigningKeys{}
	for _, k := range keys {
		ac.SigningKeys.Add(k)
	}
	kp, err := op.OperatorSigning.KeyPair()
	if err != nil {
		return "", fmt.Errorf("setup: rotate: operator signing seed: %w", err)
	}
	defer kp.Wipe()
	out, err := ac.Encode(kp)
	if err != nil {
		return "", fmt.Errorf("setup: rotate: encode account JWT: %w", err)
	}
	return out, nil
}

// brokerListen reads host and port from the rendered nats.conf so the re-render keeps them.
func brokerListen(path string) (string, int, error) {
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		return "", 0, fmt.Errorf("setup: rotate: %s: %w", path, err)
	}
	return o.Host, o.Port, nil
}

// seedPublic returns the public key of the account seed in path.
func seedPublic(path string) (string, error) {
	s, err := creds.ReadSeedFile(path)
	if err != nil {
		return "", fmt.Errorf("setup: rotate: %w", err)
	}
	defer s.Wipe()
	if k, err := s.Prefix(); err != nil || k != nkeys.PrefixByteAccount {
		return "", fmt.Errorf("setup: rotate: %s is not an account signing seed", path)
	}
	return s.Public()
}

// wipeFile overwrites a secret file with zeros, syncs it and unlinks it.
func wipeFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err == nil {
		_, err = f.WriteAt(make([]byte, fi.Size()), 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
