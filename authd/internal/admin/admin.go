// Package admin holds authd's operator commands, which work on the state dir alone (no running
// authd, no signerd): `authd actor grant|revoke|list` on the actor ledger and `authd idp pin URL`.
// authd's main dispatches to Actor and IdP with the arguments after the command word.
//
// It refuses unknown flags, missing or malformed values (naming the flag), extra arguments, a
// state dir looser than 0700, and every row the ledger refuses. A grant always writes a whole row
// (every field from the flags) with a new lifecycle uid, so bearers of the previous grant stop
// connecting; it never widens what a flag left out: an absent channel list grants no channel.
package admin

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cotalgo/cotal/authd/internal/idp"
	"github.com/cotalgo/cotal/authd/internal/ledger"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/signerclient"
)

// ErrHelp is returned after --help printed the usage; the command succeeded.
var ErrHelp = flag.ErrHelp

// UsageError is a command line that could not be parsed; main should exit 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

func usagef(format string, a ...any) error { return &UsageError{Msg: fmt.Sprintf(format, a...)} }

// Env is what the commands need from main.
type Env struct {
	// Stdout receives results and --help; Stderr receives flag errors.
	Stdout, Stderr io.Writer
	// StateDir is authd's state dir from its config, if main resolved one; --state-dir overrides.
	StateDir string
	// Now is the clock (grantedAt); nil means time.Now.
	Now func() time.Time
	// HTTPClient probes the IdP's JWKS; nil means a client with a 10 s timeout and no redirects.
	HTTPClient *http.Client
	// DeriveOwner asks signerd for the owner id of an IdP identity (DeriveOwner RPC); main sets
	// it when authd's config names signerd. nil makes --subject an error: pass --owner instead.
	DeriveOwner func(ctx context.Context, idpIssuer, subject string) (string, error)
}

func (e Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

const actorUsage = `usage:
  authd actor grant  (--owner u_... | --subject SUB) --actor NAME [--scope W,...]
                     [--allow-subscribe CH,...] [--allow-publish CH,...] [--role R]
                     [--parent u_....ACTOR] [--label TEXT] [--state-dir DIR]
  authd actor revoke (--owner u_... | --subject SUB) --actor NAME [--managed] [--state-dir DIR]
  authd actor list   [--json] [--state-dir DIR]

grant writes the interactive row of owner.actor, replacing any row it had: every field comes from
the flags (a flag left out is empty, never a wildcard) and the row gets a new lifecycle uid, so
bearers minted under the previous grant no longer connect. revoke removes the row (--managed: the
managed row the spawn path wrote); the next exchange and the next connect are refused, without a
restart. list prints every row of both row spaces (never a token hash). --subject names the
owner by the IdP subject instead (the sub claim of the pinned IdP's tokens): signerd derives the
owner id, so it needs authd's config.
`

// Actor runs `authd actor SUBCOMMAND ...`; args are what follows "actor".
func Actor(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 {
		return usagef("authd actor: a subcommand is required (grant, revoke, list)\n%s", actorUsage)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(env.Stdout, actorUsage)
		return ErrHelp
	case "grant":
		return grant(ctx, args[1:], env)
	case "revoke":
		return revoke(ctx, args[1:], env)
	case "list":
		return list(args[1:], env)
	default:
		return usagef("authd actor: unknown subcommand %.40q (grant, revoke, list)", args[0])
	}
}

// flags returns a FlagSet that prints its usage to env.Stdout on --help and its errors to
// env.Stderr.
func flags(name, usage string, env Env) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	fs.Usage = func() {
		fmt.Fprint(env.Stdout, usage)
		fs.SetOutput(env.Stdout)
		fs.PrintDefaults()
		fs.SetOutput(env.Stderr)
	}
	return fs
}

// parse parses args, refusing positional leftovers, and opens the ledger under the state dir.
func parse(fs *flag.FlagSet, args []string, stateDir *string, positional int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ErrHelp
		}
		return usagef("%s: %v", fs.Name(), err)
	}
	if fs.NArg() != positional {
		if positional == 0 {
			return usagef("%s: unexpected argument %.80q", fs.Name(), fs.Arg(0))
		}
		return usagef("%s: want %d argument(s), got %d", fs.Name(), positional, fs.NArg())
	}
	if *stateDir == "" {
		return usagef("%s: --state-dir is required (or run it with authd's --config)", fs.Name())
	}
	return nil
}

// list splits a comma-separated flag value; "" is the empty list.
func splitList(s string) []string {
	if s == "" {
		return []string{}
	}
	out := strings.Split(s, ",")
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	return out
}

