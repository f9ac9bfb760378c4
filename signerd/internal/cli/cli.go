// Package cli is signerd's command line: init, rotate, pki init, serve, policy check, policy explain,
// audit verify and version. main only calls Main; every subcommand is a function that returns an
// exit code, so each is testable without a process.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/internal/policy"
	"github.com/cotalgo/cotal/signerd/internal/serve"
	"github.com/cotalgo/cotal/signerd/internal/server"
	"github.com/cotalgo/cotal/signerd/internal/setup"
)

// Version is set at build time with -ldflags "-X github.com/cotalgo/cotal/signerd/internal/cli.Version=...".
var Version = ""

const usage = `signerd: the only Cotal process that holds signing seeds.

Usage:
  signerd init --dir DIR --space NAME [--space NAME]... [--add-space] [--callout-user [NAME=]PUBKEY]
  signerd rotate --dir DIR --space NAME [--account data|auth] [--retire]
  signerd broker-config --dir DIR --node NAME=HOST [--node NAME=HOST]... --out OUTDIR [flags]
  signerd pki init --dir DIR --space NAME [--space NAME]... [--trust-domain cotal.local]
  signerd serve --config FILE
  signerd policy check FILE
  signerd policy explain --policy FILE --caller ID --rpc RPC --space NAME [--profile P] [params]
  signerd audit verify [--rotated] [--partial] FILE...
  signerd audit repair FILE
  signerd version | --version
  signerd help | --help

Run "signerd COMMAND --help" for a command's flags.
`

// Main runs signerd with args (without the program name) and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "--help", "-h", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "signerd", version())
		return 0
	case "init":
		return runInit(args[1:], stdout, stderr)
	case "rotate":
		return runRotate(args[1:], stdout, stderr)
	case "broker-config":
		return runBrokerConfig(args[1:], stdout, stderr)
	case "pki":
		if len(args) < 2 || args[1] != "init" {
			fmt.Fprintln(stderr, "usage: signerd pki init --dir DIR --space NAME [--space NAME]... [--trust-domain TD]")
			return 2
		}
		return runPKIInit(args[2:], stdout, stderr)
	case "serve":
		return runServe(ctx, args[1:], stdout, stderr)
	case "policy":
		if len(args) >= 2 && args[1] == "check" {
			return runPolicyCheck(args[2:], stdout, stderr)
		}
		if len(args) >= 2 && args[1] == "explain" {
			return runPolicyExplain(args[2:], stdout, stderr)
		}
		fmt.Fprintln(stderr, "usage: signerd policy check FILE | signerd policy explain --policy FILE ...")
		return 2
	case "audit":
		if len(args) >= 2 && args[1] == "verify" {
			return runAuditVerify(args[2:], stdout, stderr)
		}
		if len(args) >= 2 && args[1] == "repair" {
			return runAuditRepair(args[2:], stdout, stderr)
		}
		fmt.Fprintln(stderr, "usage: signerd audit verify [--rotated] [--partial] FILE... | signerd audit repair FILE")
		return 2
	default:
		fmt.Fprintf(stderr, "signerd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.Main.Version + " (" + bi.GoVersion + ")"
	}
	return "(unknown)"
}

