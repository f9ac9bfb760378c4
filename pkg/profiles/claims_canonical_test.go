package profiles

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestClaimsRefuseNonCanonicalKeys: Claims is the last place a subject reaches a JWT, so it
// refuses a key that nkeys' own validators accept with CR or LF inside (finding 1 of issue 7).
func TestClaimsRefuseNonCanonicalKeys(t *testing.T) {
	k := mxKeys(t)
	spec, err := Build("alpha", Sentinel, Params{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, user, account, field string
	}{
		{"fail/user-crlf-inside", k.userPub[:20] + "\r\n" + k.userPub[20:], k.acPub, "userPub"},
		{"fail/user-lf-leading", "\n" + k.userPub, k.acPub, "userPub"},
		{"fail/account-lf-trailing", k.userPub, k.acPub + "\n", "issuerAccount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uc, err := spec.Claims(tc.user, tc.account, time.Now(), 0)
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tc.field || !strings.Contains(pe.Reason, "canonical") {
				t.Fatalf("Claims = %v, %v; want a *ParamError on %s", uc, err, tc.field)
			}
		})
	}
	if _, err := spec.Claims(k.userPub, k.acPub, time.Now(), 0); err != nil {
		t.Fatalf("canonical keys refused: %v", err)
	}
}
