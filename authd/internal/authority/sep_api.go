package authority

import (
	"context"
	"errors"

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
// endpoint gate, and returns its answer (any kind, denials included; see sep_service.go). A store
// that does not answer, a corrupt row or a plane claim not held is an unavailable answer (replay
// the same request); the error is only for a nil request, which the route never passes.
func (a *Authority) ServiceRequest(ctx context.Context, req *serviceaccess.Request, caller ServiceCaller) (*serviceaccess.Answer, error) {
	if req == nil {
		return nil, refuse(CodeBadRequest, "no request")
	}
	if req.Account != a.cfg.Account || req.Space != a.cfg.Space {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "another-space", "the request names another account or space"), nil
	}
	if !sepProofAllowed(req, caller) {
		return sepDenied(req, serviceaccess.CodePermissionDenied, "proof", "this proof does not authorize this request"), nil
	}
	var ans *serviceaccess.Answer
	var err error
	switch req.Kind {
	case serviceaccess.KindNameBind:
		ans, err = a.sepNameBind(ctx, req)
	case serviceaccess.KindRegister:
		ans, err = a.sepRegister(ctx, req, caller.Owner)
	case serviceaccess.KindDecide:
		ans, err = a.sepDecide(ctx, req, caller.Owner)
	case serviceaccess.KindActivate, serviceaccess.KindRenew:
		ans, err = a.sepCredential(ctx, req, caller)
	case serviceaccess.KindReady:
		ans, err = a.sepReady(ctx, req, caller)
	case serviceaccess.KindStatus:
		ans, err = a.sepStatus(ctx, req, caller)
	default:
		return sepDenied(req, serviceaccess.CodeBadRequest, "kind", "unknown request kind"), nil
	}
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == CodeBadRequest {
			ans = sepDenied(req, serviceaccess.CodeBadRequest, "request", e.Msg)
		} else {
			a.log.Warn("service endpoint request unavailable", "kind", string(req.Kind), "endpoint", req.Endpoint,
				"instance", req.Instance, "requestId", req.RequestID, "err", err)
			ans = &serviceaccess.Answer{Kind: serviceaccess.AnswerUnavailable, RequestID: req.RequestID,
				Message: "the authority could not complete the request; replay the same request"}
		}
	}
	a.log.Info("service endpoint request", "kind", string(req.Kind), "endpoint", req.Endpoint, "instance", req.Instance,
		"requestId", req.RequestID, "proof", string(caller.Proof), "answer", string(ans.Kind), "code", ans.Code, "reason", ans.Reason)
	return ans, nil
}

// CheckServe re-reads what a service access bearer stands on (the registration it names, the
// endpoint gate, the root, the approval, the name binding) for the callout's service arm: nil
// admits, an *Error refuses (permission-denied for a bearer the rows no longer back, unavailable
// when they cannot be read).
func (a *Authority) CheckServe(ctx context.Context, c *serviceaccess.AccessClaims) error {
	d, err := a.sepServeCheck(ctx, c)
	if err != nil {
		return &Error{Code: CodeUnavailable, Msg: "the service registration could not be read", Err: err}
	}
	if d[0] != "" {
		return refuse(CodePermissionDenied, "service access refused (%s): %s", d[1], d[2])
	}
	return nil
}
