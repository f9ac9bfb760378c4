// Package ledger is authd's actor ledger: the single authorization source for which (owner,
// actor) pairs may exchange a bearer and connect, and with what scope, channels, role and
// lifecycle UID (upstream implementations/auth/src/ledger.ts; reference/auth.md §4 "Actor ledger").
//
// One JSON file per row, <state>/{actors|managed-actors}/<owner>.<actor>.json, mode 0600 in 0700
// directories owned by authd's uid, written atomically (pkg/creds). The two row spaces are
// disjoint: interactive rows (actors/) are exchanged with an IdP token, managed rows
// (managed-actors/) with the agent's own secret, whose SHA-256 they carry; Put refuses a
// principal the other space holds, and every read denies a principal found in both.
//
// Nothing is cached: every lookup reads the row's file, so a grant, narrowing or revocation bites
// at the very next exchange or connect without a restart. There is no allow by default: a missing
// row denies, and a row that cannot be read, decoded or validated denies its actor and fails List
// (it is never skipped, which would silently revoke or hide a grant). A file that is a symlink,
// looser than 0600, in a looser directory, or owned by another uid is refused like a broken row.
// The ledger holds no PII: owners are derived u_ tokens, labels are operator-chosen.
package ledger

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/space"
)

// Ledger reads and writes the rows under one state directory. It holds no state but the
// directory, so it is safe for concurrent use; concurrent writers of one row are last-writer-wins
// (each write is one atomic rename).
type Ledger struct {
	dir string
}

// Entry is one row with its row space, as List returns it.
type Entry struct {
	Kind Kind
	Row  Row
}

// Open returns the ledger under stateDir, creating the directory (0700) if it is missing. It
// refuses a state directory that is a symlink, not a directory, looser than 0700 or owned by
// another uid, naming it.
func Open(stateDir string) (*Ledger, error) {
	if stateDir == "" {
		return nil, errors.New("ledger: empty state directory")
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(abs); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(abs, creds.DirMode); err != nil {
			return nil, err
		}
		if err := os.Chmod(abs, creds.DirMode); err != nil {
			return nil, err
		}
	}
	if err := creds.CheckSecretDir(abs); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return &Ledger{dir: abs}, nil
}

// Dir is the state directory the ledger reads.
func (l *Ledger) Dir() string { return l.dir }

// Path is the file of the (owner, actor) row in space kind. It refuses an owner or actor outside
// its grammar, so no value can traverse out of the row space.
func (l *Ledger) Path(kind Kind, owner, actor string) (string, error) {
	if kind != Interactive && kind != Managed {
		return "", &Error{Err: ErrInvalidRow, Detail: fmt.Sprintf("unknown row space %.64q", string(kind))}
	}
	if err := space.ValidateDerivedOwner(owner); err != nil {
		return "", &Error{Err: ErrInvalidRow, Detail: err.Error()}
	}
	if err := space.ValidateActor(actor); err != nil {
		return "", &Error{Err: ErrInvalidRow, Detail: err.Error()}
	}
	return filepath.Join(l.dir, string(kind), owner+"."+actor+".json"), nil
}

// find reads the (owner, actor) row in one space. found is false when the row (or its space's
// directory) does not exist; any other failure is an error that denies.
func (l *Ledger) find(kind Kind, owner, actor string) (r Row, found bool, err error) {
	path, err := l.Path(kind, owner, actor)
	if err != nil {
		return Row{}, false, at(err, "", owner+"."+actor)
	}
	data, err := creds.ReadSecretFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, at(err, path, owner+"."+actor)
	}
	r, err = decodeRow(kind, data)
	if err != nil {
		return Row{}, false, at(err, path, owner+"."+actor)
	}
	if r.Owner != owner || r.Actor != actor {
		return Row{}, false, &Error{Err: ErrInvalidRow, Principal: owner + "." + actor, Path: path,
			Detail: fmt.Sprintf("the file holds the row of %s", r.Principal())}
	}
	return r, true, nil
}

// Get returns the (owner, actor) row from whichever space holds it: ErrNoRow if neither does,
// ErrBothSpaces if both do, ErrInvalidRow if either file is broken.
func (l *Ledger) Get(owner, actor string) (Row, Kind, error) {
	ir, iok, err := l.find(Interactive, owner, actor)
	if err != nil {
		return Row{}, "", err
	}
	mr, mok, err := l.find(Managed, owner, actor)
	if err != nil {
		return Row{}, "", err
	}
	switch {
	case iok && mok:
		return Row{}, "", &Error{Err: ErrBothSpaces, Principal: owner + "." + actor}
	case iok:
		return ir, Interactive, nil
	case mok:
		return mr, Managed, nil
	}
	return Row{}, "", &Error{Err: ErrNoRow, Principal: owner + "." + actor}
}

