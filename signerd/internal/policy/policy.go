package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cotalgo/cotal/pkg/creds"
	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/pkg/space"
)

// Version is the only policy file version this package reads.
const Version = 1

// MaxFileSize bounds a policy file; a larger file is refused before it is parsed.
const MaxFileSize = 1 << 20

// RPC names a SignerService method as it appears in a policy and in a Request.
type RPC string

// The closed set of RPCs a policy may grant. A name outside it is a load error in a policy and
// rpc-not-allowed in a request.
const (
	RPCMint                RPC = "Mint"
	RPCRemint              RPC = "Remint"
	RPCGetSpace            RPC = "GetSpace"
	RPCOpenCalloutRequest  RPC = "OpenCalloutRequest"
	RPCSignCalloutResponse RPC = "SignCalloutResponse"
	RPCSignBearer          RPC = "SignBearer"
	RPCGetJWKS             RPC = "GetJWKS"
	RPCDeriveOwner         RPC = "DeriveOwner"
	RPCMac                 RPC = "Mac"
	// RPCSignServiceCredential signs a service endpoint token (seed 002); authd's alone.
	RPCSignServiceCredential RPC = "SignServiceCredential"
)

var allRPCs = []RPC{
	RPCMint, RPCRemint, RPCGetSpace, RPCOpenCalloutRequest, RPCSignCalloutResponse,
	RPCSignBearer, RPCGetJWKS, RPCDeriveOwner, RPCMac, RPCSignServiceCredential,
}

// RPCs returns the closed set of RPC names, in a stable order.
func RPCs() []RPC { return slices.Clone(allRPCs) }

// Valid reports whether r is in the closed set.
func (r RPC) Valid() bool { return slices.Contains(allRPCs, r) }

// TakesProfile reports whether r mints a credential and so is checked against the caller's
// profile rules: Mint, Remint and SignCalloutResponse (unless it carries a refusal, see
// Request.Profile). Every other RPC is checked on RPC and space only.
func (r RPC) TakesProfile() bool {
	return r == RPCMint || r == RPCRemint || r == RPCSignCalloutResponse
}

// RemintMode says whose credentials of a profile a caller may renew.
type RemintMode string

// Remint modes. The default is RemintOwn.
const (
	// RemintOwn allows renewing only credentials this caller identity minted.
	RemintOwn RemintMode = "own"
	// RemintAny allows renewing any credential of the profile in an allowed space.
	RemintAny RemintMode = "any"
	// RemintNone refuses every Remint of the profile.
	RemintNone RemintMode = "none"
)

// SpaceAny in a rule's spaces allows every space.
const SpaceAny = "*"

// SpaceBound in a rule's spaces allows the one space whose token equals the segment the rule's
// id binds with "{space}".
const SpaceBound = "{space}"

// Rate is a token bucket: PerSecond tokens are added each second up to Burst.
type Rate struct {
	PerSecond float64
	Burst     int
}

// Limits are the policy-wide limits, set by the file's optional top-level limits block. They
// bound what the callers entries cannot: identities the policy does not list and the sum of
// all callers.
type Limits struct {
	// UnknownCallers is the token bucket of each identity no entry matches, and of each client
	// certificate without a usable identity (keyed by its SHA-256 fingerprint).
	UnknownCallers Rate
	// Global is one token bucket over every request from every caller, known or not.
	Global Rate
	// RefusalAuditInterval is how often the refusals past a rate limit are written to the
	// audit log, one line per caller and reason with their count.
	RefusalAuditInterval time.Duration
}

// DefaultLimits returns the limits of a policy whose file leaves them out. The unknown-caller
// rate is small: such a caller can only be refused, and each refusal within its burst costs an
// fsynced audit line. The global cap is a backstop above what one signerd signs on two cores
// (7 000 to 11 000 Mint/s over mTLS, BENCHMARKS.md), so it never throttles a healthy deployment;
// it bounds the requests audited one by one when many identities ask at once.
func DefaultLimits() Limits { return defaultLimits }

