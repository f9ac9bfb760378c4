package signerclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// refusal builds a status error as signerd does.
func refusal(t testing.TB, code codes.Code, domain, reason, msg string) error {
	t.Helper()
	st := status.New(code, msg)
	d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain})
	if err != nil {
		t.Fatal(err)
	}
	return d.Err()
}

const sampleJWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJYIn0.c2lnbmF0dXJl"

func TestAsError(t *testing.T) {
	plain := errors.New("boom")
	tests := []struct {
		name       string
		in         error
		wantCode   codes.Code
		wantReason signerv1.Reason
		wantIs     error
	}{
		{name: "ok/denied-with-reason", in: refusal(t, codes.PermissionDenied, ErrorDomain, "PROFILE_NOT_ALLOWED", "no"),
			wantCode: codes.PermissionDenied, wantReason: signerv1.Reason_REASON_PROFILE_NOT_ALLOWED, wantIs: ErrDenied},
		{name: "ok/rate-limited", in: refusal(t, codes.ResourceExhausted, ErrorDomain, "RATE_LIMITED", "slow down"),
			wantCode: codes.ResourceExhausted, wantReason: signerv1.Reason_REASON_RATE_LIMITED, wantIs: ErrRateLimited},
		{name: "ok/wrapped-status", in: fmt.Errorf("ctx: %w", refusal(t, codes.InvalidArgument, ErrorDomain, "TTL_INVALID", "ttl")),
			wantCode: codes.InvalidArgument, wantReason: signerv1.Reason_REASON_TTL_INVALID, wantIs: ErrInvalid},
		{name: "ok/unauthenticated-no-detail", in: status.Error(codes.Unauthenticated, "who"), wantCode: codes.Unauthenticated, wantIs: ErrUnauthenticated},
		{name: "ok/not-found", in: refusal(t, codes.NotFound, ErrorDomain, "UNKNOWN_SPACE", "x"),
			wantCode: codes.NotFound, wantReason: signerv1.Reason_REASON_UNKNOWN_SPACE, wantIs: ErrNotFound},
		{name: "ok/conflict", in: status.Error(codes.AlreadyExists, "x"), wantCode: codes.AlreadyExists, wantIs: ErrConflict},
		{name: "ok/deadline", in: context.DeadlineExceeded, wantCode: codes.DeadlineExceeded, wantIs: ErrDeadline},
		{name: "ok/transport", in: status.Error(codes.Unavailable, "connection refused"), wantCode: codes.Unavailable, wantIs: ErrUnavailable},
		{name: "fail/foreign-domain-reason-ignored", in: refusal(t, codes.PermissionDenied, "evil.example", "BAD_PROOF", "x"),
			wantCode: codes.PermissionDenied, wantIs: ErrDenied},
		{name: "fail/unknown-reason-ignored", in: refusal(t, codes.PermissionDenied, ErrorDomain, "NO_SUCH_REASON", "x"),
			wantCode: codes.PermissionDenied, wantIs: ErrDenied},
		{name: "fail/prefixed-reason-ignored", in: refusal(t, codes.PermissionDenied, ErrorDomain, "REASON_BAD_PROOF", "x"),
			wantCode: codes.PermissionDenied, wantIs: ErrDenied},
		{name: "fail/unspecified-reason-ignored", in: refusal(t, codes.PermissionDenied, ErrorDomain, "UNSPECIFIED", "x"),
			wantCode: codes.PermissionDenied, wantIs: ErrDenied},
		{name: "ok/plain-error-unknown", in: plain, wantCode: codes.Unknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := AsError(tt.in)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("AsError = %T", err)
			}
			if e.Code != tt.wantCode || e.Reason != tt.wantReason {
				t.Fatalf("AsError = %v %v, want %v %v", e.Code, e.Reason, tt.wantCode, tt.wantReason)
			}
			if ReasonOf(err) != tt.wantReason || ReasonOf(tt.in) != tt.wantReason {
				t.Fatalf("ReasonOf = %v / %v, want %v", ReasonOf(err), ReasonOf(tt.in), tt.wantReason)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Fatalf("errors.Is(%v, %v) = false", err, tt.wantIs)
			}
			if errors.Is(err, ErrDenied) != (tt.wantCode == codes.PermissionDenied) {
				t.Fatalf("errors.Is(%v, ErrDenied) disagrees with code %v", err, tt.wantCode)
			}
			if !errors.Is(err, tt.in) {
				t.Fatalf("cause %v not wrapped in %v", tt.in, err)
			}
			if AsError(err) != err {
				t.Fatal("AsError of an *Error is not the same *Error")
			}
		})
	}
	if AsError(nil) != nil || ReasonOf(nil) != signerv1.Reason_REASON_UNSPECIFIED {
		t.Fatal("nil is not passed through")
	}
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		name string
		in   error
		want string
	}{
		{name: "ok/reason-without-prefix", in: refusal(t, codes.PermissionDenied, ErrorDomain, "BAD_PROOF", "proof does not verify"),
			want: "signerclient: PermissionDenied BAD_PROOF: proof does not verify"},
		{name: "ok/jwt-redacted", in: status.Error(codes.Internal, "echo "+sampleJWT+" end"),
			want: "signerclient: Internal: echo [REDACTED] end"},
		{name: "ok/long-detail-bounded", in: status.Error(codes.Internal, strings.Repeat("x", 2000)),
			want: "signerclient: Internal: " + strings.Repeat("x", maxDetail) + "..."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AsError(tt.in).Error(); got != tt.want {
				t.Fatalf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRemintProofMessage(t *testing.T) {
	got := string(RemintProofMessage("alpha", "JTI123", 1700000000))
	if want := "cotal-remint/v1\x00alpha\x00JTI123\x001700000000"; got != want {
		t.Fatalf("RemintProofMessage = %q, want %q", got, want)
	}
}

// FuzzAsError feeds AsError the parts of a server-sent status (code, detail domain and reason,
// message): it must not panic, must report only a known Reason, and its text must never hold a
// JWT-shaped string.
func FuzzAsError(f *testing.F) {
	f.Add(uint32(codes.PermissionDenied), ErrorDomain, "BAD_PROOF", "proof")
	f.Add(uint32(codes.Unavailable), "", "", "connection refused")
	f.Add(uint32(99), ErrorDomain, "REASON_BAD_PROOF", sampleJWT)
	f.Add(uint32(codes.Internal), ErrorDomain, "\x00", "eyJ.eyJ.")
	f.Add(uint32(codes.PermissionDenied), ErrorDomain, "BAD\xffPROOF", "ey\xffJa.b.c")
	f.Fuzz(func(t *testing.T, code uint32, domain, reason, msg string) {
		if codes.Code(code) == codes.OK {
			// A status with code OK is not an error and carries no details.
			return
		}
		st, derr := status.New(codes.Code(code), msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: domain})
		if derr != nil {
			// Not representable on the wire (for example invalid UTF-8 in a proto string):
			// gRPC would have refused to decode it, so AsError never sees it.
			return
		}
		err := AsError(st.Err())
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("AsError = %T", err)
		}
		if _, ok := signerv1.Reason_name[int32(e.Reason)]; !ok {
			t.Fatalf("unknown reason %d", e.Reason)
		}
		if domain != ErrorDomain && e.Reason != signerv1.Reason_REASON_UNSPECIFIED {
			t.Fatalf("reason %v taken from domain %q", e.Reason, domain)
		}
		if jwtShape.MatchString(err.Error()) {
			t.Fatalf("error text holds a JWT-shaped string: %q", err.Error())
		}
		if len(e.Detail) > maxDetail+3 {
			t.Fatalf("detail is %d bytes", len(e.Detail))
		}
	})
}