// AuthorizeConnect is the callout's ledger arm (reference/auth.md §3 step 13): the principal's
// row must exist in exactly one space, every entry of the bearer's scope must be in the row's
// current scope (a bearer minted before a narrowing is refused, not honoured until expiry), and
// lifecycleUID must be non-empty and equal to the row's (a predecessor incarnation's bearer never
// connects as its successor). It returns the row the grant is minted from.
func (l *Ledger) AuthorizeConnect(owner, actor string, scope []string, lifecycleUID string) (Row, error) {
	r, _, err := l.AuthorizeConnectKind(owner, actor, scope, lifecycleUID)
	return r, err
}

// AuthorizeConnectKind is AuthorizeConnect returning also the space the row is in: the callout
// reads a managed row's issuance gate, an interactive row has none.
func (l *Ledger) AuthorizeConnectKind(owner, actor string, scope []string, lifecycleUID string) (Row, Kind, error) {
	r, kind, err := l.Get(owner, actor)
	if err != nil {
		return Row{}, "", err
	}
	for _, s := range scope {
		if !slices.Contains(r.Scope, s) {
			return Row{}, "", &Error{Err: ErrScopeWidened, Principal: r.Principal(), Detail: fmt.Sprintf("%.64q", s)}
		}
	}
	if lifecycleUID == "" || lifecycleUID != r.LifecycleUID {
		return Row{}, "", &Error{Err: ErrLifecycleMismatch, Principal: r.Principal()}
	}
	return r, kind, nil
}

// AuthorizeGrant is the IdP exchange's check: interactive rows only. A principal held only by
// the managed space gets ErrManagedActor (never a bearer), one held by neither ErrNoRow, one held
// by both ErrBothSpaces. A row with a parent must still sit within its whole spawner chain
// (ErrSpawnerChain; see the chain rule at AuthorizeAgentExchange).
func (l *Ledger) AuthorizeGrant(owner, actor string) (Row, error) {
	r, kind, err := l.Get(owner, actor)
	if err != nil {
		return Row{}, err
	}
	if kind != Interactive {
		return Row{}, &Error{Err: ErrManagedActor, Principal: r.Principal()}
	}
	if err := l.withinSpawnerGrant(r); err != nil {
		return Row{}, err
	}
	return r, nil
}

// AuthorizeAgentExchange is the agent exchange's check: managed rows only, and actorToken's
// SHA-256 must equal the row's tokenHash (compared in constant time). Until the secret has
// matched, every refusal (no row, a row in the other or in both spaces, a broken row, a wrong
// secret) is ErrAgentExchange, so the answer says nothing about which rows exist; and every one
// of them does the same work (hash the token, compare it in constant time: against the row's
// hash, or against dummyTokenHash when there is no usable managed row), so neither does the time
// the answer takes. After it, the
// row must sit within its spawner chain, re-checked on every exchange so that narrowing or
// revoking a spawner bites its agents at their next refresh: walking parent links up to an
// admin-scoped or parentless row, every link must exist, stay within one owner, not loop, and
// grant the child's scope, channels (by broker reach: withinChannels) and role:<role>
// (ErrSpawnerChain).
func (l *Ledger) AuthorizeAgentExchange(owner, actor, actorToken string) (Row, error) {
	deny := &Error{Err: ErrAgentExchange, Principal: owner + "." + actor}
	r, kind, err := l.Get(owner, actor)
	usable := err == nil && kind == Managed
	wantHex := dummyTokenHash
	if usable {
		wantHex = r.TokenHash
	}
	want, herr := hex.DecodeString(wantHex)
	got := sha256.Sum256([]byte(actorToken))
	match := constantTimeCompare(got[:], want) == 1
	switch {
	case err != nil:
		deny.Detail = err.Error()
		return Row{}, deny
	case !usable:
		deny.Detail = "the row is not a managed row"
		return Row{}, deny
	case herr != nil || !match:
		deny.Detail = "the secret does not match the row's hash"
		return Row{}, deny
	}
	if err := l.withinSpawnerGrant(r); err != nil {
		return Row{}, err
	}
	return r, nil
}