var defaultLimits = Limits{
	UnknownCallers:       Rate{PerSecond: 1, Burst: 5},
	Global:               Rate{PerSecond: 10000, Burst: 20000},
	RefusalAuditInterval: 10 * time.Second,
}

// Bounds of limits.refusal_audit_interval.
const (
	MinRefusalAuditInterval = time.Second
	MaxRefusalAuditInterval = time.Hour
)

// ProfileRule is what a caller may do with one profile. It is a read-only view: changing a
// value returned by Policy has no effect on decisions.
type ProfileRule struct {
	// Line is where the rule starts in the policy file.
	Line int
	// TTLMax caps the credential lifetime for this caller; always > 0.
	TTLMax time.Duration
	// AnyOwner allows any owner; otherwise the owner must be in Owners.
	AnyOwner bool
	// Owners are the owner tokens the caller may mint for.
	Owners []string
	// Channels are the channel patterns the caller may grant.
	Channels []string
	// ExcludeChannels are channel patterns the caller may never grant, checked first.
	ExcludeChannels []string
	// Roles are the service roles the caller may grant.
	Roles []string
	// Capabilities are the scope words the caller may grant.
	Capabilities []string
	// Remint says whose credentials of this profile the caller may renew.
	Remint RemintMode
}

// Rule is one entry under callers. It is a read-only view: changing a value returned by
// Policy has no effect on decisions.
type Rule struct {
	// Index is the entry's position under callers (file order decides among patterns).
	Index int
	// Line is where the entry starts in the policy file.
	Line int
	// ID is the caller id or id pattern as written.
	ID string
	// Pattern is true when ID has a "*" or "{space}" segment.
	Pattern bool
	// RPCs are the methods the caller may call.
	RPCs []RPC
	// Spaces are the space names the caller may act on, SpaceAny or SpaceBound.
	Spaces []string
	// ExcludeSpaces are space names the caller may never act on, checked first.
	ExcludeSpaces []string
	// Rate is the caller's token bucket, one per caller identity.
	Rate Rate
	// Profiles are the profiles the caller may mint or remint, with their constraints.
	Profiles map[profiles.Name]ProfileRule
}

func (r Rule) clone() Rule {
	c := r
	c.RPCs = slices.Clone(r.RPCs)
	c.Spaces = slices.Clone(r.Spaces)
	c.ExcludeSpaces = slices.Clone(r.ExcludeSpaces)
	c.Profiles = make(map[profiles.Name]ProfileRule, len(r.Profiles))
	for n, p := range r.Profiles {
		p.Owners = slices.Clone(p.Owners)
		p.Channels = slices.Clone(p.Channels)
		p.ExcludeChannels = slices.Clone(p.ExcludeChannels)
		p.Roles = slices.Clone(p.Roles)
		p.Capabilities = slices.Clone(p.Capabilities)
		c.Profiles[n] = p
	}
	return c
}

// Policy is a validated, immutable policy. Decide, Explain, Match, Rules and Rate are safe for
// concurrent use. The zero value and a nil *Policy deny everything.
type Policy struct {
	rules    []*rule
	exact    map[string]*rule
	patterns []*rule // in file order
	limits   Limits
	digest   string
}

// rule is a Rule compiled for matching.
type rule struct {
	Rule
	id       spiffeID
	rpcs     map[RPC]bool
	profiles map[profiles.Name]*profileRule
}

type profileRule struct {
	ProfileRule
	owners       map[string]bool
	channels     [][]string
	excludes     [][]string
	roles        map[string]bool
	capabilities map[string]bool
}

// Digest is the hex SHA-256 of the bytes the policy was parsed from, for audit lines and for
// noticing that a file on disk already is the current policy.
func (p *Policy) Digest() string {
	if p == nil {
		return ""
	}
	return p.digest
}

// Limits returns the policy-wide limits: the file's limits block with DefaultLimits for every
// key it leaves out. A nil policy has DefaultLimits.
func (p *Policy) Limits() Limits {
	if p == nil || p.limits == (Limits{}) {
		return defaultLimits
	}
	return p.limits
}

