package ctl

// SetAfterCommit makes durableJoin call f after it committed its pending row, before the
// catch-up: the seam a test uses to interleave a real concurrent request. Tests only; call it
// before Start.
func SetAfterCommit(r *Responders, f func()) { r.afterCommit = f }

// SetListFault makes lifecycleMemberships ask f before it reads the members bucket; an error
// stands for a bucket that cannot be read. Tests only; call it before Start.
func SetListFault(r *Responders, f func() error) { r.listFault = f }

// SetBeforeCommit makes durableJoin call f just before it commits a new pending row (after its
// first ACL read). Tests only; call it before Start.
func SetBeforeCommit(r *Responders, f func()) { r.beforeCommit = f }

// StopIndex stops the members index's watch, as a watch the broker ended would: the index
// keeps what it held and can no longer catch up. Tests only.
func StopIndex(r *Responders) {
	r.mu.Lock()
	w := r.idxWatch
	r.mu.Unlock()
	_ = w.Stop()
}
