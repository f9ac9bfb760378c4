package server

import (
	"context"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/space"
	"github.com/cotalgo/cotal/signerd/internal/policy"
)

// GetSpace returns a space's public facts to a caller allowed to see them.
func (s *Service) GetSpace(ctx context.Context, req *signerv1.GetSpaceRequest) (*signerv1.GetSpaceResponse, error) {
	c, err := s.begin(ctx, policy.RPCGetSpace)
	var resp *signerv1.GetSpaceResponse
	if err == nil {
		resp, err = s.getSpace(c, req)
	}
	if err := s.finish(ctx, c, err); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *Service) getSpace(c *call, req *signerv1.GetSpaceRequest) (*signerv1.GetSpaceResponse, error) {
	c.space = req.GetSpace()
	if err := space.ValidateName(c.space); err != nil {
		return nil, invalid(err.Error())
	}
	if _, err := s.decide(policy.Request{Caller: c.caller, RPC: policy.RPCGetSpace, Space: c.space}); err != nil {
		return nil, err
	}
	sp, err := s.space(c.space)
	if err != nil {
		return nil, err
	}
	t, p := sp.Trust, sp.Public
	return &signerv1.GetSpaceResponse{
		Space: sp.Name, Token: t.Token(), OperatorPublicKey: p.OperatorPublicKey,
		AccountPublicKey: t.DataAccountPublicKey(), AccountJwt: t.DataAccountJWT(), SigningPublicKeys: t.DataSigningKeys(),
		CalloutAccountPublicKey: t.AuthAccountPublicKey(), CalloutAccountJwt: t.AuthAccountJWT(),
		CalloutSigningPublicKey: sp.AuthSigning.Public(), XkeyPublicKey: t.XKey(), SentinelJwt: p.SentinelJWT,
	}, nil
}