// newFlags returns a flag set that prints its usage to stdout on --help and errors to stderr.
func newFlags(name, synopsis string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args; it returns (code, true) when the command should exit now.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0, true
		}
		return 2, true
	}
	return 0, false
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func runInit(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("init", "signerd init --dir DIR --space NAME [--space NAME]... [--add-space] [--callout-user [NAME=]PUBKEY] [--host H] [--port P]", stdout, stderr)
	dir := fs.String("dir", "", "init directory (required)")
	var spaces, callouts list
	fs.Var(&spaces, "space", "space name to create (repeatable, at least one)")
	fs.Var(&callouts, "callout-user", "register this user public key as authd's callout user instead of generating one; NAME=PUBKEY, or PUBKEY with exactly one --space (repeatable)")
	add := fs.Bool("add-space", false, "add the spaces to the existing broker trust in DIR")
	host := fs.String("host", "", "broker listen host written to nats.conf (default 127.0.0.1)")
	port := fs.Int("port", 0, "broker client port written to nats.conf (default 4222)")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "signerd init: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cu := map[string]string{}
	for _, c := range callouts {
		name, pub, ok := strings.Cut(c, "=")
		if !ok {
			if len(spaces) != 1 {
				fmt.Fprintln(stderr, "signerd init: --callout-user PUBKEY needs exactly one --space; use NAME=PUBKEY")
				return 2
			}
			name, pub = spaces[0], c
		}
		cu[name] = pub
	}
	res, err := setup.Init(setup.Options{Dir: *dir, Spaces: spaces, AddSpace: *add, CalloutUsers: cu, Host: *host, Port: *port})
	if err != nil {
		fmt.Fprintln(stderr, "signerd init:", err)
		return 1
	}
	for _, sp := range res.Spaces {
		fmt.Fprintf(stdout, "space %q (%s): public facts %s\n", sp.Name, sp.Segment, sp.PublicFile)
		if sp.CalloutSeedFile != "" {
			fmt.Fprintf(stdout, "  authd callout user %s, seed in %s (hand it to authd only)\n", sp.CalloutUser, sp.CalloutSeedFile)
		} else {
			fmt.Fprintf(stdout, "  authd callout user %s (given)\n", sp.CalloutUser)
		}
	}
	fmt.Fprintf(stdout, "signer keys:       %s (signerd's uid only)\n", res.SignerDir)
	fmt.Fprintf(stdout, "operator identity: %s (keep offline; needed only for --add-space and rotation)\n", res.OperatorDir)
	fmt.Fprintf(stdout, "broker config:     %s\n", res.BrokerConfig)
	return 0
}

const rotateSynopsis = `signerd rotate --dir DIR --space NAME [--account data|auth] [--retire]

Rotates one account signing key of a space in two steps, on the machine that holds DIR/operator/
(the operator signing seed re-issues the account JWT):

  without --retire: a new signing seed replaces DIR/signer/<seg>/<data|auth>-signing.nk (the
    current one is kept as <file>.old); the account JWT lists both keys. Rewritten:
    DIR/public/<seg>.json, DIR/broker/nats.conf and the signing seed. Reload the brokers, restart
    signerd, then wait one ttl_max so every credential is renewed on the new key.
  with --retire: the account JWT lists only the new key; <file>.old is wiped and removed.
    Rewritten: DIR/public/<seg>.json, DIR/broker/nats.conf. Reload the brokers: connections
    still on the old key are closed.

A rotation already in progress (or a retire without one) is refused. No seed is printed.`

func runRotate(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("rotate", rotateSynopsis, stdout, stderr)
	dir := fs.String("dir", "", "the signerd init directory, with operator/ present (required)")
	name := fs.String("space", "", "the space whose account key rotates (required)")
	account := fs.String("account", "data", "which account: data (agents and daemons) or auth (callout, sentinel)")
	retire := fs.Bool("retire", false, "end the rotation: drop the old key from the account JWT and remove its seed")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "signerd rotate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *dir == "" || *name == "" {
		fmt.Fprintln(stderr, "signerd rotate: --dir and --space are required")
		return 2
	}
	res, err := setup.Rotate(setup.RotateOptions{Dir: *dir, Space: *name, Account: setup.Account(*account), Retire: *retire})
	if err != nil {
		fmt.Fprintln(stderr, "signerd rotate:", err)
		return 1
	}
	if *retire {
		fmt.Fprintf(stdout, "retired %s; the %s account of space %q lists %v\n", res.Old, *account, *name, res.SigningKeys)
	} else {
		fmt.Fprintf(stdout, "new signing key %s (old %s); the %s account of space %q lists %v\n", res.Current, res.Old, *account, *name, res.SigningKeys)
	}
	fmt.Fprintln(stdout, "changed:")
	for _, p := range res.Changed {
		fmt.Fprintln(stdout, " ", p)
	}
	if *retire {
		fmt.Fprintln(stdout, "next: copy the public file and nats.conf, reload every broker")
	} else {
		fmt.Fprintln(stdout, "next: copy the changed files, reload every broker, restart signerd, wait one ttl_max, then rotate --retire")
	}
	return 0
}

const brokerConfigSynopsis = `signerd broker-config --dir DIR --node NAME=HOST [--node NAME=HOST]... --out OUTDIR
       [--port 4222] [--cluster-port 6222] [--monitor-port 0] [--cluster-name cotal] [--store-dir jetstream]
       [--tls-cert FILE --tls-key FILE [--tls-ca FILE]]

Renders one nats-server configuration per node, OUTDIR/NAME.conf: the same operator, system
account and account trust (every space in DIR/public) on every node, the node's server_name and
listeners on HOST, a cluster block routing to every node (none for one node), a JetStream
store_dir relative to nats-server's working directory on that node, and client TLS when given
(paths on the nodes; {name} is replaced by the node's name). Re-run it after init --add-space and
copy each file to its node. A node given as NAME=HOST,CLIENT_PORT,CLUSTER_PORT[,MONITOR_PORT]
overrides the ports (several nodes on one host).`

