package authority

import "github.com/cotalgo/cotal/pkg/serviceaccess"

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
