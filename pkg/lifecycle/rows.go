package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cotalgo/cotal/pkg/space"
)

// MaxRowBytes bounds every row this package decodes; a real row is a few hundred bytes.
const MaxRowBytes = 4096

// MaxLabelLen bounds a head's managerInstance and a reservation's mintedBy, in bytes.
const MaxLabelLen = 192

// MaxFrontierStreams bounds the streams a frontier records.
const MaxFrontierStreams = 16

// ErrCorrupt is wrapped by every row decoder's refusal. A row that does not decode is corruption
// of an authority store, never "absent" and never a default.
var ErrCorrupt = errors.New("lifecycle: corrupt row")

// rowPrefix starts every encoded row: the version first.
const rowPrefix = `{"v":1,`

// HeadState is a lifecycle head's state. Only active is current.
type HeadState string

// The head states.
const (
	HeadActive   HeadState = "active"
	HeadRetiring HeadState = "retiring"
	HeadRetired  HeadState = "retired"
)

// GateState is an issuance gate's state, for both gate families.
type GateState string

// The gate states.
const (
	GateOpen    GateState = "open"
	GateFrozen  GateState = "frozen"
	GateRetired GateState = "retired"
)

// OpKind names the operation a frozen or retired gate, or a retiring head, is bound to.
type OpKind string

// The operation kinds.
const (
	OpActivation   OpKind = "activation"
	OpRegistration OpKind = "registration"
	OpRetirement   OpKind = "retirement"
)

// Op binds a row to the operation that owns its freeze (or terminated it).
type Op struct {
	OpID string `json:"opId"`
	Kind OpKind `json:"kind"`
}

// Head is the value of lifecycle.<owner>.<actor> (records bucket): the alias's current
// incarnation. Its KV revision is its mapping revision.
type Head struct {
	Owner           string    `json:"owner"`
	Actor           string    `json:"actor"`
	LifecycleUID    string    `json:"lifecycleUid"`
	ManagerInstance string    `json:"managerInstance"`
	ProcessEpoch    uint64    `json:"processEpoch"`
	State           HeadState `json:"state"`
	// Op is required when State is retiring (kind retirement, the uid's managed retirement
	// opId) and absent otherwise.
	Op *Op `json:"op,omitempty"`
}

// Reservation is the value of uid.<uid> (records bucket): create-only and never deleted, so a
// uid names one incarnation of one alias for the life of the space.
type Reservation struct {
	Owner    string `json:"owner"`
	Actor    string `json:"actor"`
	MintedBy string `json:"mintedBy"`
}

// StreamCutoff is one stream's last sequence when a lifecycle retired.
type StreamCutoff struct {
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
}

// Frontier is the value of frontier.<uid> (records bucket): written once by the retirement
// barrier before the gate and head terminals, never deleted.
type Frontier struct {
	LifecycleUID string `json:"lifecycleUid"`
	// OpID is the uid's managed retirement opId.
	OpID string `json:"opId"`
	// Streams are sorted by name, each at most once.
	Streams []StreamCutoff `json:"streams"`
}

// Spec is the value of svc.<endpoint token>.<instanceId> (records bucket): an endpoint
// instance's registration. Its KV revision is the registration revision the gate records.
type Spec struct {
	Endpoint   string `json:"endpoint"`
	InstanceID string `json:"instanceId"`
	// Principal is the serving connection's <owner>.<actor>.
	Principal    string `json:"principal"`
	ProcessEpoch uint64 `json:"processEpoch"`
	// Service is present only on a service endpoint's registration (seed 002): the manager's
	// specs carry none and encode byte for byte as before.
	Service *SpecService `json:"service,omitempty"`
}

// Gate is the value of gate.<uid> (auth bucket): a managed lifecycle's issuance gate. It is born
// frozen by its activation at generation 0 (BornGate); the activation reopens it at generation 1.
type Gate struct {
	LifecycleUID string    `json:"lifecycleUid"`
	State        GateState `json:"state"`
	Generation   uint64    `json:"generation"`
	// Op is absent when open and required when frozen or retired: an activation (the uid's
	// activation opId, generation 0) or a retirement (the uid's managed retirement opId).
	Op *Op `json:"op,omitempty"`
}

