package server

import (
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cotalgo/cotal/pkg/profiles"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// The lifetime rule, the same for every RPC that takes a lifetime (Mint, Remint,
// SignCalloutResponse, SignBearer, SignServiceCredential):
//
//   - a negative lifetime, or one above zero but under MinTTL, is refused with TTL_INVALID
//     (INVALID_ARGUMENT): JWT times are whole seconds, so it would be granted as exp = iat;
//   - zero or absent asks for the default (the profile's; SignBearer and SignServiceCredential,
//     whose protos make the lifetime required, have none and refuse it);
//   - above the profile maximum or the caller's policy cap it is capped, and the credential says
//     ttl_capped.
//
// CheckTTL is the first half, applied to what a caller asks before the policy sees it; GrantTTL
// the second, applied once the cap is known. GrantTTL applies CheckTTL again, so no path can
// skip it.

// MinTTL is the shortest lifetime signerd grants.
const MinTTL = time.Second

func ttlInvalid(detail string) *refusal {
	return refuse(codes.InvalidArgument, policy.ReasonTTLInvalid, detail)
}

// RequestedTTL converts an optional proto duration under the lifetime rule: absent is zero (the
// default); malformed, negative or under MinTTL is refused with TTL_INVALID.
func RequestedTTL(d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, ttlInvalid("ttl is malformed")
	}
	v := d.AsDuration()
	if err := CheckTTL(v); err != nil {
		return 0, err
	}
	return v, nil
}

// CheckTTL refuses a requested lifetime that is negative, or above zero and under MinTTL, with
// TTL_INVALID. Zero passes: it asks for the default.
func CheckTTL(requested time.Duration) error {
	switch {
	case requested < 0:
		return ttlInvalid(fmt.Sprintf("ttl %v is negative", requested))
	case requested > 0 && requested < MinTTL:
		return ttlInvalid(fmt.Sprintf("ttl %v is shorter than %v", requested, MinTTL))
	}
	return nil
}

// GrantTTL returns min(requested or default, profile max, policy cap) and whether it capped the
// request. It is the one rule for every credential signerd signs; `signerd policy explain`
// shows its result. It refuses, with TTL_INVALID, what CheckTTL refuses and any lifetime asked
// for a profile whose credentials carry no expiry (the sentinel), which it grants as zero.
func GrantTTL(requested time.Duration, lt profiles.Lifetime, policyCap time.Duration) (time.Duration, bool, error) {
	if err := CheckTTL(requested); err != nil {
		return 0, false, err
	}
	if lt.NoExpiry {
		if requested != 0 {
			return 0, false, ttlInvalid("the profile's credentials carry no expiry; ask for no ttl")
		}
		return 0, false, nil
	}
	ttl := requested
	if ttl == 0 {
		ttl = lt.Default
	}
	capped := false
	if lt.Max > 0 && ttl > lt.Max {
		ttl, capped = lt.Max, true
	}
	if policyCap > 0 && ttl > policyCap {
		ttl, capped = policyCap, true
	}
	if ttl < MinTTL {
		// A lifetime class without a default and no request: nothing to grant.
		return 0, false, ttlInvalid("no ttl asked and the profile has no default")
	}
	// Only a reduction below what the caller asked for counts as capping.
	return ttl, capped && requested != 0 && ttl < requested, nil
}
