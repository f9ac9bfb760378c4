package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"github.com/cotalgo/cotal/authd/internal/exchange"
	"github.com/cotalgo/cotal/authd/internal/idp"
)

// startPublic binds and serves the public face (exchange.NewPublic) when public_listen is set:
// the exchange of cfg without the cap or a loopback door, published by the operator's TLS proxy
// at public_url. svc serves serviceaccess.Path on it (nil: 404), msa the manager-service
// authority (exchange.ManagerAuthorityPath).
func (s *Service) startPublic(cfg exchange.Config, svc, msa http.Handler) error {
	c := s.cfg
	if c.PublicListen == "" {
		return nil
	}
	stateDir := c.StateDir
	p, err := exchange.NewPublic(exchange.PublicConfig{
		Exchange: cfg, URL: c.PublicURL, Server: c.PublicServer, TrustForwardedFor: c.PublicTrustForwardedFor, ServiceEndpoints: svc, ManagerAuthority: msa,
		Pin: func() (idp.Pin, error) { return idp.Load(stateDir) },
	})
	if err != nil {
		return &StartError{Code: CodeConfig, Reason: "public face refused", Err: err}
	}
	if s.pubLn, err = net.Listen("tcp", c.PublicListen); err != nil {
		return &StartError{Code: CodeListen, Reason: "public listener", Err: err}
	}
	s.publicURL = p.URL()
	s.pubHTTP = exchange.NewPublicServer(p)
	s.pubHTTP.ErrorLog = slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
	s.log.Info("authd public face listening", "listen", s.pubLn.Addr().String(), "public_url", s.publicURL,
		"server", c.PublicServer, "trust_forwarded_for", c.PublicTrustForwardedFor)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.pubHTTP.Serve(s.pubLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.stop(fmt.Errorf("authd: public listener: %w", err))
		}
	}()
	return nil
}

// closePublic shuts the public face down (requests in flight finish, bounded by ctx).
func (s *Service) closePublic(ctx context.Context) {
	if s.pubHTTP != nil {
		if err := s.pubHTTP.Shutdown(ctx); err != nil {
			_ = s.pubHTTP.Close()
		}
	} else if s.pubLn != nil {
		_ = s.pubLn.Close()
	}
}