// EndpointGate is the value of epgate.<endpoint token>.<instanceId> (auth bucket): one gate
// family for every endpoint, the manager (endpoint "manager") included.
type EndpointGate struct {
	State GateState `json:"state"`
	// Principal is the serving connection's <owner>.<actor>, the one the gate admits.
	Principal            string `json:"principal"`
	ProcessEpoch         uint64 `json:"processEpoch"`
	RegistrationRevision uint64 `json:"registrationRevision"`
	Generation           uint64 `json:"generation"`
	// Op is absent when open and required when frozen (registration or retirement) or retired
	// (retirement).
	Op *Op `json:"op,omitempty"`
}

// Stage is the value of stage.<opId> (auth bucket): a retirement's intent, written before the
// freeze; the key's opId is the uid's managed retirement opId, so only that operation resumes it.
type Stage struct {
	Kind           OpKind `json:"kind"`
	Owner          string `json:"owner"`
	Actor          string `json:"actor"`
	LifecycleUID   string `json:"lifecycleUid"`
	FromGeneration uint64 `json:"fromGeneration"`
}

// BornGate is the gate an activation creates at uid: frozen by the uid's activation opId at
// generation 0.
func BornGate(uid string) (Gate, error) {
	op, err := ActivationOpID(uid)
	if err != nil {
		return Gate{}, err
	}
	return Gate{LifecycleUID: uid, State: GateFrozen, Op: &Op{OpID: op, Kind: OpActivation}}, nil
}

func (h *Head) validate() error {
	if _, err := space.PrincipalKey(h.Owner, h.Actor); err != nil {
		return err
	}
	if err := space.ValidateUID(h.LifecycleUID); err != nil {
		return err
	}
	if err := checkLabel("managerInstance", h.ManagerInstance); err != nil {
		return err
	}
	if h.ProcessEpoch < 1 || h.ProcessEpoch > MaxSafeInteger {
		return errors.New("processEpoch is not in 1..2^53-1")
	}
	switch h.State {
	case HeadActive, HeadRetired:
		if h.Op != nil {
			return fmt.Errorf("a %s head carries an op", h.State)
		}
	case HeadRetiring:
		if h.Op == nil {
			return errors.New("a retiring head has no op")
		}
		if h.Op.Kind != OpRetirement || h.Op.OpID != mustOpID("retire:", h.LifecycleUID) {
			return errors.New("a retiring head's op is not its uid's managed retirement")
		}
	default:
		return fmt.Errorf("state %q is not active, retiring or retired", clip(string(h.State)))
	}
	return nil
}

func (r *Reservation) validate() error {
	if _, err := space.PrincipalKey(r.Owner, r.Actor); err != nil {
		return err
	}
	return checkLabel("mintedBy", r.MintedBy)
}

func (f *Frontier) validate() error {
	if err := space.ValidateUID(f.LifecycleUID); err != nil {
		return err
	}
	if f.OpID != mustOpID("retire:", f.LifecycleUID) {
		return errors.New("opId is not the uid's managed retirement opId")
	}
	if f.Streams == nil {
		return errors.New("streams is null")
	}
	if len(f.Streams) > MaxFrontierStreams {
		return fmt.Errorf("more than %d streams", MaxFrontierStreams)
	}
	for i, s := range f.Streams {
		if !isStreamName(s.Stream) {
			return fmt.Errorf("stream %q is not [A-Za-z0-9_-]{1,255}", clip(s.Stream))
		}
		if i > 0 && f.Streams[i-1].Stream >= s.Stream {
			return errors.New("streams are not sorted and unique")
		}
		if s.Seq > MaxSafeInteger {
			return errors.New("a sequence is above 2^53-1")
		}
	}
	return nil
}

