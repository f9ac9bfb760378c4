package serviceaccess

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/space"
)

// Contract is what a registration pins: the closure digests (sorted, unique) and the artifacts
// (sorted by digest, unique), each artifact's bytes hashing to its digest. Every closure names
// an artifact whose bytes are a Manifest; the endpoint's manifest's root urn is the endpoint.
type Contract struct {
	Closures  []string   `json:"closures"`
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact is one content-addressed blob: digest "sha256:<64 lowercase hex>" of Bytes (base64 in
// JSON).
type Artifact struct {
	Digest string `json:"digest"`
	Bytes  []byte `json:"bytes"`
}

// Manifest is one closure: {v:1, root, members:[]}.
type Manifest struct {
	V       int      `json:"v"`
	Root    Member   `json:"root"`
	Members []Member `json:"members"`
}

// Member is one declared member of a closure. Kind is "endpoint", "command", "trait" or "type".
// A command must have Lifetime "ephemeral"; a trait must not be Governed.
type Member struct {
	URN      string `json:"urn"`
	Kind     string `json:"kind"`
	Lifetime string `json:"lifetime,omitempty"`
	Governed bool   `json:"governed,omitempty"`
}

// Bounds of a contract.
const (
	MaxClosures        = 64
	MaxArtifacts       = 256
	MaxManifestMembers = 1024
	maxURNLen          = 256
)

// The member kinds, the one command lifetime a service may declare.
const (
	MemberEndpoint    = "endpoint"
	MemberCommand     = "command"
	MemberTrait       = "trait"
	MemberType        = "type"
	LifetimeEphemeral = "ephemeral"
)

// Check validates c for endpoint and returns the manifests in closure order. It refuses (an
// *Error naming the field): an endpoint outside the grammar; no closure or more than
// MaxClosures; no artifact or more than MaxArtifacts; closures not sorted and unique, or not
// "sha256:<64 lowercase hex>"; artifacts not sorted by digest and unique, or whose bytes do not
// hash to their digest; a closure no artifact holds and an artifact no closure names; an
// artifact that is not one closed Manifest (unknown, duplicated or re-cased key, trailing data,
// null); v other than 1; a root that is not an endpoint member; no closure or more than one
// whose root urn is endpoint, or two closures with one root; more than MaxManifestMembers
// members; a member kind outside endpoint, command, trait and type; a urn that is empty, over
// 256 bytes or holds a control character or space; a urn twice in one manifest; a command
// whose lifetime is not "ephemeral"; a trait with governed true; lifetime on a non-command or
// governed on a non-trait.
func (c *Contract) Check(endpoint string) ([]Manifest, error) {
	if c == nil {
		return nil, fail("contract", "is missing")
	}
	if !ValidEndpoint(endpoint) {
		return nil, fail("endpoint", "is not an endpoint name")
	}
	if n := len(c.Closures); n == 0 || n > MaxClosures {
		return nil, fail("contract.closures", "holds %d closures, want 1 to %d", n, MaxClosures)
	}
	if n := len(c.Artifacts); n == 0 || n > MaxArtifacts {
		return nil, fail("contract.artifacts", "holds %d artifacts, want 1 to %d", n, MaxArtifacts)
	}
	for i, d := range c.Closures {
		if !validDigest(d) {
			return nil, fail(fmt.Sprintf("contract.closures[%d]", i), "is not sha256:<64 lowercase hex>")
		}
		if i > 0 && c.Closures[i-1] >= d {
			return nil, fail(fmt.Sprintf("contract.closures[%d]", i), "is not sorted after the one before it, or repeats it")
		}
	}
	byDigest := make(map[string][]byte, len(c.Artifacts))
	for i, a := range c.Artifacts {
		f := fmt.Sprintf("contract.artifacts[%d].digest", i)
		if !validDigest(a.Digest) {
			return nil, fail(f, "is not sha256:<64 lowercase hex>")
		}
		if i > 0 && c.Artifacts[i-1].Digest >= a.Digest {
			return nil, fail(f, "is not sorted after the one before it, or repeats it")
		}
		if Digest(a.Bytes) != a.Digest {
			return nil, fail(f, "is not the digest of the artifact's bytes")
		}
		byDigest[a.Digest] = a.Bytes
	}
	named := make(map[string]bool, len(c.Closures))
	for _, d := range c.Closures {
		named[d] = true
	}
	for i, a := range c.Artifacts {
		if !named[a.Digest] {
			return nil, fail(fmt.Sprintf("contract.artifacts[%d]", i), "is named by no closure")
		}
	}
	out := make([]Manifest, 0, len(c.Closures))
	roots := make(map[string]bool, len(c.Closures))
	own := 0
	for i, d := range c.Closures {
		f := fmt.Sprintf("contract.closures[%d]", i)
		b, ok := byDigest[d]
		if !ok {
			return nil, fail(f, "names no artifact")
		}
		m, err := ParseManifest(b)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				return nil, fail(f+"."+e.Field, "%s", e.Reason)
			}
			return nil, fail(f, "%v", err)
		}
		if roots[m.Root.URN] {
			return nil, fail(f+".root.urn", "is the root of another closure too")
		}
		roots[m.Root.URN] = true
		if m.Root.URN == endpoint {
			own++
		}
		out = append(out, *m)
	}
	if own != 1 {
		return nil, fail("contract.closures", "no closure has the endpoint as its root urn")
	}
	return out, nil
}

