package authority

// TEMPORARY (delete at merge with pkg/serviceaccess and signerd's SignServiceCredential filled):
// while the floor's serviceaccess functions and signerd's SignServiceCredential answer "not
// implemented", the service state tests run on these stand-ins. Each is installed only when the
// real one refuses as a floor, so after the merge the tests run on the real parts unchanged.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// sepTempInstall gives a the stand-in serviceaccess functions if the package is still a floor.
func sepTempInstall(a *Authority, probe serviceaccess.Snapshot) bool {
	if _, err := probe.Canonical(); err == nil || !strings.Contains(err.Error(), "not implemented") {
		return false
	}
	a.sep.fns = &sepFuncs{
		check: func(c *serviceaccess.Contract, ep string) error {
			if len(c.Closures) == 0 {
				return errors.New("no closure")
			}
			return nil
		},
		canonical: func(s serviceaccess.Snapshot) ([]byte, error) { return json.Marshal(s) },
		witnessOf: func(b []byte) string {
			sum := sha256.Sum256(b)
			return "w_" + sepBase32.EncodeToString(sum[:])
		},
		bodyDigest: func(r *serviceaccess.Request) (string, error) {
			b, err := json.Marshal(r)
			sum := sha256.Sum256(b)
			return "sha256:" + hex.EncodeToString(sum[:]), err
		},
	}
	return true
}

// sepTempSigner is signerd with a stand-in SignServiceCredential while signerd answers it
// Unimplemented: an opaque token, the lifetime capped and bounded by not_after as signerd does.
type sepTempSigner struct {
	signerv1.SignerServiceClient
	now func() time.Time
}

func (s sepTempSigner) SignServiceCredential(ctx context.Context, in *signerv1.SignServiceCredentialRequest, _ ...grpc.CallOption) (*signerv1.SignServiceCredentialResponse, error) {
	capTTL := serviceaccess.MaxAccessLifetime
	if in.GetKind() == signerv1.ServiceCredentialKind_SERVICE_CREDENTIAL_KIND_RENEWAL {
		capTTL = serviceaccess.MaxRenewalLifetime
	}
	now := s.now()
	if in.GetTtl().AsDuration() < time.Second || !in.GetNotAfter().AsTime().After(now) {
		return nil, status.Error(codes.InvalidArgument, "ttl invalid")
	}
	exp := now.Add(min(capTTL, in.GetTtl().AsDuration()))
	if na := in.GetNotAfter().AsTime(); na.Before(exp) {
		exp = na
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return &signerv1.SignServiceCredentialResponse{Token: "temp." + in.GetKind().String() + "." + hex.EncodeToString(b[:]),
		Kid: "temp", ExpiresAt: timestamppb.New(exp), Jti: sepBase32.EncodeToString(b[:])}, nil
}

// sepTempSignerOr returns c, or c with the stand-in if signerd does not implement the RPC.
func sepTempSignerOr(c signerv1.SignerServiceClient, now func() time.Time) (signerv1.SignerServiceClient, bool) {
	_, err := c.SignServiceCredential(context.Background(), &signerv1.SignServiceCredentialRequest{})
	if status.Code(err) == codes.Unimplemented {
		return sepTempSigner{SignerServiceClient: c, now: now}, true
	}
	return c, false
}
