package serviceaccess

import "errors"

// errFloor marks a body the floor commit has not filled yet.
var errFloor = errors.New("serviceaccess: not implemented yet")

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

// Check validates c for endpoint: order, uniqueness, digests, every closure read at its digest
// as a closed Manifest with root urn endpoint, commands ephemeral, no governed trait. It returns
// the manifests in closure order.
func (c *Contract) Check(endpoint string) ([]Manifest, error) { return nil, errFloor }

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string { return "" }

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

// Canonical returns the snapshot's canonical bytes: JSON with keys sorted, no insignificant
// whitespace, HTML characters unescaped. The same snapshot gives the same bytes everywhere.
func (s Snapshot) Canonical() ([]byte, error) { return nil, errFloor }

// WitnessOf returns "w_" + lowercase unpadded base32 of SHA-256(canonical).
func WitnessOf(canonical []byte) string { return "" }

// ValidWitness reports whether w is "w_" and 52 lowercase base32 characters.
func ValidWitness(w string) bool { return false }

// ValidRoot reports whether r is a root id: "r_" and 26 lowercase base32 characters.
func ValidRoot(r string) bool { return false }

// ValidProposal reports whether p is a proposal id: "p_" and 26 lowercase base32 characters.
func ValidProposal(p string) bool { return false }

// ValidRequestID reports whether id is a requestId: 8 to 64 of [A-Za-z0-9_-].
func ValidRequestID(id string) bool { return false }

// BodyDigest returns the digest a request ledger binds a requestId to: SHA-256 over the
// request's canonical bytes (the proof is not part of it).
func BodyDigest(r *Request) (string, error) { return "", errFloor }

// ParseEnvelope parses a POST body closed (see the package doc) and validates the request for
// its kind and the proof for its kind. It does not check authorization.
func ParseEnvelope(b []byte) (*Envelope, error) { return nil, errFloor }

// ParseAnswer parses an answer closed and validates its fields for its kind.
func ParseAnswer(b []byte) (*Answer, error) { return nil, errFloor }

// ParseInfo parses a GET answer closed.
func ParseInfo(b []byte) (*Info, error) { return nil, errFloor }

// HTTPStatus is the status an answer travels with (see AnswerKind and the denial codes).
func (a *Answer) HTTPStatus() int { return 0 }