// ParseManifest parses one closure's bytes closed as {v:1, root, members} and checks it (see
// Contract.Check); the root is an endpoint member whose urn is an endpoint name.
func ParseManifest(b []byte) (*Manifest, error) {
	o, err := object(b, "manifest")
	if err != nil {
		return nil, err
	}
	if err := o.only([]string{"v", "root", "members"}, "v", "root", "members"); err != nil {
		return nil, err
	}
	v, err := o.integer("v")
	if err != nil {
		return nil, err
	}
	if v != 1 {
		return nil, fail("manifest.v", "is not 1")
	}
	ro, err := o.sub("root")
	if err != nil {
		return nil, err
	}
	root, err := parseMember(ro)
	if err != nil {
		return nil, err
	}
	if root.Kind != MemberEndpoint || !ValidEndpoint(root.URN) {
		return nil, fail("manifest.root", "is not an endpoint member named by an endpoint name")
	}
	raws, err := array(o.m["members"], "manifest.members", MaxManifestMembers)
	if err != nil {
		return nil, err
	}
	m := &Manifest{V: 1, Root: *root, Members: make([]Member, 0, len(raws))}
	seen := make(map[string]bool, len(raws))
	for i, raw := range raws {
		mo, err := object(raw, fmt.Sprintf("manifest.members[%d]", i))
		if err != nil {
			return nil, err
		}
		mem, err := parseMember(mo)
		if err != nil {
			return nil, err
		}
		if seen[mem.URN] {
			return nil, fail(mo.path+".urn", "appears twice in the manifest")
		}
		seen[mem.URN] = true
		m.Members = append(m.Members, *mem)
	}
	return m, nil
}

func parseMember(o *obj) (*Member, error) {
	if err := o.only([]string{"urn", "kind", "lifetime", "governed"}, "urn", "kind"); err != nil {
		return nil, err
	}
	var m Member
	var err error
	if m.URN, err = o.str("urn"); err != nil {
		return nil, err
	}
	if !validURN(m.URN) {
		return nil, fail(o.field("urn"), "is not 1 to %d bytes of UTF-8 without spaces or control characters", maxURNLen)
	}
	if m.Kind, err = o.str("kind"); err != nil {
		return nil, err
	}
	switch m.Kind {
	case MemberEndpoint, MemberType:
	case MemberCommand:
		if m.Lifetime, err = o.str("lifetime"); err != nil {
			return nil, err
		}
		if m.Lifetime != LifetimeEphemeral {
			return nil, fail(o.field("lifetime"), "a command's lifetime is not %q", LifetimeEphemeral)
		}
	case MemberTrait:
		if m.Governed, err = o.boolean("governed"); err != nil {
			return nil, err
		}
		if m.Governed {
			return nil, fail(o.field("governed"), "a service declares no governed trait")
		}
	default:
		return nil, fail(o.field("kind"), "is not endpoint, command, trait or type")
	}
	if m.Kind != MemberCommand && o.has("lifetime") {
		return nil, fail(o.field("lifetime"), "only a command has a lifetime")
	}
	if m.Kind != MemberTrait && o.has("governed") {
		return nil, fail(o.field("governed"), "only a trait has governed")
	}
	return &m, nil
}