// Rules returns a copy of every caller entry in file order.
func (p *Policy) Rules() []Rule {
	if p == nil {
		return nil
	}
	out := make([]Rule, len(p.rules))
	for i, r := range p.rules {
		out[i] = r.clone()
	}
	return out
}

// Match returns a copy of the rule that governs caller: the entry with exactly that id if
// there is one, else the first pattern in file order that matches it. It refuses (ok false) an
// id that is not a well-formed SPIFFE ID.
func (p *Policy) Match(caller string) (Rule, bool) {
	r, _, ok := p.match(caller)
	if !ok {
		return Rule{}, false
	}
	return r.clone(), true
}

func (p *Policy) match(caller string) (r *rule, bound string, ok bool) {
	if p == nil {
		return nil, "", false
	}
	id, err := parseSPIFFE(caller, false)
	if err != nil {
		return nil, "", false
	}
	if r, ok := p.exact[caller]; ok {
		return r, "", true
	}
	for _, r := range p.patterns {
		if bound, ok := r.id.match(id); ok {
			return r, bound, true
		}
	}
	return nil, "", false
}

// Rate returns the token bucket of the rule that governs caller (see Match); ok is false when
// no rule does.
func (p *Policy) Rate(caller string) (ratePerSec float64, burst int, ok bool) {
	r, _, ok := p.match(caller)
	if !ok {
		return 0, 0, false
	}
	return r.Rate.PerSecond, r.Rate.Burst, true
}

// Load reads a policy file and parses it. The file decides who may mint what, so it must pass
// creds.CheckTrustedFile: a regular file owned by root or signerd's uid, with no group or other
// write bit, in directories (up to /) that pass the same rules; a symlink is followed and its
// target checked in full. It refuses anything else and a file larger than MaxFileSize; every
// error is an *Error naming path (and the reason names the offending file or directory).
func Load(path string) (*Policy, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return parse(data, path)
}

// readFile reads a policy file through creds.ReadTrustedFile, which checks the opened file (not
// only the path, which could be swapped in between).
func readFile(path string) ([]byte, error) {
	data, err := creds.ReadTrustedFile(path, MaxFileSize)
	if err != nil {
		return nil, &Error{Path: path, Caller: -1, Reason: err.Error()}
	}
	return data, nil
}

// Parse decodes and validates a policy. Decoding is strict: an unknown key, a duplicate key, a
// value of the wrong type or a second YAML document is an error naming the key and line.
// Validation then checks every rule (see the package documentation). Errors are *Error values,
// joined when the decoder reports several.
func Parse(data []byte) (*Policy, error) { return parse(data, "") }

// The file form. Field names are the YAML keys; KnownFields makes any other key an error.
type filePolicy struct {
	Version int          `yaml:"version"`
	Limits  *fileLimits  `yaml:"limits"`
	Callers []fileCaller `yaml:"callers"`
}

type fileLimits struct {
	UnknownCallers       *fileRate `yaml:"unknown_callers"`
	Global               *fileRate `yaml:"global"`
	RefusalAuditInterval string    `yaml:"refusal_audit_interval"`
}

type fileCaller struct {
	ID            string                 `yaml:"id"`
	RPCs          []string               `yaml:"rpcs"`
	Spaces        []string               `yaml:"spaces"`
	ExcludeSpaces []string               `yaml:"exclude_spaces"`
	Rate          *fileRate              `yaml:"rate"`
	Profiles      map[string]fileProfile `yaml:"profiles"`
}

type fileRate struct {
	PerSecond float64 `yaml:"per_second"`
	Burst     int     `yaml:"burst"`
}

type fileProfile struct {
	TTLMax          string   `yaml:"ttl_max"`
	AnyOwner        bool     `yaml:"any_owner"`
	Owners          []string `yaml:"owners"`
	Channels        []string `yaml:"channels"`
	ExcludeChannels []string `yaml:"exclude_channels"`
	Roles           []string `yaml:"roles"`
	Capabilities    []string `yaml:"capabilities"`
	Remint          string   `yaml:"remint"`
}

