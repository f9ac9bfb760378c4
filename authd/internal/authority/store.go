package authority

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// Store errors. A read that finds a delete or purge marker, a per-message TTL or a value its
// decoder refuses is ErrCorrupt (lifecycle.ErrCorrupt), never "absent": lifecycle keys are never
// deleted and never expire, so any of those means something other than authd wrote the bucket.
var (
	// ErrConflict is a write whose expected revision was not the key's last (another writer won).
	ErrConflict = errors.New("authority: the key changed since it was read")
	// ErrUnavailable wraps every failure to reach the stream (timeout, no responders, a JetStream
	// error other than "no message" or a lost expected revision).
	ErrUnavailable = errors.New("authority: the store is unavailable")
)

// Corrupt is lifecycle.ErrCorrupt: a row that exists but must not be read as a row or as absent.
var ErrCorrupt = lifecycle.ErrCorrupt

// maxMsgBytes bounds the JSON answer of one STREAM.MSG.GET: a lifecycle row is at most
// lifecycle.MaxRowBytes, base64 makes it 4/3 and the envelope adds little.
const maxMsgBytes = 4 * lifecycle.MaxRowBytes

// Entry is one key's last value and its revision (the stream sequence of that write).
type Entry struct {
	Value    []byte
	Revision uint64
}

// Store reads and writes lifecycle rows over the plane connection. Every read is the
// leader-served $JS.API.STREAM.MSG.GET (never a direct get, which a follower may answer from a
// stale replica); every write is a publish to $KV.<bucket>.<key> carrying the expected last
// subject sequence (0 for a create), never a TTL. It is safe for concurrent use.
type Store struct {
	nc      *nats.Conn
	names   space.Names
	timeout time.Duration
	reads   atomic.Uint64
	writes  atomic.Uint64
}

// NewStore returns a Store on nc for the space of names; timeout bounds one request (0: 5 s).
func NewStore(nc *nats.Conn, names space.Names, timeout time.Duration) (*Store, error) {
	if nc == nil {
		return nil, errors.New("authority: a connection is required")
	}
	if _, err := names.Bucket(space.Auth); err != nil {
		return nil, fmt.Errorf("authority: %w", err)
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return &Store{nc: nc, names: names, timeout: timeout}, nil
}

// Names is the space the store serves.
func (s *Store) Names() space.Names { return s.names }

// Reads and Writes count the requests this store has sent (tests prove "no read happened").
func (s *Store) Reads() uint64  { return s.reads.Load() }
func (s *Store) Writes() uint64 { return s.writes.Load() }

type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

// JetStream API error codes this file tells apart.
const (
	errNoMessage     = 10037 // JSNoMessageFoundErr
	errWrongLastSeq  = 10071 // JSStreamWrongLastSequenceErrF
	errStreamMissing = 10059 // JSStreamNotFoundErr
)

type msgGetResponse struct {
	Message *struct {
		Subject string `json:"subject"`
		Seq     uint64 `json:"seq"`
		Hdrs    []byte `json:"hdrs"`
		Data    []byte `json:"data"`
	} `json:"message"`
	Error *apiError `json:"error"`
}

// GetRaw leader-reads the last message on key in bucket kind. found is false only for a key
// that has never been written. A delete or purge marker or a message TTL is ErrCorrupt unless
// kind is space.Manager, whose lease rows expire and are released by design: there a marker reads
// as absent.
func (s *Store) GetRaw(ctx context.Context, kind space.BucketKind, key string) (Entry, bool, error) {
	return s.getRaw(ctx, kind, key, maxMsgBytes)
}

// getRaw is GetRaw with the bound of its answer (the service rows' are larger).
func (s *Store) getRaw(ctx context.Context, kind space.BucketKind, key string, maxAnswer int) (Entry, bool, error) {
	subj, err := s.names.KV(kind, key)
	if err != nil {
		return Entry{}, false, fmt.Errorf("authority: %w", err)
	}
	stream, err := s.names.BucketStream(kind)
	if err != nil {
		return Entry{}, false, fmt.Errorf("authority: %w", err)
	}
	api, err := space.StreamMsgGet(stream)
	if err != nil {
		return Entry{}, false, fmt.Errorf("authority: %w", err)
	}
	req, _ := json.Marshal(map[string]string{"last_by_subj": subj})
	ctx, cancel := s.bound(ctx)
	defer cancel()
	s.reads.Add(1)
	msg, err := s.nc.RequestWithContext(ctx, api, req)
	if err != nil {
		return Entry{}, false, fmt.Errorf("%w: read %s: %v", ErrUnavailable, key, err)
	}
	if len(msg.Data) > maxAnswer {
		return Entry{}, false, fmt.Errorf("%w: %s: answer of %d bytes", ErrCorrupt, key, len(msg.Data))
	}
	var resp msgGetResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return Entry{}, false, fmt.Errorf("%w: read %s: undecodable answer: %v", ErrUnavailable, key, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrCode == errNoMessage {
			return Entry{}, false, nil
		}
		return Entry{}, false, fmt.Errorf("%w: read %s: %s (%d)", ErrUnavailable, key, resp.Error.Description, resp.Error.ErrCode)
	}
	m := resp.Message
	if m == nil || m.Subject != subj || m.Seq == 0 {
		return Entry{}, false, fmt.Errorf("%w: read %s: the answer names another message", ErrUnavailable, key)
	}
	if len(m.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Hdrs)
		if err != nil {
			return Entry{}, false, fmt.Errorf("%w: %s: undecodable headers", ErrCorrupt, key)
		}
		op := h.Get("KV-Operation")
		if kind == space.Manager {
			if op == "DEL" || op == "PURGE" {
				return Entry{}, false, nil
			}
		} else {
			if op != "" {
				return Entry{}, false, fmt.Errorf("%w: %s carries a %s marker", ErrCorrupt, key, op)
			}
			if h.Get("Nats-TTL") != "" {
				return Entry{}, false, fmt.Errorf("%w: %s was written with a TTL", ErrCorrupt, key)
			}
		}
	}
	return Entry{Value: m.Data, Revision: m.Seq}, true, nil
}

