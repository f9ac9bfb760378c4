package server

import (
	"errors"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every refusal signerd returns.
const ErrorDomain = "signer.cotal.dev"

// Reason codes the server adds to the policy's (policy.Reason values are reused as they are).
// Each maps to the REASON_* enum value of the same name in signer.proto.
const (
	reasonInvalidArgument    policy.Reason = "invalid-argument"
	reasonUnknownSpace       policy.Reason = "unknown-space"
	reasonForeignCredential  policy.Reason = "foreign-credential"
	reasonCredentialExpired  policy.Reason = "credential-expired"
	reasonBadProof           policy.Reason = "bad-proof"
	reasonStaleProof         policy.Reason = "stale-proof"
	reasonRequestIDConflict  policy.Reason = "request-id-conflict"
	reasonMacDomainForbidden policy.Reason = "mac-domain-not-allowed"
	reasonSystemKeyMissing   policy.Reason = "system-key-missing"
	// reasonUnauthenticated is audited for a caller whose verified certificate carries no usable
	// identity; the caller sees UNAUTHENTICATED without details.
	reasonUnauthenticated policy.Reason = "unauthenticated"
)

// refusal is a public error: a gRPC code, a stable reason and a short detail safe to return.
// The cause, if any, goes to the log only.
type refusal struct {
	code   codes.Code
	reason policy.Reason
	detail string
}

func (r *refusal) Error() string { return string(r.reason) + ": " + r.detail }

func refuse(code codes.Code, reason policy.Reason, detail string) *refusal {
	return &refusal{code: code, reason: reason, detail: detail}
}

func invalid(detail string) *refusal {
	return refuse(codes.InvalidArgument, reasonInvalidArgument, detail)
}

// codeFor is the gRPC code of a policy denial.
func codeFor(r policy.Reason) codes.Code {
	switch r {
	case policy.ReasonRateLimited:
		return codes.ResourceExhausted
	case policy.ReasonTTLInvalid:
		return codes.InvalidArgument
	default:
		return codes.PermissionDenied
	}
}

// EnumName returns the signer.proto Reason value name for a reason code
// ("profile-not-allowed" → "REASON_PROFILE_NOT_ALLOWED").
func EnumName(r policy.Reason) string {
	return "REASON_" + strings.ToUpper(strings.ReplaceAll(string(r), "-", "_"))
}

// status converts a refusal into a gRPC status with an ErrorInfo detail.
func (r *refusal) status() error {
	st := status.New(r.code, r.detail)
	enum := EnumName(r.reason)
	if _, ok := signerv1.Reason_value[enum]; !ok {
		return st.Err()
	}
	info := &errdetails.ErrorInfo{Reason: strings.TrimPrefix(enum, "REASON_"), Domain: ErrorDomain, Metadata: map[string]string{"code": string(r.reason)}}
	if d, err := st.WithDetails(info); err == nil {
		return d.Err()
	}
	return st.Err()
}

// publicError converts any handler error into what the caller may see: a refusal keeps its code
// and reason; anything else becomes INTERNAL without its cause.
func publicError(err error) error {
	if err == nil {
		return nil
	}
	var r *refusal
	if errors.As(err, &r) {
		return r.status()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, "internal error")
}
