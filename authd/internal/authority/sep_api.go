package authority

import (
	"context"

	"github.com/cotalgo/cotal/pkg/serviceaccess"
)

// ServiceCaller is who a /service-endpoint-authority request was authenticated as: the route
// verified the proof and checked the kind x proof matrix before calling ServiceRequest.
type ServiceCaller struct {
	Proof serviceaccess.ProofKind
	// Owner is the derived owner of an idp proof (with a current interactive cli or web row),
	// the sub of a renewal or access proof, and "" for the operator.
	Owner string
	// Renewal and Access are the verified claims of a renewal or access proof (nil otherwise).
	Renewal *serviceaccess.RenewalClaims
	Access  *serviceaccess.AccessClaims
}

// ServiceRequest runs one authorized service endpoint request against the sep. rows and the
// endpoint gate, and returns its answer (any kind, denials included). An error is only what
// the route answers 503 without an answer of its own.
func (a *Authority) ServiceRequest(ctx context.Context, req *serviceaccess.Request, caller ServiceCaller) (*serviceaccess.Answer, error) {
	return nil, refuse(CodeUnavailable, "service endpoints are not implemented yet")
}

// CheckServe re-reads what a service access bearer stands on (the registration it names, the
// endpoint gate, the root, the approval, the name binding) for the callout's service arm: nil
// admits, an *Error refuses.
func (a *Authority) CheckServe(ctx context.Context, c *serviceaccess.AccessClaims) error {
	return refuse(CodeUnavailable, "service endpoints are not implemented yet")
}
