package ctl

// SetAfterCommit makes durableJoin call f after it committed its pending row, before the
// catch-up: the seam a test uses to interleave a real concurrent request. Tests only; call it
// before Start.
func SetAfterCommit(r *Responders, f func()) { r.afterCommit = f }

// SetListFault makes lifecycleMemberships ask f before it reads the members bucket; an error
// stands for a bucket that cannot be read. Tests only; call it before Start.
func SetListFault(r *Responders, f func() error) { r.listFault = f }