func grant(ctx context.Context, args []string, env Env) error {
	fs := flags("authd actor grant", actorUsage, env)
	stateDir := fs.String("state-dir", env.StateDir, "authd's state dir")
	owner := fs.String("owner", "", "the derived owner (u_ and 26 base32 characters)")
	subject := fs.String("subject", "", "the IdP subject whose owner to grant (instead of --owner)")
	actor := fs.String("actor", "", "the actor")
	scope := fs.String("scope", "", "comma-separated scope: capability words [a-z][a-z0-9_-]{0,31} carried in the bearer (admin, spawn, supervise, ...) and role:R delegation tokens kept in the ledger")
	sub := fs.String("allow-subscribe", "", "comma-separated channels the actor may read")
	pub := fs.String("allow-publish", "", "comma-separated channels the actor may post to")
	role := fs.String("role", "", "the actor's role")
	parent := fs.String("parent", "", "the spawning principal, <owner>.<actor>")
	label := fs.String("label", "", "a short label")
	if err := parse(fs, args, stateDir, 0); err != nil {
		return err
	}
	if err := resolveOwner(ctx, "authd actor grant", *stateDir, owner, *subject, *actor, env); err != nil {
		return err
	}
	l, err := ledger.Open(*stateDir)
	if err != nil {
		return err
	}
	uid, err := NewLifecycleUID()
	if err != nil {
		return err
	}
	row := ledger.Row{
		Ver: ledger.Version, Owner: *owner, Actor: *actor, Scope: splitList(*scope),
		AllowSubscribe: splitList(*sub), AllowPublish: splitList(*pub), Role: *role, Parent: *parent,
		Label: *label, LifecycleUID: uid, GrantedAt: env.now().UnixMilli(),
	}
	if err := l.Put(ledger.Interactive, row); err != nil {
		return fmt.Errorf("authd actor grant: %w", err)
	}
	fmt.Fprintf(env.Stdout, "granted %s.%s (lifecycle uid %s)\n", *owner, *actor, uid)
	return nil
}

func revoke(ctx context.Context, args []string, env Env) error {
	fs := flags("authd actor revoke", actorUsage, env)
	stateDir := fs.String("state-dir", env.StateDir, "authd's state dir")
	owner := fs.String("owner", "", "the derived owner")
	subject := fs.String("subject", "", "the IdP subject whose owner to revoke (instead of --owner)")
	actor := fs.String("actor", "", "the actor")
	managed := fs.Bool("managed", false, "revoke the managed row (written by spawn) instead of the interactive one")
	if err := parse(fs, args, stateDir, 0); err != nil {
		return err
	}
	if err := resolveOwner(ctx, "authd actor revoke", *stateDir, owner, *subject, *actor, env); err != nil {
		return err
	}
	l, err := ledger.Open(*stateDir)
	if err != nil {
		return err
	}
	kind := ledger.Interactive
	if *managed {
		kind = ledger.Managed
	}
	if err := l.Revoke(kind, *owner, *actor); err != nil {
		return fmt.Errorf("authd actor revoke: %w", err)
	}
	fmt.Fprintf(env.Stdout, "revoked %s.%s (%s)\n", *owner, *actor, kind)
	return nil
}

// SignerAPI is what SignerDeriveOwner needs; *signerclient.Client satisfies it.
type SignerAPI interface {
	API() signerv1.SignerServiceClient
}

// SignerDeriveOwner returns an Env.DeriveOwner that asks signerd (as authd, for spaceName).
func SignerDeriveOwner(c SignerAPI, spaceName string) func(ctx context.Context, idpIssuer, subject string) (string, error) {
	return func(ctx context.Context, idpIssuer, subject string) (string, error) {
		resp, err := c.API().DeriveOwner(ctx, &signerv1.DeriveOwnerRequest{Space: spaceName, IdpIssuer: idpIssuer, Subject: subject})
		if err != nil {
			return "", signerclient.AsError(err)
		}
		return resp.GetOwner(), nil
	}
}

// resolveOwner requires an actor and exactly one of --owner and --subject, and sets *owner from
// the subject through signerd under the pinned IdP's issuer (the exchange derives it the same
// way, so the row lands where the IdP user's exchanges look).
func resolveOwner(ctx context.Context, cmd, stateDir string, owner *string, subject, actor string, env Env) error {
	switch {
	case actor == "":
		return usagef("%s: --actor is required", cmd)
	case (*owner == "") == (subject == ""):
		return usagef("%s: one of --owner and --subject is required", cmd)
	case *owner != "":
		return nil
	case env.DeriveOwner == nil:
		return usagef("%s: --subject needs signerd (run it with authd's --config), or pass --owner", cmd)
	}
	pin, err := idp.Load(stateDir)
	if err != nil {
		return fmt.Errorf("%s: --subject needs the pinned IdP's issuer: %w", cmd, err)
	}
	derived, err := env.DeriveOwner(ctx, pin.Issuer, subject)
	if err != nil {
		return fmt.Errorf("%s: derive the owner of --subject: %w", cmd, err)
	}
	*owner = derived
	return nil
}

