package authclient

// Waiters is how many callers joined the pull in flight (0 when none is), so a test can release
// a held answer once every concurrent caller shares the one request.
func (s *RenewalSource) Waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flight == nil {
		return 0
	}
	return s.flight.waiters
}