func (s *Spec) validate() error {
	if _, err := EndpointToken(s.Endpoint); err != nil {
		return err
	}
	if err := space.ValidateUID(s.InstanceID); err != nil {
		return err
	}
	if err := checkPrincipal(s.Principal); err != nil {
		return err
	}
	if s.ProcessEpoch > MaxSafeInteger {
		return errors.New("processEpoch is above 2^53-1")
	}
	if s.Service != nil {
		if s.Endpoint == ManagerEndpoint {
			return errors.New("the manager's spec carries a service registration")
		}
		if err := s.Service.validate(s.Principal, s.InstanceID); err != nil {
			return fmt.Errorf("service: %w", err)
		}
	}
	return nil
}

func (g *Gate) validate() error {
	if err := space.ValidateUID(g.LifecycleUID); err != nil {
		return err
	}
	if g.Generation > MaxSafeInteger {
		return errors.New("generation is above 2^53-1")
	}
	if err := checkGateOp(g.State, g.Op); err != nil {
		return err
	}
	if g.Op == nil {
		if g.Generation < 1 {
			return errors.New("an open gate at generation 0")
		}
		return nil
	}
	switch g.Op.Kind {
	case OpActivation:
		if g.Op.OpID != mustOpID("activate:", g.LifecycleUID) {
			return errors.New("an activation op that is not the uid's activation opId")
		}
		if g.Generation != 0 {
			return errors.New("an activation op past generation 0")
		}
	case OpRetirement:
		if g.Op.OpID != mustOpID("retire:", g.LifecycleUID) {
			return errors.New("a retirement op that is not the uid's managed retirement opId")
		}
	default:
		return fmt.Errorf("op kind %q on a lifecycle gate", clip(string(g.Op.Kind)))
	}
	return nil
}

func (g *EndpointGate) validate() error {
	if err := checkPrincipal(g.Principal); err != nil {
		return err
	}
	if g.ProcessEpoch > MaxSafeInteger || g.Generation > MaxSafeInteger || g.RegistrationRevision > MaxSafeInteger {
		return errors.New("an integer is above 2^53-1")
	}
	if g.RegistrationRevision < 1 {
		return errors.New("registrationRevision is 0 (a spec revision is at least 1)")
	}
	if err := checkGateOp(g.State, g.Op); err != nil {
		return err
	}
	if g.Op == nil {
		return nil
	}
	if err := space.ValidateUID(g.Op.OpID); err != nil {
		return fmt.Errorf("opId: %w", err)
	}
	switch {
	case g.Op.Kind == OpRetirement:
	case g.Op.Kind == OpRegistration && g.State == GateFrozen:
	default:
		return fmt.Errorf("a %s endpoint gate under op kind %q", g.State, clip(string(g.Op.Kind)))
	}
	return nil
}

func (s *Stage) validate() error {
	if s.Kind != OpRetirement {
		return fmt.Errorf("kind %q is not retirement", clip(string(s.Kind)))
	}
	if _, err := space.PrincipalKey(s.Owner, s.Actor); err != nil {
		return err
	}
	if err := space.ValidateUID(s.LifecycleUID); err != nil {
		return err
	}
	if s.FromGeneration < 1 || s.FromGeneration > MaxSafeInteger {
		return errors.New("fromGeneration is not in 1..2^53-1")
	}
	return nil
}

// checkGateOp: open has no op; frozen and retired have one.
func checkGateOp(st GateState, op *Op) error {
	switch st {
	case GateOpen:
		if op != nil {
			return errors.New("an open gate carries an op")
		}
	case GateFrozen, GateRetired:
		if op == nil {
			return fmt.Errorf("a %s gate has no op", st)
		}
	default:
		return fmt.Errorf("state %q is not open, frozen or retired", clip(string(st)))
	}
	return nil
}

func checkPrincipal(p string) error {
	owner, actor, ok := strings.Cut(p, ".")
	if !ok {
		return fmt.Errorf("principal %q is not <owner>.<actor>", clip(p))
	}
	_, err := space.PrincipalKey(owner, actor)
	return err
}