// Create writes key only if it has never been written; ErrConflict if it has.
func (s *Store) Create(ctx context.Context, kind space.BucketKind, key string, value []byte) (uint64, error) {
	return s.put(ctx, kind, key, value, 0)
}

// Update writes key only if its last revision is rev (rev > 0); ErrConflict otherwise.
func (s *Store) Update(ctx context.Context, kind space.BucketKind, key string, value []byte, rev uint64) (uint64, error) {
	if rev == 0 {
		return 0, errors.New("authority: an update needs the revision it replaces")
	}
	return s.put(ctx, kind, key, value, rev)
}

type pubAck struct {
	Stream string    `json:"stream"`
	Seq    uint64    `json:"seq"`
	Error  *apiError `json:"error"`
}

func (s *Store) put(ctx context.Context, kind space.BucketKind, key string, value []byte, rev uint64) (uint64, error) {
	return s.putMax(ctx, kind, key, value, rev, lifecycle.MaxRowBytes)
}

// putMax is put with the bound of its value (the service rows' are larger).
func (s *Store) putMax(ctx context.Context, kind space.BucketKind, key string, value []byte, rev uint64, max int) (uint64, error) {
	if kind == space.Manager {
		return 0, errors.New("authority: the manager bucket is read-only here")
	}
	if len(value) == 0 || len(value) > max {
		return 0, fmt.Errorf("authority: %s: a row of %d bytes", key, len(value))
	}
	subj, err := s.names.KV(kind, key)
	if err != nil {
		return 0, fmt.Errorf("authority: %w", err)
	}
	stream, _ := s.names.BucketStream(kind)
	m := nats.NewMsg(subj)
	m.Data = value
	m.Header.Set(nats.ExpectedLastSubjSeqHdr, strconv.FormatUint(rev, 10))
	m.Header.Set(nats.ExpectedStreamHdr, stream)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	s.writes.Add(1)
	msg, err := s.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		// The write may have landed: callers re-read before deciding (every step adopts).
		return 0, fmt.Errorf("%w: write %s: %v", ErrUnavailable, key, err)
	}
	var ack pubAck
	if err := json.Unmarshal(msg.Data, &ack); err != nil {
		return 0, fmt.Errorf("%w: write %s: undecodable answer: %v", ErrUnavailable, key, err)
	}
	if ack.Error != nil {
		if ack.Error.ErrCode == errWrongLastSeq {
			return 0, fmt.Errorf("%w: %s", ErrConflict, key)
		}
		return 0, fmt.Errorf("%w: write %s: %s (%d)", ErrUnavailable, key, ack.Error.Description, ack.Error.ErrCode)
	}
	if ack.Stream != stream || ack.Seq == 0 {
		return 0, fmt.Errorf("%w: write %s: acknowledged by %q", ErrUnavailable, key, ack.Stream)
	}
	return ack.Seq, nil
}