func validURN(s string) bool {
	if s == "" || len(s) > maxURNLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r <= 0x20 || r == 0x7f || unicode.IsControl(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Snapshot is what a witness hashes: {v:1, account, space, owner, endpoint, instance,
// generation, contract}.
type Snapshot struct {
	V          int      `json:"v"`
	Account    string   `json:"account"`
	Space      string   `json:"space"`
	Owner      string   `json:"owner"`
	Endpoint   string   `json:"endpoint"`
	Instance   string   `json:"instance"`
	Generation uint64   `json:"generation"`
	Contract   Contract `json:"contract"`
}

// Canonical returns the snapshot's canonical bytes: JSON with keys sorted at every level, no
// insignificant whitespace, HTML characters unescaped (strings otherwise as encoding/json
// writes them: U+2028 and U+2029 escaped), integers plain and artifact bytes in standard padded
// base64 (as encoding/json writes []byte). The same snapshot gives the same
// bytes everywhere. A nil list is written as [] and nil bytes as "". It does not validate; see
// ParseSnapshot and Contract.Check.
func (s Snapshot) Canonical() ([]byte, error) {
	c := s.Contract
	if c.Closures == nil {
		c.Closures = []string{}
	}
	arts := make([]Artifact, len(c.Artifacts))
	for i, a := range c.Artifacts {
		if a.Bytes == nil {
			a.Bytes = []byte{}
		}
		arts[i] = a
	}
	c.Artifacts = arts
	s.Contract = c
	return marshalCanonical(s)
}

// WitnessOf returns "w_" + lowercase unpadded base32 of SHA-256(canonical).
func WitnessOf(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return "w_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
}

// ParseSnapshot parses canonical snapshot bytes closed and checks them: v 1, account a NATS
// account public key, space a space name, owner a derived owner, endpoint an endpoint name,
// instance an instance id, generation 1..2^53-1, a contract that passes Check(endpoint), and b
// exactly the snapshot's Canonical bytes (so WitnessOf(b) is its witness).
func ParseSnapshot(b []byte) (*Snapshot, error) {
	o, err := object(b, "snapshot")
	if err != nil {
		return nil, err
	}
	keys := []string{"v", "account", "space", "owner", "endpoint", "instance", "generation", "contract"}
	if err := o.only(keys, keys...); err != nil {
		return nil, err
	}
	s := &Snapshot{}
	v, err := o.integer("v")
	if err != nil {
		return nil, err
	}
	if v != 1 {
		return nil, fail("snapshot.v", "is not 1")
	}
	s.V = 1
	if s.Account, err = o.str("account"); err != nil {
		return nil, err
	}
	if s.Space, err = o.str("space"); err != nil {
		return nil, err
	}
	if s.Owner, err = o.str("owner"); err != nil {
		return nil, err
	}
	if s.Endpoint, err = o.str("endpoint"); err != nil {
		return nil, err
	}
	if s.Instance, err = o.str("instance"); err != nil {
		return nil, err
	}
	g, err := o.integer("generation")
	if err != nil {
		return nil, err
	}
	s.Generation = uint64(g)
	switch {
	case !nkeys.IsValidPublicAccountKey(s.Account):
		return nil, fail("snapshot.account", "is not a NATS account public key")
	case space.ValidateName(s.Space) != nil:
		return nil, fail("snapshot.space", "is not a space name")
	case !validDerivedOwner(s.Owner):
		return nil, fail("snapshot.owner", "is not a derived owner")
	case !ValidEndpoint(s.Endpoint):
		return nil, fail("snapshot.endpoint", "is not an endpoint name")
	case !validInstance(s.Instance):
		return nil, fail("snapshot.instance", "is not an instance id")
	case s.Generation < 1:
		return nil, fail("snapshot.generation", "is not at least 1")
	}
	c, err := parseContract(o, "contract", s.Endpoint)
	if err != nil {
		return nil, err
	}
	s.Contract = *c
	canon, err := s.Canonical()
	if err != nil {
		return nil, fail("snapshot", "does not encode: %v", err)
	}
	if !bytes.Equal(canon, b) {
		return nil, fail("snapshot", "is not in canonical form")
	}
	return s, nil
}

// parseContract reads member k of o closed as {closures, artifacts:[{digest, bytes}]} (bytes
// canonical padded standard base64) and checks it with Check(endpoint).
func parseContract(o *obj, k, endpoint string) (*Contract, error) {
	co, err := o.sub(k)
	if err != nil {
		return nil, err
	}
	if err := co.only([]string{"closures", "artifacts"}, "closures", "artifacts"); err != nil {
		return nil, err
	}
	cl, err := array(co.m["closures"], co.field("closures"), MaxClosures)
	if err != nil {
		return nil, err
	}
	c := &Contract{Closures: make([]string, 0, len(cl))}
	for i, raw := range cl {
		var d string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &d) != nil {
			return nil, fail(fmt.Sprintf("%s[%d]", co.field("closures"), i), "is not a string")
		}
		c.Closures = append(c.Closures, d)
	}
	ar, err := array(co.m["artifacts"], co.field("artifacts"), MaxArtifacts)
	if err != nil {
		return nil, err
	}
	c.Artifacts = make([]Artifact, 0, len(ar))
	for i, raw := range ar {
		ao, err := object(raw, fmt.Sprintf("%s[%d]", co.field("artifacts"), i))
		if err != nil {
			return nil, err
		}
		if err := ao.only([]string{"digest", "bytes"}, "digest", "bytes"); err != nil {
			return nil, err
		}
		var a Artifact
		if a.Digest, err = ao.str("digest"); err != nil {
			return nil, err
		}
		enc, err := ao.str("bytes")
		if err != nil {
			return nil, err
		}
		if a.Bytes, err = base64.StdEncoding.Strict().DecodeString(enc); err != nil || base64.StdEncoding.EncodeToString(a.Bytes) != enc {
			return nil, fail(ao.field("bytes"), "is not canonical padded standard base64")
		}
		c.Artifacts = append(c.Artifacts, a)
	}
	if _, err := c.Check(endpoint); err != nil {
		return nil, err
	}
	return c, nil
}

// BodyDigest returns the digest a request ledger binds a requestId to: "sha256:<hex>" of the
// request's canonical JSON (keys sorted at every level, as Snapshot.Canonical); the proof is not
// part of it.
func BodyDigest(r *Request) (string, error) {
	if r == nil {
		return "", fail("request", "is missing")
	}
	b, err := marshalCanonical(r)
	if err != nil {
		return "", fail("request", "does not encode: %v", err)
	}
	return Digest(b), nil
}