func runBrokerConfig(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("broker-config", brokerConfigSynopsis, stdout, stderr)
	dir := fs.String("dir", "", "the signerd init directory (required; only public/ is read)")
	out := fs.String("out", "", "output directory for NAME.conf files (required)")
	var nodes list
	fs.Var(&nodes, "node", "a cluster node NAME=HOST[,CLIENT_PORT,CLUSTER_PORT[,MONITOR_PORT]] (repeatable, at least one)")
	port := fs.Int("port", 0, "client port of every node (default 4222)")
	clusterPort := fs.Int("cluster-port", 0, "route port of every node (default 6222)")
	monitorPort := fs.Int("monitor-port", 0, "HTTP monitoring port of every node (default off)")
	name := fs.String("cluster-name", "", "cluster name (default cotal)")
	store := fs.String("store-dir", "", "JetStream store_dir on every node (default jetstream, relative to nats-server's working directory)")
	cert := fs.String("tls-cert", "", "client TLS certificate path on the nodes")
	key := fs.String("tls-key", "", "client TLS key path on the nodes")
	ca := fs.String("tls-ca", "", "client TLS CA bundle path on the nodes (optional)")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "signerd broker-config: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	opts := setup.ClusterOptions{Dir: *dir, Out: *out, Name: *name, ClientPort: *port, ClusterPort: *clusterPort,
		MonitorPort: *monitorPort, StoreDir: *store, TLSCertFile: *cert, TLSKeyFile: *key, TLSCAFile: *ca}
	for _, v := range nodes {
		n, err := setup.ParseNode(v)
		if err != nil {
			fmt.Fprintln(stderr, "signerd broker-config:", err)
			return 2
		}
		opts.Nodes = append(opts.Nodes, n)
	}
	files, err := setup.RenderCluster(opts)
	if err != nil {
		fmt.Fprintln(stderr, "signerd broker-config:", err)
		return 1
	}
	for _, f := range files {
		fmt.Fprintln(stdout, f)
	}
	return 0
}

func runPKIInit(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("pki init", "signerd pki init --dir DIR --space NAME [--space NAME]... [--trust-domain cotal.local] [--validity 8760h]", stdout, stderr)
	dir := fs.String("dir", "", "directory for the dev CA and certificates (required)")
	var spaces list
	fs.Var(&spaces, "space", "space name (repeatable, at least one)")
	td := fs.String("trust-domain", "cotal.local", "SPIFFE trust domain")
	validity := fs.Duration("validity", mtls.DefaultDevValidity, "certificate lifetime")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if *dir == "" || len(spaces) == 0 {
		fmt.Fprintln(stderr, "signerd pki init: --dir and at least one --space are required")
		return 2
	}
	var tokens []string
	for _, s := range spaces {
		if err := space.ValidateName(s); err != nil {
			fmt.Fprintln(stderr, "signerd pki init:", err)
			return 2
		}
		tokens = append(tokens, space.Token(s))
	}
	res, err := mtls.WriteDevPKI(mtls.PKIOptions{Dir: *dir, TrustDomain: *td, Spaces: tokens, Validity: *validity})
	if err != nil {
		fmt.Fprintln(stderr, "signerd pki init:", err)
		return 1
	}
	fmt.Fprintf(stdout, "dev CA:  %s (key %s; production brings its own CA)\n", res.CACertFile, res.CAKeyFile)
	fmt.Fprintf(stdout, "signerd: %s, %s (%s)\n", res.Server.CertFile, res.Server.KeyFile, res.ServerID)
	for _, c := range res.Clients {
		fmt.Fprintf(stdout, "client:  %s %s\n", c.ID, c.Files.CertFile)
	}
	fmt.Fprintf(stdout, "valid until %s\n", res.NotAfter.UTC().Format(time.RFC3339))
	return 0
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("serve", "signerd serve --config FILE", stdout, stderr)
	path := fs.String("config", "", "configuration file (required)")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if *path == "" {
		fmt.Fprintln(stderr, "signerd serve: --config is required")
		return 2
	}
	cfg, err := serve.LoadConfig(*path)
	if err != nil {
		fmt.Fprintln(stderr, "signerd serve:", err)
		return 1
	}
	level := slog.LevelInfo
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	s, err := serve.Start(cfg, log, serve.Options{})
	if err != nil {
		log.Error("start-up refused", "err", err)
		return 1
	}
	if err := s.Run(ctx); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}

func runPolicyCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("policy check", "signerd policy check FILE", stdout, stderr)
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: signerd policy check FILE")
		return 2
	}
	p, err := policy.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "signerd policy check:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok, %d callers, sha256 %s\n", fs.Arg(0), len(p.Rules()), p.Digest())
	return 0
}

// runAuditVerify verifies audit files as one chain, in the order given (or a current file and
// its rotated predecessors with --rotated), naming the first broken line, gap, reordering or
// missing file.
func runAuditVerify(args []string, stdout, stderr io.Writer) int {
	const synopsis = "signerd audit verify [--rotated] [--partial] FILE..."
	fs := newFlags("audit verify", synopsis, stdout, stderr)
	rotated := fs.Bool("rotated", false, "FILE is the current file: verify its rotated predecessors (FILE.<seq>) first, oldest first")
	partial := fs.Bool("partial", false, "accept a first file that continues older files not given (archived); its start is printed to compare with an anchor")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	files := fs.Args()
	if len(files) == 0 || *rotated && len(files) != 1 {
		fmt.Fprintln(stderr, "usage:", synopsis, "(--rotated takes exactly one FILE)")
		return 2
	}
	if *rotated {
		pred, err := audit.Rotated(files[0])
		if err != nil {
			fmt.Fprintln(stderr, "signerd audit verify:", err)
			return 1
		}
		files = append(pred, files[0])
	}
	sum, err := audit.VerifyFiles(files, audit.FilesOptions{Partial: *partial})
	if err != nil {
		fmt.Fprintln(stderr, "signerd audit verify:", err)
		var se *audit.SequenceError
		if errors.As(err, &se) && !*rotated && len(files) == 1 {
			fmt.Fprintln(stderr, "signerd audit verify: give the rotated files before it in order, or use --rotated")
		}
		return 1
	}
	if len(files) == 1 {
		fmt.Fprintf(stdout, "%s: ok, %d lines\n", files[0], sum.Lines)
	} else {
		fmt.Fprintf(stdout, "%s .. %s: ok, %d lines in %d files\n", files[0], files[len(files)-1], sum.Lines, len(files))
	}
	for i, h := range sum.Chains {
		if st := sum.Starts[i]; st.Seq > 0 {
			out, _ := json.Marshal(st)
			fmt.Fprintf(stdout, "  chain start %s (continues files not given)\n", out)
		}
		out, _ := json.Marshal(h)
		fmt.Fprintf(stdout, "  chain head %s\n", out)
	}
	return 0
}

// runAuditRepair cuts a torn final line (a write that never completed) from a stopped signerd's
// audit file and saves it aside; serve does the same at start. Any other break is refused.
func runAuditRepair(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("audit repair", "signerd audit repair FILE", stdout, stderr)
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: signerd audit repair FILE")
		return 2
	}
	res, err := audit.Repair(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "signerd audit repair:", err)
		return 1
	}
	if res.Line == 0 {
		fmt.Fprintf(stdout, "%s: ok, %d lines, nothing torn\n", fs.Arg(0), res.Lines)
		return 0
	}
	fmt.Fprintf(stdout, "%s: cut torn line %d (%d bytes, never acknowledged), saved to %s; %d lines kept\n",
		fs.Arg(0), res.Line, res.Bytes, res.SavedTo, res.Lines)
	return 0
}

