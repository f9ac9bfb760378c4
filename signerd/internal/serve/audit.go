package serve

import (
	"context"
	"fmt"
)

// rotateAudit starts a new audit file on SIGHUP (the signal that already reloads the policy, so
// one signal from logrotate or an operator does both). A file with no decision since the last
// rotation is left alone; the audit package logs each rotation. A failed rotation breaks the log, and watchAudit stops the signer.
func (s *Signer) rotateAudit(ctx context.Context) {
	if err := s.audit.Rotate(ctx); err != nil {
		s.log.Error("audit log not rotated", "path", s.cfg.Audit.Path, "err", err)
	}
}

// watchAudit ends Run when the audit log breaks (a write or fsync failed, e.g. the disk is full):
// a signer that cannot audit refuses every call, so it must not look healthy either. Health
// turns NOT_SERVING on every service name at once, before the graceful stop, and the error
// reaches Run's caller so the process exits non-zero and its supervisor restarts it; the restart
// re-verifies the file and cuts a torn final line.
func (s *Signer) watchAudit(ctx context.Context, errc chan<- error) {
	select {
	case <-ctx.Done():
	case <-s.audit.Failed():
		err := s.audit.Err()
		s.health.Shutdown() // every registered service name, "" included
		s.log.Error("audit log broken: refusing every call and stopping", "path", s.cfg.Audit.Path, "err", err)
		errc <- fmt.Errorf("audit log broken, stopped serving: %w", err)
	}
}

// auditFailure is runErr, or the audit log's failure when Run stopped for another reason (a
// signal) after the log broke: the exit status must say that decisions went unaudited.
func (s *Signer) auditFailure(runErr error) error {
	if runErr != nil {
		return runErr
	}
	if err := s.audit.Err(); err != nil {
		return fmt.Errorf("audit log broken: %w", err)
	}
	return nil
}