func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.timeout)
}

// get reads key and decodes it with decode; absent is (zero, 0, false, nil).
func get[T any](ctx context.Context, s *Store, kind space.BucketKind, key string, decode func(string, []byte) (T, error)) (T, uint64, bool, error) {
	var zero T
	e, ok, err := s.GetRaw(ctx, kind, key)
	if err != nil || !ok {
		return zero, 0, ok, err
	}
	v, err := decode(key, e.Value)
	if err != nil {
		return zero, 0, false, fmt.Errorf("%w: %s: %v", ErrCorrupt, key, err)
	}
	return v, e.Revision, true, nil
}

// Head reads lifecycle.<owner>.<actor> (records).
func (s *Store) Head(ctx context.Context, owner, actor string) (lifecycle.Head, uint64, bool, error) {
	key, err := lifecycle.HeadKey(owner, actor)
	if err != nil {
		return lifecycle.Head{}, 0, false, err
	}
	return get(ctx, s, space.Records, key, lifecycle.DecodeHead)
}

// Reservation reads uid.<uid> (records).
func (s *Store) Reservation(ctx context.Context, uid string) (lifecycle.Reservation, uint64, bool, error) {
	key, err := lifecycle.UIDKey(uid)
	if err != nil {
		return lifecycle.Reservation{}, 0, false, err
	}
	return get(ctx, s, space.Records, key, lifecycle.DecodeReservation)
}

// Frontier reads frontier.<uid> (records).
func (s *Store) Frontier(ctx context.Context, uid string) (lifecycle.Frontier, uint64, bool, error) {
	key, err := lifecycle.FrontierKey(uid)
	if err != nil {
		return lifecycle.Frontier{}, 0, false, err
	}
	return get(ctx, s, space.Records, key, lifecycle.DecodeFrontier)
}

// Spec reads svc.<epTok>.<iid> (records).
func (s *Store) Spec(ctx context.Context, endpoint, instanceID string) (lifecycle.Spec, uint64, bool, error) {
	key, err := lifecycle.SpecKey(endpoint, instanceID)
	if err != nil {
		return lifecycle.Spec{}, 0, false, err
	}
	return get(ctx, s, space.Records, key, lifecycle.DecodeSpec)
}

// Gate reads gate.<uid> (auth).
func (s *Store) Gate(ctx context.Context, uid string) (lifecycle.Gate, uint64, bool, error) {
	key, err := lifecycle.GateKey(uid)
	if err != nil {
		return lifecycle.Gate{}, 0, false, err
	}
	return get(ctx, s, space.Auth, key, lifecycle.DecodeGate)
}

// Stage reads stage.<opId> (auth).
func (s *Store) Stage(ctx context.Context, opID string) (lifecycle.Stage, uint64, bool, error) {
	key, err := lifecycle.StageKey(opID)
	if err != nil {
		return lifecycle.Stage{}, 0, false, err
	}
	return get(ctx, s, space.Auth, key, lifecycle.DecodeStage)
}

// EndpointGate reads epgate.<epTok>.<iid> (auth).
func (s *Store) EndpointGate(ctx context.Context, endpoint, instanceID string) (lifecycle.EndpointGate, uint64, bool, error) {
	key, err := lifecycle.EndpointGateKey(endpoint, instanceID)
	if err != nil {
		return lifecycle.EndpointGate{}, 0, false, err
	}
	return get(ctx, s, space.Auth, key, lifecycle.DecodeEndpointGate)
}

// Lease reads the manager instance's lease.<instanceId> (manager bucket, lifecycle.ManagerLease).
// found is false for a key never written, deleted or purged (a released or expired lease); a row
// that does not decode, or names another instance, is ErrCorrupt.
func (s *Store) Lease(ctx context.Context, instanceID string) (lifecycle.ManagerLease, uint64, bool, error) {
	key, err := lifecycle.LeaseKey(instanceID)
	if err != nil {
		return lifecycle.ManagerLease{}, 0, false, err
	}
	return get(ctx, s, space.Manager, key, func(key string, b []byte) (lifecycle.ManagerLease, error) {
		r, err := lifecycle.DecodeManagerLease(b)
		if err != nil {
			return r, err
		}
		if r.InstanceID != instanceID {
			return lifecycle.ManagerLease{}, fmt.Errorf("%w: lease at %s names instance %s", ErrCorrupt, key, r.InstanceID)
		}
		return r, nil
	})
}