// dummyTokenHash stands in for a managed row's tokenHash when there is none, so the no-row path
// hashes and compares like the wrong-token path. It is the SHA-256 of a fixed string that no
// secret from NewActorToken (43 base64url characters) can equal; and a match against it is
// refused all the same.
var dummyTokenHash = HashActorToken("cotal authd: no managed row: dummy token hash")

// constantTimeCompare is subtle.ConstantTimeCompare; a variable so a test can count the compares.
var constantTimeCompare = subtle.ConstantTimeCompare

// withinSpawnerGrant walks r's parent chain (see AuthorizeAgentExchange).
func (l *Ledger) withinSpawnerGrant(r Row) error {
	chainErr := func(format string, args ...any) error {
		return &Error{Err: ErrSpawnerChain, Principal: r.Principal(), Detail: fmt.Sprintf(format, args...)}
	}
	seen := map[string]bool{r.Principal(): true}
	child := r
	for depth := 0; child.Parent != ""; depth++ {
		if depth >= maxChainLength {
			return chainErr("the parent chain is longer than %d links", maxChainLength)
		}
		if seen[child.Parent] {
			return chainErr("the parent chain loops at %s", child.Parent)
		}
		seen[child.Parent] = true
		pOwner, pActor, err := SplitPrincipal(child.Parent)
		if err != nil {
			return chainErr("%v", err)
		}
		parent, _, err := l.Get(pOwner, pActor)
		if errors.Is(err, ErrNoRow) {
			return chainErr("spawner %s is not (or no longer) granted", child.Parent)
		}
		if err != nil {
			return err
		}
		if slices.Contains(parent.Scope, "admin") {
			return nil
		}
		if child.Owner != pOwner {
			return chainErr("%s and its spawner %s have different owners", child.Principal(), child.Parent)
		}
		var over []string
		for _, s := range child.Scope {
			if !slices.Contains(parent.Scope, s) {
				over = append(over, "scope "+s)
			}
		}
		for _, ch := range child.AllowSubscribe {
			if !withinChannels(parent.AllowSubscribe, ch) {
				over = append(over, "subscribe "+ch)
			}
		}
		for _, ch := range child.AllowPublish {
			if !withinChannels(parent.AllowPublish, ch) {
				over = append(over, "publish "+ch)
			}
		}
		if child.Role != "" && !slices.Contains(parent.Scope, "role:"+child.Role) {
			over = append(over, "role "+child.Role)
		}
		if len(over) > 0 {
			return chainErr("%s holds %s beyond its spawner %s", child.Principal(), strings.Join(over, ", "), child.Parent)
		}
		child = parent
	}
	return nil
}

// withinChannels reports whether channel pattern ch reaches nothing on the broker that one of the
// spawner's patterns does not: each side is judged by its reach (space.ChannelReach: a last-token
// '*' reaches the whole subtree, as the broker lets it), so a spawner's "team.*" covers a child's
// "team.>" and "team.x", while a spawner's "team.x" covers neither "team.*" nor "team.>".
func withinChannels(parent []string, ch string) bool {
	reach := space.ChannelReach(ch)
	return slices.ContainsFunc(parent, func(p string) bool { return space.PatternCovers(space.ChannelReach(p), reach) })
}

// Put writes r as the row of its principal in space kind, replacing any row there (an upsert).
// It validates every field (see the row grammar on Row's checks: ErrInvalidRow), sets Ver, and
// rotates nothing itself: the caller supplies the lifecycle UID and grant time. It refuses a
// principal the other space holds (ErrOtherSpace), and a managed row outside its spawner chain
// (ErrSpawnerChain). If the other space gains the principal while the row is being written, the
// new row is removed again and the Put refused, so at most one row survives.
func (l *Ledger) Put(kind Kind, r Row) error {
	r, err := l.check(kind, r)
	if err != nil {
		return err
	}
	path, err := l.Path(kind, r.Owner, r.Actor)
	if err != nil {
		return err
	}
	other := otherKind(kind)
	data, err := encodeRow(r)
	if err != nil {
		return err
	}
	if err := creds.WriteFileAtomic(path, data); err != nil {
		return at(err, path, r.Principal())
	}
	if err := l.refuseOther(other, r); err != nil {
		if rerr := l.Revoke(kind, r.Owner, r.Actor); rerr != nil && !errors.Is(rerr, ErrNoRow) {
			return errors.Join(err, rerr)
		}
		return err
	}
	return nil
}