// listed is a row as list prints it: everything but the token hash, which is a secret's digest
// and of no use to an operator.
type listed struct {
	Space          ledger.Kind `json:"space"`
	Owner          string      `json:"owner"`
	Actor          string      `json:"actor"`
	Scope          []string    `json:"scope"`
	AllowSubscribe []string    `json:"allowSubscribe"`
	AllowPublish   []string    `json:"allowPublish"`
	Role           string      `json:"role,omitempty"`
	Parent         string      `json:"parent,omitempty"`
	Label          string      `json:"label,omitempty"`
	LifecycleUID   string      `json:"lifecycleUid"`
	GrantedAt      time.Time   `json:"grantedAt"`
}

func list(args []string, env Env) error {
	fs := flags("authd actor list", actorUsage, env)
	stateDir := fs.String("state-dir", env.StateDir, "authd's state dir")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	if err := parse(fs, args, stateDir, 0); err != nil {
		return err
	}
	l, err := ledger.Open(*stateDir)
	if err != nil {
		return err
	}
	entries, err := l.List()
	if err != nil {
		return fmt.Errorf("authd actor list: %w", err)
	}
	if *asJSON {
		enc := json.NewEncoder(env.Stdout)
		for _, e := range entries {
			r := e.Row
			if err := enc.Encode(listed{Space: e.Kind, Owner: r.Owner, Actor: r.Actor, Scope: r.Scope, AllowSubscribe: r.AllowSubscribe,
				AllowPublish: r.AllowPublish, Role: r.Role, Parent: r.Parent, Label: r.Label, LifecycleUID: r.LifecycleUID,
				GrantedAt: time.UnixMilli(r.GrantedAt).UTC()}); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SPACE\tPRINCIPAL\tSCOPE\tSUBSCRIBE\tPUBLISH\tROLE\tPARENT\tGRANTED")
	for _, e := range entries {
		r := e.Row
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Kind, r.Principal(), dash(r.Scope), dash(r.AllowSubscribe),
			dash(r.AllowPublish), dashS(r.Role), dashS(r.Parent), time.UnixMilli(r.GrantedAt).UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

func dash(l []string) string { return dashS(strings.Join(l, ",")) }

func dashS(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// NewLifecycleUID returns a fresh lifecycle uid: 16 random bytes as 26 lower-case base32
// characters, within the uid grammar [a-z0-9]{26,32}.
func NewLifecycleUID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b)), nil
}

const idpUsage = `usage:
  authd idp pin URL [--state-dir DIR]

pin fetches URL/jwks and, if it holds an Ed25519 key, writes idp.json: the IdP's issuer and
audience are URL's origin, its keys come from URL/jwks. URL must be https (plain http only to a
loopback address). A state dir is pinned once: pinning it to another IdP is refused, because every
owner id derives from the IdP's issuer. authd reads the pin at start.
`

// IdP runs `authd idp SUBCOMMAND ...`; args are what follows "idp".
func IdP(ctx context.Context, args []string, env Env) error {
	if len(args) == 0 {
		return usagef("authd idp: a subcommand is required (pin)\n%s", idpUsage)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(env.Stdout, idpUsage)
		return ErrHelp
	case "pin":
	default:
		return usagef("authd idp: unknown subcommand %.40q (pin)", args[0])
	}
	fs := flags("authd idp pin", idpUsage, env)
	stateDir := fs.String("state-dir", env.StateDir, "authd's state dir")
	// The URL may come before or after the flags.
	rest := args[1:]
	var url string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		url, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ErrHelp
		}
		return usagef("authd idp pin: %v", err)
	}
	if url == "" && fs.NArg() == 1 {
		url = fs.Arg(0)
	} else if fs.NArg() != 0 {
		return usagef("authd idp pin: unexpected argument %.80q", fs.Arg(0))
	}
	if url == "" {
		return usagef("authd idp pin: the IdP URL is required\n%s", idpUsage)
	}
	if *stateDir == "" {
		return usagef("authd idp pin: --state-dir is required (or run it with authd's --config)")
	}
	p, err := idp.PinURL(ctx, *stateDir, url, env.HTTPClient)
	if err != nil {
		return fmt.Errorf("authd idp pin: %w", err)
	}
	fmt.Fprintf(env.Stdout, "pinned IdP %s (issuer and audience %s, keys from %s)\n", p.URL, p.Issuer, p.JWKSURI)
	return nil
}