// yamlLine matches one message of a yaml.TypeError.
var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

var yamlUnknownField = regexp.MustCompile(`^field (\S+) not found in type \S+$`)

// yamlTypeNames turns the decoder's Go type names into the words an operator reads.
var yamlTypeNames = strings.NewReplacer(
	"policy.filePolicy", "the policy",
	"policy.fileCaller", "a caller",
	"policy.fileRate", "rate",
	"policy.fileLimits", "limits",
	"*policy.fileLimits", "limits",
	"policy.fileProfile", "a profile rule",
	"*policy.fileRate", "rate",
)

func parse(data []byte, path string) (*Policy, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{Path: path, Caller: -1, Reason: fmt.Sprintf("larger than %d bytes", MaxFileSize)}
	}
	// The node tree first: it reports syntax errors and gives validation errors their lines.
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, decodeError(err, path, lineIndex{})
	}
	if err := checkPlain(&root, path); err != nil {
		return nil, err
	}
	lines := lineIndex{&root}
	var f filePolicy
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, decodeError(err, path, lines)
	}
	// A second document would be silently ignored; refuse it so what is read is what is enforced.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		e := &Error{Path: path, Caller: -1, Reason: "more than one YAML document"}
		if err == nil {
			e.Line = extra.Line
		}
		return nil, e
	}
	c := compiler{path: path, lines: lines}
	p, err := c.compile(&f)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(data)
	p.digest = hex.EncodeToString(sum[:])
	return p, nil
}

