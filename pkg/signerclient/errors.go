package signerclient

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of signerd's refusals. A detail from any other
// domain is not read as a signerd reason.
const ErrorDomain = "signer.cotal.dev"

// maxDetail bounds the detail an Error keeps, so a hostile or broken server cannot flood logs.
const maxDetail = 512

// Error is a failed call to signerd: the gRPC code, signerd's stable reason (REASON_UNSPECIFIED
// when the refusal carried none, for example a transport failure) and a short detail. Its text
// never contains a JWT: details are scrubbed of anything shaped like one. Transport and context
// failures keep their cause, reachable with errors.Unwrap / errors.As.
//
// errors.Is matches an *Error against the sentinels (ErrDenied, ErrUnavailable, ...) by code.
type Error struct {
	Code   codes.Code
	Reason signerv1.Reason
	Detail string

	cause error
}

// Error renders "signerclient: <code> [<reason>]: <detail>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("signerclient: ")
	b.WriteString(e.Code.String())
	if e.Reason != signerv1.Reason_REASON_UNSPECIFIED {
		b.WriteString(" ")
		b.WriteString(strings.TrimPrefix(e.Reason.String(), "REASON_"))
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap returns the underlying error (the gRPC status error or a context error), if any.
func (e *Error) Unwrap() error { return e.cause }

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	s, ok := target.(sentinel)
	return ok && s.code == e.Code
}

// sentinel is an immutable class of errors matched by gRPC code.
type sentinel struct {
	code codes.Code
	text string
}

func (s sentinel) Error() string { return "signerclient: " + s.text }

// Sentinels for errors.Is. Each matches every *Error with its code.
var (
	// ErrDenied: signerd's policy refused the call (PERMISSION_DENIED); see Error.Reason.
	ErrDenied error = sentinel{codes.PermissionDenied, "permission denied"}
	// ErrRateLimited: the caller exceeded its rate (RESOURCE_EXHAUSTED); retry later.
	ErrRateLimited error = sentinel{codes.ResourceExhausted, "rate limited"}
	// ErrUnauthenticated: signerd found no usable identity in the client certificate.
	ErrUnauthenticated error = sentinel{codes.Unauthenticated, "unauthenticated"}
	// ErrUnavailable: signerd could not be reached or the handshake failed, or it could not
	// make its audit line durable; retry later.
	ErrUnavailable error = sentinel{codes.Unavailable, "unavailable"}
	// ErrInvalid: the request is malformed (INVALID_ARGUMENT), by signerd's or this package's
	// own check.
	ErrInvalid error = sentinel{codes.InvalidArgument, "invalid argument"}
	// ErrNotFound: signerd holds no keys for the space.
	ErrNotFound error = sentinel{codes.NotFound, "not found"}
	// ErrConflict: a Mint request_id was reused for a different request (ALREADY_EXISTS).
	ErrConflict error = sentinel{codes.AlreadyExists, "request id conflict"}
	// ErrDeadline: the call's deadline passed before signerd answered.
	ErrDeadline error = sentinel{codes.DeadlineExceeded, "deadline exceeded"}
)

// AsError converts any error from a signerd call into an *Error: a gRPC status keeps its code
// and, if it carries a signerd ErrorInfo detail, its reason; a context error becomes
// DEADLINE_EXCEEDED or CANCELED; anything else becomes UNKNOWN. The original error stays
// wrapped. nil stays nil, and an *Error is returned as it is.
func AsError(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			st = status.FromContextError(err)
		}
	}
	return &Error{Code: st.Code(), Reason: reasonOfStatus(st), Detail: scrub(st.Message()), cause: err}
}

// ReasonOf returns signerd's reason for a refusal, from an *Error or a raw gRPC status error;
// REASON_UNSPECIFIED for anything else.
func ReasonOf(err error) signerv1.Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	if st, ok := status.FromError(err); ok {
		return reasonOfStatus(st)
	}
	return signerv1.Reason_REASON_UNSPECIFIED
}

// reasonOfStatus reads the first ErrorInfo of signerd's domain whose reason names a Reason
// value. Unknown names and other domains give REASON_UNSPECIFIED rather than a guess.
func reasonOfStatus(st *status.Status) signerv1.Reason {
	if st == nil {
		return signerv1.Reason_REASON_UNSPECIFIED
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != ErrorDomain {
			continue
		}
		name := info.GetReason()
		if name == "" || strings.HasPrefix(name, "REASON_") {
			continue
		}
		if v, ok := signerv1.Reason_value["REASON_"+name]; ok && v != 0 {
			return signerv1.Reason(v)
		}
	}
	return signerv1.Reason_REASON_UNSPECIFIED
}

// jwtShape matches a compact JWS (three base64url segments, the first a JSON object), the shape
// of every NATS and bearer JWT.
var jwtShape = regexp.MustCompile(`eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*`)

// scrub removes anything shaped like a JWT from a detail and bounds its length. signerd never
// echoes a JWT; this keeps a proxy or a future bug from putting one into a log.
func scrub(s string) string {
	// Invalid bytes go first, so dropping them cannot join the pieces of a JWT after redaction.
	s = strings.ToValidUTF8(s, "?")
	s = jwtShape.ReplaceAllString(s, "[REDACTED]")
	if len(s) > maxDetail {
		cut := maxDetail
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}