// Check decides what Put would refuse of r in space kind (the row grammar, the other space, the
// spawner chain) and writes nothing: a writer that must take other steps before the row (an
// enrollment activates its lifecycle first) refuses up front what Put would refuse after them.
// Put checks again.
func (l *Ledger) Check(kind Kind, r Row) error {
	_, err := l.check(kind, r)
	return err
}

// check is Put's decision: r normalized (Ver, nil lists), or its refusal.
func (l *Ledger) check(kind Kind, r Row) (Row, error) {
	if r.Ver == 0 {
		r.Ver = Version
	}
	r.Scope = nonNil(r.Scope)
	r.AllowSubscribe = nonNil(r.AllowSubscribe)
	r.AllowPublish = nonNil(r.AllowPublish)
	if err := validate(kind, r); err != nil {
		return Row{}, at(err, "", r.Owner+"."+r.Actor)
	}
	if _, err := l.Path(kind, r.Owner, r.Actor); err != nil {
		return Row{}, err
	}
	if err := l.refuseOther(otherKind(kind), r); err != nil {
		return Row{}, err
	}
	if kind == Managed {
		if err := l.withinSpawnerGrant(r); err != nil {
			return Row{}, err
		}
	}
	return r, nil
}

func (l *Ledger) refuseOther(other Kind, r Row) error {
	_, found, err := l.find(other, r.Owner, r.Actor)
	if err != nil {
		return err
	}
	if found {
		return &Error{Err: ErrOtherSpace, Principal: r.Principal(), Detail: "held by " + string(other)}
	}
	return nil
}

// Revoke removes the (owner, actor) row from space kind: ErrNoRow if there is none. The removal is
// made durable (the directory is fsynced) before it returns. Connections already admitted live
// until their credential's expiry, which the callout binds to the bearer's (at most 900 s).
func (l *Ledger) Revoke(kind Kind, owner, actor string) error {
	path, err := l.Path(kind, owner, actor)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := creds.CheckSecretDir(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return &Error{Err: ErrNoRow, Principal: owner + "." + actor}
		}
		return at(err, dir, owner+"."+actor)
	}
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return &Error{Err: ErrNoRow, Principal: owner + "." + actor}
		}
		return err
	}
	return syncDir(dir)
}

// List returns every row of both spaces, interactive first, each space in file-name order. It
// fails closed: a broken row, a file whose name is not its row's principal, a principal in both
// spaces, or an unreadable space directory fails the whole listing rather than hiding a grant.
// Files not ending in .json (the atomic writer's temporaries) are ignored.
func (l *Ledger) List() ([]Entry, error) {
	var out []Entry
	seen := map[string]Kind{}
	for _, kind := range []Kind{Interactive, Managed} {
		dir := filepath.Join(l.dir, string(kind))
		if err := creds.CheckSecretDir(dir); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return nil, at(err, dir, "")
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), ".json") {
				names = append(names, e.Name())
			}
		}
		sort.Strings(names)
		for _, name := range names {
			path := filepath.Join(dir, name)
			data, err := creds.ReadSecretFile(path)
			if err != nil {
				return nil, at(err, path, "")
			}
			r, err := decodeRow(kind, data)
			if err != nil {
				return nil, at(err, path, "")
			}
			if name != r.Principal()+".json" {
				return nil, &Error{Err: ErrInvalidRow, Principal: r.Principal(), Path: path, Detail: "the file name is not the row's principal"}
			}
			if _, dup := seen[r.Principal()]; dup {
				return nil, &Error{Err: ErrBothSpaces, Principal: r.Principal()}
			}
			seen[r.Principal()] = kind
			out = append(out, Entry{Kind: kind, Row: r})
		}
	}
	return out, nil
}

// HashActorToken is the tokenHash a managed row stores for an agent's exchange secret: the
// lower-case hex SHA-256 of its bytes.
func HashActorToken(actorToken string) string {
	sum := sha256.Sum256([]byte(actorToken))
	return hex.EncodeToString(sum[:])
}

// NewActorToken returns a fresh agent exchange secret (32 random bytes, base64url) and its hash.
// The secret is handed to the agent once and never stored; the row keeps the hash.
func NewActorToken() (token, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	token = base64.RawURLEncoding.EncodeToString(b[:])
	return token, HashActorToken(token), nil
}

func otherKind(k Kind) Kind {
	if k == Interactive {
		return Managed
	}
	return Interactive
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func syncDir(dir string) error {
	d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("%s: fsync directory: %w", dir, err)
	}
	return nil
}