func runPolicyExplain(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("policy explain", "signerd policy explain --policy FILE --caller ID --rpc RPC --space NAME [--profile P] [--owner O] [--actor A] [--uid U] [--role R] [--subscribe CH]... [--allow-subscribe CH]... [--allow-publish CH]... [--capability C]... [--ttl D] [--minter ID] [--user-key PUBKEY]", stdout, stderr)
	path := fs.String("policy", "", "policy file (required)")
	caller := fs.String("caller", "", "caller identity, a SPIFFE ID (required)")
	rpc := fs.String("rpc", "Mint", "RPC name")
	spaceName := fs.String("space", "", "space name (required)")
	profile := fs.String("profile", "", "profile name (Mint, Remint)")
	var p profiles.Params
	fs.StringVar(&p.Owner, "owner", "", "owner parameter")
	fs.StringVar(&p.Actor, "actor", "", "actor parameter")
	fs.StringVar(&p.LifecycleUID, "uid", "", "lifecycle uid parameter")
	fs.StringVar(&p.Role, "role", "", "role parameter")
	var sub, asub, apub, caps list
	fs.Var(&sub, "subscribe", "joined channel (repeatable)")
	fs.Var(&asub, "allow-subscribe", "readable channel (repeatable)")
	fs.Var(&apub, "allow-publish", "writable channel (repeatable)")
	fs.Var(&caps, "capability", "capability (repeatable)")
	ttl := fs.Duration("ttl", 0, "requested TTL (0: profile default)")
	minter := fs.String("minter", "", "for Remint: the identity recorded as minter (default: the caller)")
	userKey := fs.String("user-key", "", "user public key to show in the claims (default: a throwaway key)")
	if code, exit := parse(fs, args, stdout); exit {
		return code
	}
	if *path == "" || *caller == "" || *spaceName == "" {
		fmt.Fprintln(stderr, "signerd policy explain: --policy, --caller and --space are required")
		return 2
	}
	p.Subscribe, p.AllowSubscribe, p.AllowPublish, p.Capabilities = sub, asub, apub, caps
	pol, err := policy.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, "signerd policy explain:", err)
		return 1
	}
	req := policy.Request{Caller: *caller, RPC: policy.RPC(*rpc), Space: *spaceName, TTL: *ttl, Params: p, Minter: *minter}
	if req.Minter == "" {
		req.Minter = *caller
	}
	var spec *profiles.Spec
	if *profile != "" {
		name, err := profiles.Parse(*profile)
		if err != nil {
			fmt.Fprintln(stderr, "signerd policy explain:", err)
			return 1
		}
		req.Profile = name
		if req.RPC.TakesProfile() && req.RPC != policy.RPCRemint {
			bp := p
			if name.Account() == profiles.AccountSystem {
				// signerd fills a $SYS profile's data account from the space; a throwaway key
				// stands for it here, as for the issuer account below.
				dkp, _ := nkeys.CreateAccount()
				bp.DataAccount, _ = dkp.PublicKey()
				dkp.Wipe()
			}
			if spec, err = profiles.Build(*spaceName, name, bp); err != nil {
				fmt.Fprintf(stdout, "decision: denied\nreason:   invalid-argument\ndetail:   %v\n", err)
				return 1
			}
		}
	}
	ex := pol.Explain(req)
	d := ex.Decision
	fmt.Fprintf(stdout, "decision: %s\nreason:   %s\n", map[bool]string{true: "allowed", false: "denied"}[d.Allow], d.Reason)
	if d.Detail != "" {
		fmt.Fprintf(stdout, "detail:   %s\n", d.Detail)
	}
	if ex.Rule != nil {
		fmt.Fprintf(stdout, "rule:     callers[%d] %s (line %d)\n", ex.Rule.Index, ex.Rule.ID, ex.Rule.Line)
	} else {
		fmt.Fprintln(stdout, "rule:     none matched")
	}
	if !d.Allow {
		return 1
	}
	if spec == nil {
		return 0
	}
	granted, capped, err := server.GrantTTL(*ttl, spec.Lifetime, d.TTLCap)
	if err != nil {
		fmt.Fprintf(stdout, "ttl:      refused: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "ttl:      %s (requested %s, profile max %s, policy cap %s, capped %t)\n", granted, *ttl, spec.Lifetime.Max, d.TTLCap, capped)
	sub0 := *userKey
	if sub0 == "" {
		kp, _ := nkeys.CreateUser()
		sub0, _ = kp.PublicKey()
		kp.Wipe()
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		fmt.Fprintln(stderr, "signerd policy explain:", err)
		return 1
	}
	account, _ := akp.PublicKey()
	akp.Wipe()
	uc, err := spec.Claims(sub0, account, time.Now(), granted)
	if err != nil {
		fmt.Fprintln(stdout, "claims:  ", err)
		return 1
	}
	out, _ := json.MarshalIndent(uc, "", "  ")
	fmt.Fprintf(stdout, "claims (not signed; issuer_account is a throwaway key standing for the space's %s account):\n%s\n", spec.Account, out)
	return 0
}