// checkLabel: a free-text label an operator reads: 1..MaxLabelLen bytes of UTF-8 without controls.
func checkLabel(field, s string) error {
	if s == "" || len(s) > MaxLabelLen || !utf8.ValidString(s) {
		return fmt.Errorf("%s is empty, over %d bytes or not UTF-8", field, MaxLabelLen)
	}
	for _, r := range s {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return fmt.Errorf("%s has control character %U", field, r)
		}
	}
	return nil
}

func isStreamName(s string) bool {
	if s == "" || len(s) > space.MaxJSNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

type validator interface{ validate() error }

// encodeRow validates r and writes its canonical form: {"v":1, then the fields in declaration
// order, no HTML escaping, no trailing newline; at most MaxRowBytes.
func encodeRow[T any, P interface {
	*T
	validator
}](what string, r T) ([]byte, error) {
	return encodeRowMax[T, P](what, r, MaxRowBytes)
}

// encodeRowMax is encodeRow with its own bound (the service rows' are larger).
func encodeRowMax[T any, P interface {
	*T
	validator
}](what string, r T, max int) ([]byte, error) {
	if err := P(&r).validate(); err != nil {
		return nil, fmt.Errorf("lifecycle: encode %s: %w", what, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, fmt.Errorf("lifecycle: encode %s: %w", what, err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
	out := append([]byte(rowPrefix), b[1:]...)
	if len(out) > max {
		return nil, fmt.Errorf("lifecycle: encode %s: %d bytes (at most %d)", what, len(out), max)
	}
	return out, nil
}

// decodeRow reads a row strictly: at most MaxRowBytes, version 1 first, one object with no
// unknown field and no trailing data, every field in its grammar, and byte for byte the canonical
// encoding of what it decoded (so a duplicate, reordered, re-cased, missing or null field, a
// non-canonical number or escape, or whitespace is refused too).
func decodeRow[T any, P interface {
	*T
	validator
}](what string, b []byte) (T, error) {
	return decodeRowMax[T, P](what, b, MaxRowBytes)
}

// decodeRowMax is decodeRow with its own bound.
func decodeRowMax[T any, P interface {
	*T
	validator
}](what string, b []byte, max int) (T, error) {
	var zero, r T
	if len(b) > max {
		return zero, fmt.Errorf("%w: %s of %d bytes (at most %d)", ErrCorrupt, what, len(b), max)
	}
	if !bytes.HasPrefix(b, []byte(rowPrefix)) {
		return zero, fmt.Errorf("%w: %s does not start with %s", ErrCorrupt, what, rowPrefix)
	}
	body := append([]byte{'{'}, b[len(rowPrefix):]...)
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return zero, fmt.Errorf("%w: %s: %v", ErrCorrupt, what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return zero, fmt.Errorf("%w: %s: trailing data after the object", ErrCorrupt, what)
	}
	if err := P(&r).validate(); err != nil {
		return zero, fmt.Errorf("%w: %s: %v", ErrCorrupt, what, err)
	}
	enc, err := encodeRowMax[T, P](what, r, max)
	if err != nil || !bytes.Equal(enc, b) {
		return zero, fmt.Errorf("%w: %s is not in canonical form", ErrCorrupt, what)
	}
	return r, nil
}

// EncodeHead validates h and returns its canonical row.
func EncodeHead(h Head) ([]byte, error) { return encodeRow[Head]("head", h) }

// DecodeHead decodes the row stored at key, a head key whose owner and actor the row must name.
func DecodeHead(key string, b []byte) (Head, error) {
	owner, actor, err := ParseHeadKey(key)
	if err != nil {
		return Head{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	h, err := decodeRow[Head]("head", b)
	if err != nil {
		return Head{}, err
	}
	if h.Owner != owner || h.Actor != actor {
		return Head{}, fmt.Errorf("%w: head at %s names another alias", ErrCorrupt, key)
	}
	return h, nil
}

// EncodeReservation validates r and returns its canonical row.
func EncodeReservation(r Reservation) ([]byte, error) {
	return encodeRow[Reservation]("reservation", r)
}

// DecodeReservation decodes the row stored at key, a uid reservation key.
func DecodeReservation(key string, b []byte) (Reservation, error) {
	if _, err := ParseUIDKey(key); err != nil {
		return Reservation{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return decodeRow[Reservation]("reservation", b)
}

// EncodeFrontier validates f and returns its canonical row (a nil Streams is written as []).
func EncodeFrontier(f Frontier) ([]byte, error) {
	if f.Streams == nil {
		f.Streams = []StreamCutoff{}
	}
	return encodeRow[Frontier]("frontier", f)
}

// DecodeFrontier decodes the row stored at key, a frontier key whose uid the row must name.
func DecodeFrontier(key string, b []byte) (Frontier, error) {
	uid, err := ParseFrontierKey(key)
	if err != nil {
		return Frontier{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	f, err := decodeRow[Frontier]("frontier", b)
	if err != nil {
		return Frontier{}, err
	}
	if f.LifecycleUID != uid {
		return Frontier{}, fmt.Errorf("%w: frontier at %s names another uid", ErrCorrupt, key)
	}
	return f, nil
}

// EncodeSpec validates s and returns its canonical row.
func EncodeSpec(s Spec) ([]byte, error) { return encodeRow[Spec]("spec", s) }

// DecodeSpec decodes the row stored at key, a spec key whose endpoint and instance the row must
// name.
func DecodeSpec(key string, b []byte) (Spec, error) {
	ep, iid, err := ParseSpecKey(key)
	if err != nil {
		return Spec{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	s, err := decodeRow[Spec]("spec", b)
	if err != nil {
		return Spec{}, err
	}
	if s.Endpoint != ep || s.InstanceID != iid {
		return Spec{}, fmt.Errorf("%w: spec at %s names another endpoint instance", ErrCorrupt, key)
	}
	return s, nil
}

// EncodeGate validates g and returns its canonical row.
func EncodeGate(g Gate) ([]byte, error) { return encodeRow[Gate]("gate", g) }

// DecodeGate decodes the row stored at key, a gate key whose uid the row must name.
func DecodeGate(key string, b []byte) (Gate, error) {
	uid, err := ParseGateKey(key)
	if err != nil {
		return Gate{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	g, err := decodeRow[Gate]("gate", b)
	if err != nil {
		return Gate{}, err
	}
	if g.LifecycleUID != uid {
		return Gate{}, fmt.Errorf("%w: gate at %s names another uid", ErrCorrupt, key)
	}
	return g, nil
}

// EncodeEndpointGate validates g and returns its canonical row.
func EncodeEndpointGate(g EndpointGate) ([]byte, error) {
	return encodeRow[EndpointGate]("endpoint gate", g)
}

// DecodeEndpointGate decodes the row stored at key, an endpoint gate key. A gate frozen by a
// registration must carry RegistrationOpID of its key's endpoint instance at its processEpoch.
func DecodeEndpointGate(key string, b []byte) (EndpointGate, error) {
	ep, iid, err := ParseEndpointGateKey(key)
	if err != nil {
		return EndpointGate{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	g, err := decodeRow[EndpointGate]("endpoint gate", b)
	if err != nil {
		return EndpointGate{}, err
	}
	if g.Op != nil && g.Op.Kind == OpRegistration {
		if op, _ := RegistrationOpID(ep, iid, g.ProcessEpoch); g.Op.OpID != op {
			return EndpointGate{}, fmt.Errorf("%w: endpoint gate at %s is frozen by another registration than its epoch's", ErrCorrupt, key)
		}
	}
	return g, nil
}

// EncodeStage validates s and returns its canonical row.
func EncodeStage(s Stage) ([]byte, error) { return encodeRow[Stage]("stage", s) }

// DecodeStage decodes the row stored at key, a stage key whose opId must be the managed
// retirement opId of the row's uid.
func DecodeStage(key string, b []byte) (Stage, error) {
	op, err := ParseStageKey(key)
	if err != nil {
		return Stage{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	s, err := decodeRow[Stage]("stage", b)
	if err != nil {
		return Stage{}, err
	}
	if op != mustOpID("retire:", s.LifecycleUID) {
		return Stage{}, fmt.Errorf("%w: stage at %s is not its uid's managed retirement", ErrCorrupt, key)
	}
	return s, nil
}
