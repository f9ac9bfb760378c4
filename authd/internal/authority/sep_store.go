package authority

import (
	"context"
	"fmt"

	"github.com/cotalgo/cotal/pkg/lifecycle"
	"github.com/cotalgo/cotal/pkg/space"
)

// The service endpoint rows (lifecycle seprows.go) in the auth bucket, read leader-served like
// every lifecycle row and written create-only or by expected revision under their own bounds.
// A marker, a TTL or a row that does not decode is ErrCorrupt, which the route answers 503.

// sepAnswerBytes bounds the STREAM.MSG.GET answer of a service row (base64 is 4/3 of the row).
func sepAnswerBytes(rowMax int) int { return rowMax/3*4 + 4096 }

// getSep reads key in the auth bucket under rowMax and decodes it with decode.
func getSep[T any](ctx context.Context, s *Store, key string, rowMax int, decode func(string, []byte) (T, error)) (T, uint64, bool, error) {
	var zero T
	e, ok, err := s.getRaw(ctx, space.Auth, key, sepAnswerBytes(rowMax))
	if err != nil || !ok {
		return zero, 0, ok, err
	}
	v, err := decode(key, e.Value)
	if err != nil {
		return zero, 0, false, fmt.Errorf("%w: %s: %v", ErrCorrupt, key, err)
	}
	return v, e.Revision, true, nil
}

// ServiceName reads sep.name.<epTok>.
func (s *Store) ServiceName(ctx context.Context, endpoint string) (lifecycle.ServiceName, uint64, bool, error) {
	key, err := lifecycle.ServiceNameKey(endpoint)
	if err != nil {
		return lifecycle.ServiceName{}, 0, false, err
	}
	return getSep(ctx, s, key, lifecycle.MaxServiceRowBytes, lifecycle.DecodeServiceName)
}

// ServiceLedger reads sep.req.<epTok>.<iid>.
func (s *Store) ServiceLedger(ctx context.Context, endpoint, iid string) (lifecycle.ServiceLedger, uint64, bool, error) {
	key, err := lifecycle.ServiceLedgerKey(endpoint, iid)
	if err != nil {
		return lifecycle.ServiceLedger{}, 0, false, err
	}
	return getSep(ctx, s, key, lifecycle.MaxServiceRowBytes, lifecycle.DecodeServiceLedger)
}

// ServiceProposal reads sep.prop.<epTok>.<iid>.
func (s *Store) ServiceProposal(ctx context.Context, endpoint, iid string) (lifecycle.ServiceProposal, uint64, bool, error) {
	key, err := lifecycle.ServiceProposalKey(endpoint, iid)
	if err != nil {
		return lifecycle.ServiceProposal{}, 0, false, err
	}
	return getSep(ctx, s, key, lifecycle.MaxServiceRowBytes, lifecycle.DecodeServiceProposal)
}

// ServiceRoot reads sep.root.<epTok>.<iid>.
func (s *Store) ServiceRoot(ctx context.Context, endpoint, iid string) (lifecycle.ServiceRoot, uint64, bool, error) {
	key, err := lifecycle.ServiceRootKey(endpoint, iid)
	if err != nil {
		return lifecycle.ServiceRoot{}, 0, false, err
	}
	return getSep(ctx, s, key, lifecycle.MaxServiceRowBytes, lifecycle.DecodeServiceRoot)
}

// ServiceArtifact reads sep.art.<hex>.
func (s *Store) ServiceArtifact(ctx context.Context, digest string) (lifecycle.ServiceArtifact, uint64, bool, error) {
	key, err := lifecycle.ServiceArtifactKey(digest)
	if err != nil {
		return lifecycle.ServiceArtifact{}, 0, false, err
	}
	return getSep(ctx, s, key, lifecycle.MaxServiceArtifactRowBytes, lifecycle.DecodeServiceArtifact)
}

// putSep creates (rev 0) or updates at rev a service row of at most rowMax bytes.
func (s *Store) putSep(ctx context.Context, key string, value []byte, rev uint64, rowMax int) (uint64, error) {
	return s.putMax(ctx, space.Auth, key, value, rev, rowMax)
}