func decodeError(err error, path string, lines lineIndex) error {
	if errors.Is(err, io.EOF) {
		return &Error{Path: path, Caller: -1, Reason: "empty policy"}
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: the message already carries "line N".
		return &Error{Path: path, Caller: -1, Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	errs := make([]error, 0, len(te.Errors))
	for _, msg := range te.Errors {
		e := &Error{Path: path, Caller: -1, Reason: yamlTypeNames.Replace(msg)}
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			e.Line, _ = strconv.Atoi(m[1]) // \d+ from the decoder; a failure leaves 0, "unknown"
			e.Caller, e.ID = lines.callerAt(e.Line)
			e.Reason = yamlTypeNames.Replace(m[2])
			if u := yamlUnknownField.FindStringSubmatch(m[2]); u != nil {
				e.Field = u[1]
				e.Reason = "unknown key in " + yamlTypeNames.Replace(strings.TrimPrefix(m[2], "field "+u[1]+" not found in type "))
			}
		}
		errs = append(errs, e)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// lineIndex finds the line of a key in the decoded document, so validation errors can point
// at the file.
type lineIndex struct{ root *yaml.Node }

// at walks path (string keys into mappings, int indexes into sequences) and returns the line of
// the deepest element found: the key's line for a mapping key, the item's line for an index.
func (l lineIndex) at(path ...any) int {
	n := l.root
	if n == nil {
		return 0
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	line := n.Line
	for _, step := range path {
		switch s := step.(type) {
		case string:
			if n.Kind != yaml.MappingNode {
				return line
			}
			found := false
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == s {
					line, n, found = n.Content[i].Line, n.Content[i+1], true
					break
				}
			}
			if !found {
				return line
			}
		case int:
			if n.Kind != yaml.SequenceNode || s < 0 || s >= len(n.Content) {
				return line
			}
			n = n.Content[s]
			line = n.Line
		}
	}
	return line
}

// callerAt returns the index and id of the callers entry that contains line, or -1.
func (l lineIndex) callerAt(line int) (int, string) {
	n := l.root
	if n == nil || line <= 0 {
		return -1, ""
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind != yaml.MappingNode {
		return -1, ""
	}
	var seq *yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "callers" && n.Content[i+1].Kind == yaml.SequenceNode {
			seq = n.Content[i+1]
			if i+2 < len(n.Content) && line >= n.Content[i+2].Line {
				return -1, "" // a top-level key after the callers list
			}
			break
		}
	}
	if seq == nil {
		return -1, ""
	}
	idx := -1
	for i, item := range seq.Content {
		if item.Line <= line {
			idx = i
		}
	}
	if idx < 0 {
		return -1, ""
	}
	item := seq.Content[idx]
	if item.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(item.Content); i += 2 {
			if item.Content[i].Value == "id" && item.Content[i+1].Kind == yaml.ScalarNode {
				return idx, item.Content[i+1].Value
			}
		}
	}
	return idx, ""
}

type compiler struct {
	path  string
	lines lineIndex
}

// callerErr builds an *Error about callers[i]; field is a dotted path under it, and lineAt the
// path used to find its line.
func (c *compiler) callerErr(i int, id string, field string, lineAt []any, format string, args ...any) error {
	return &Error{
		Path:   c.path,
		Line:   c.lines.at(append([]any{"callers", i}, lineAt...)...),
		Caller: i,
		ID:     id,
		Field:  field,
		Reason: fmt.Sprintf(format, args...),
	}
}

func (c *compiler) compile(f *filePolicy) (*Policy, error) {
	if f.Version != Version {
		return nil, &Error{Path: c.path, Line: c.lines.at("version"), Caller: -1, Field: "version",
			Reason: fmt.Sprintf("must be %d, got %d", Version, f.Version)}
	}
	if len(f.Callers) == 0 {
		return nil, &Error{Path: c.path, Line: c.lines.at("callers"), Caller: -1, Field: "callers",
			Reason: "no callers listed; a policy that allows nothing is refused as a likely mistake"}
	}
	p := &Policy{exact: make(map[string]*rule)}
	limits, err := c.compileLimits(f.Limits)
	if err != nil {
		return nil, err
	}
	p.limits = limits
	seen := make(map[string]int)
	for i := range f.Callers {
		r, err := c.compileCaller(i, &f.Callers[i])
		if err != nil {
			return nil, err
		}
		if j, dup := seen[r.ID]; dup {
			return nil, c.callerErr(i, r.ID, "id", []any{"id"}, "duplicate of callers[%d]", j)
		}
		seen[r.ID] = i
		if r.Pattern {
			for _, q := range p.patterns {
				if q.id.shadows(r.id) {
					return nil, c.callerErr(i, r.ID, "id", []any{"id"},
						"pattern can never match: callers[%d] (%s) comes first and matches every id it does", q.Index, q.ID)
				}
			}
			p.patterns = append(p.patterns, r)
		} else {
			p.exact[r.ID] = r
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

// compileLimits checks the limits block and fills what it leaves out from DefaultLimits.
func (c *compiler) compileLimits(fl *fileLimits) (Limits, error) {
	l := defaultLimits
	if fl == nil {
		return l, nil
	}
	limitErr := func(field string, at []any, format string, args ...any) error {
		return &Error{Path: c.path, Line: c.lines.at(append([]any{"limits"}, at...)...), Caller: -1,
			Field: "limits." + field, Reason: fmt.Sprintf(format, args...)}
	}
	for _, r := range []struct {
		key string
		in  *fileRate
		out *Rate
	}{
		{"unknown_callers", fl.UnknownCallers, &l.UnknownCallers},
		{"global", fl.Global, &l.Global},
	} {
		if r.in == nil {
			continue
		}
		if ps := r.in.PerSecond; !(ps > 0) || math.IsInf(ps, 0) {
			return Limits{}, limitErr(r.key+".per_second", []any{r.key, "per_second"}, "must be a finite number > 0, got %v", ps)
		}
		if r.in.Burst < 1 {
			return Limits{}, limitErr(r.key+".burst", []any{r.key, "burst"}, "must be >= 1, got %d", r.in.Burst)
		}
		*r.out = Rate{PerSecond: r.in.PerSecond, Burst: r.in.Burst}
	}
	if s := fl.RefusalAuditInterval; s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			return Limits{}, limitErr("refusal_audit_interval", []any{"refusal_audit_interval"}, "%q: not a duration (for example 10s)", s)
		}
		if d < MinRefusalAuditInterval || d > MaxRefusalAuditInterval {
			return Limits{}, limitErr("refusal_audit_interval", []any{"refusal_audit_interval"}, "%q: must be between %v and %v", s, MinRefusalAuditInterval, MaxRefusalAuditInterval)
		}
		l.RefusalAuditInterval = d
	}
	return l, nil
}

func (c *compiler) compileCaller(i int, fc *fileCaller) (*rule, error) {
	id := fc.ID
	if id == "" {
		return nil, c.callerErr(i, "", "id", []any{"id"}, "required")
	}
	sid, err := parseSPIFFE(id, true)
	if err != nil {
		return nil, c.callerErr(i, id, "id", []any{"id"}, "%q: %v", id, err)
	}
	r := &rule{
		Rule: Rule{
			Index:   i,
			Line:    c.lines.at("callers", i),
			ID:      id,
			Pattern: sid.isPattern(),
		},
		id:       sid,
		rpcs:     make(map[RPC]bool),
		profiles: make(map[profiles.Name]*profileRule),
	}

	if len(fc.RPCs) == 0 {
		return nil, c.callerErr(i, id, "rpcs", []any{"rpcs"}, "required: list at least one of %v", allRPCs)
	}
	takesProfile := false
	for j, name := range fc.RPCs {
		rpc := RPC(name)
		if !rpc.Valid() {
			return nil, c.callerErr(i, id, fmt.Sprintf("rpcs[%d]", j), []any{"rpcs", j}, "unknown RPC %q; known: %v", name, allRPCs)
		}
		if r.rpcs[rpc] {
			return nil, c.callerErr(i, id, fmt.Sprintf("rpcs[%d]", j), []any{"rpcs", j}, "duplicate %q", name)
		}
		r.rpcs[rpc] = true
		r.RPCs = append(r.RPCs, rpc)
		takesProfile = takesProfile || rpc.TakesProfile()
	}

	if len(fc.Spaces) == 0 {
		return nil, c.callerErr(i, id, "spaces", []any{"spaces"}, `required: list space names, "{space}" or "*"`)
	}
	if err := c.checkList(i, id, "spaces", fc.Spaces, func(s string) error {
		switch s {
		case SpaceAny:
			return nil
		case SpaceBound:
			if !sid.bindsSpace() {
				return errors.New(`"{space}" needs an id with a "{space}" segment`)
			}
			return nil
		}
		return checkSpaceName(s)
	}); err != nil {
		return nil, err
	}
	if slices.Contains(fc.Spaces, SpaceAny) && len(fc.Spaces) > 1 {
		return nil, c.callerErr(i, id, "spaces", []any{"spaces"}, `"*" allows every space; list nothing else beside it`)
	}
	r.Spaces = cloneList(fc.Spaces)
	if err := c.checkList(i, id, "exclude_spaces", fc.ExcludeSpaces, checkSpaceName); err != nil {
		return nil, err
	}
	r.ExcludeSpaces = cloneList(fc.ExcludeSpaces)

	if fc.Rate == nil {
		return nil, c.callerErr(i, id, "rate", []any{"rate"}, "required: {per_second: N, burst: N}")
	}
	if ps := fc.Rate.PerSecond; !(ps > 0) || math.IsInf(ps, 0) {
		return nil, c.callerErr(i, id, "rate.per_second", []any{"rate", "per_second"}, "must be a finite number > 0, got %v", ps)
	}
	if fc.Rate.Burst < 1 {
		return nil, c.callerErr(i, id, "rate.burst", []any{"rate", "burst"}, "must be >= 1, got %d", fc.Rate.Burst)
	}
	r.Rate = Rate{PerSecond: fc.Rate.PerSecond, Burst: fc.Rate.Burst}

	switch {
	case takesProfile && len(fc.Profiles) == 0:
		return nil, c.callerErr(i, id, "profiles", []any{"rpcs"}, "required: rpcs include Mint, Remint or SignCalloutResponse")
	case !takesProfile && len(fc.Profiles) > 0:
		return nil, c.callerErr(i, id, "profiles", []any{"profiles"}, "no listed RPC takes a profile (Mint, Remint, SignCalloutResponse)")
	}
	r.Profiles = make(map[profiles.Name]ProfileRule, len(fc.Profiles))
	for _, key := range slices.Sorted(maps.Keys(fc.Profiles)) {
		fp := fc.Profiles[key]
		pr, err := c.compileProfile(i, id, key, &fp)
		if err != nil {
			return nil, err
		}
		// The $SYS profiles reach past the space (a KICK names no account): only the delivery
		// daemon, whose executor kicks only connections it found in its own data account, may
		// hold them.
		if profiles.Name(key).Account() == profiles.AccountSystem && (len(sid.segments) == 0 || sid.segments[0] != SystemProfileHolder) {
			return nil, c.callerErr(i, id, "profiles."+key, []any{"profiles", key}, "a system-account profile may be granted only to a %s identity (spiffe://<domain>/%s/...)", SystemProfileHolder, SystemProfileHolder)
		}
		r.profiles[profiles.Name(key)] = pr
		r.Profiles[profiles.Name(key)] = pr.ProfileRule
	}
	return r, nil
}

// SystemProfileHolder is the first SPIFFE path segment of the only callers a system-account
// profile (membership-observer, connection-evictor) may be granted to: the delivery daemon.
const SystemProfileHolder = "deliveryd"

func (c *compiler) compileProfile(i int, id, key string, fp *fileProfile) (*profileRule, error) {
	field := "profiles." + key
	at := func(rest ...any) []any { return append([]any{"profiles", key}, rest...) }
	if _, err := profiles.Parse(key); err != nil {
		return nil, c.callerErr(i, id, field, at(), "%v", err)
	}
	pr := &profileRule{
		ProfileRule:  ProfileRule{Line: c.lines.at("callers", i, "profiles", key)},
		owners:       make(map[string]bool),
		roles:        make(map[string]bool),
		capabilities: make(map[string]bool),
	}

	if fp.TTLMax == "" {
		return nil, c.callerErr(i, id, field+".ttl_max", at(), "required (for example 1h)")
	}
	ttl, err := time.ParseDuration(fp.TTLMax)
	if err != nil {
		return nil, c.callerErr(i, id, field+".ttl_max", at("ttl_max"), "%q: not a duration (for example 90s, 1h)", fp.TTLMax)
	}
	if ttl <= 0 {
		return nil, c.callerErr(i, id, field+".ttl_max", at("ttl_max"), "%q: must be > 0", fp.TTLMax)
	}
	pr.TTLMax = ttl

	if fp.AnyOwner && len(fp.Owners) > 0 {
		return nil, c.callerErr(i, id, field+".owners", at("owners"), "any_owner is true; list owners or set any_owner, not both")
	}
	pr.AnyOwner = fp.AnyOwner
	if err := c.checkSet(i, id, field, at, "owners", fp.Owners, checkOwner, pr.owners); err != nil {
		return nil, err
	}
	pr.Owners = cloneList(fp.Owners)
	if err := c.checkSet(i, id, field, at, "roles", fp.Roles, checkRole, pr.roles); err != nil {
		return nil, err
	}
	pr.Roles = cloneList(fp.Roles)
	if err := c.checkSet(i, id, field, at, "capabilities", fp.Capabilities, checkCapability, pr.capabilities); err != nil {
		return nil, err
	}
	pr.Capabilities = cloneList(fp.Capabilities)

	for _, list := range []struct {
		key  string
		in   []string
		out  *[][]string
		keep *[]string
	}{
		{"channels", fp.Channels, &pr.channels, &pr.Channels},
		{"exclude_channels", fp.ExcludeChannels, &pr.excludes, &pr.ExcludeChannels},
	} {
		seen := make(map[string]int)
		for j, s := range list.in {
			f := fmt.Sprintf("%s.%s[%d]", field, list.key, j)
			toks, err := parseChannel(s)
			if err != nil {
				return nil, c.callerErr(i, id, f, at(list.key, j), "%q: %v", s, err)
			}
			if k, dup := seen[s]; dup {
				return nil, c.callerErr(i, id, f, at(list.key, j), "duplicate of %s[%d] %q", list.key, k, s)
			}
			seen[s] = j
			*list.out = append(*list.out, toks)
		}
		*list.keep = cloneList(list.in)
	}

	switch mode := RemintMode(fp.Remint); mode {
	case "":
		pr.Remint = RemintOwn
	case RemintOwn, RemintAny, RemintNone:
		pr.Remint = mode
	default:
		return nil, c.callerErr(i, id, field+".remint", at("remint"), "%q: must be own, any or none", fp.Remint)
	}
	return pr, nil
}

// cloneList copies a list from the file, with an empty list as nil so that "key: []" and an
// absent key read back the same.
func cloneList(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	return slices.Clone(in)
}

// checkList validates each element of a list and refuses duplicates.
func (c *compiler) checkList(i int, id, key string, list []string, check func(string) error) error {
	seen := make(map[string]int)
	for j, s := range list {
		f := fmt.Sprintf("%s[%d]", key, j)
		if err := check(s); err != nil {
			return c.callerErr(i, id, f, []any{key, j}, "%q: %v", s, err)
		}
		if k, dup := seen[s]; dup {
			return c.callerErr(i, id, f, []any{key, j}, "duplicate of %s[%d] %q", key, k, s)
		}
		seen[s] = j
	}
	return nil
}

// checkSet validates a profile-rule list into set, refusing malformed values and duplicates.
func (c *compiler) checkSet(i int, id, field string, at func(...any) []any, key string, list []string, check func(string) error, set map[string]bool) error {
	for j, s := range list {
		f := fmt.Sprintf("%s.%s[%d]", field, key, j)
		if err := check(s); err != nil {
			return c.callerErr(i, id, f, at(key, j), "%q: %v", s, err)
		}
		if set[s] {
			return c.callerErr(i, id, f, at(key, j), "duplicate %q", s)
		}
		set[s] = true
	}
	return nil
}

// checkSpaceName accepts a space name as written in a policy: a valid space name
// (space.ValidateName) that does not contain the characters the policy reserves for patterns.
func checkSpaceName(s string) error {
	if err := space.ValidateName(s); err != nil {
		return grammarErr(err)
	}
	if i := strings.IndexAny(s, "*{}"); i >= 0 {
		return fmt.Errorf(`character %q is reserved for patterns (write "*" or "{space}" alone)`, s[i])
	}
	return nil
}

func checkOwner(s string) error { return grammarErr(space.ValidateOwner(s)) }

func checkRole(s string) error { return grammarErr(space.ValidateRole(s)) }

// checkCapability accepts a capability word: 1 to space.MaxIdentLen bytes of [A-Za-z0-9_-].
// Neither roles nor capabilities have a wildcard: a rule lists exactly what may be granted.
func checkCapability(s string) error {
	if s == "" || len(s) > space.MaxIdentLen {
		return fmt.Errorf("must be 1 to %d bytes of [A-Za-z0-9_-]", space.MaxIdentLen)
	}
	for i := 0; i < len(s); i++ {
		if !isChannelByte(s[i]) {
			return fmt.Errorf("character %q is not one of [A-Za-z0-9_-]", s[i])
		}
	}
	return nil
}

// grammarErr keeps only the reason of a *space.NameError: the caller of the check already
// quotes the value.
func grammarErr(err error) error {
	var ne *space.NameError
	if errors.As(err, &ne) {
		return errors.New(ne.Reason)
	}
	return err
}
