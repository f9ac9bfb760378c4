package plane3test

import "sync/atomic"

// Fence is a scripted lease fence for the loops' tests: up until Fall reports true (nil Fall:
// down from the start), then down until Lifted is set. Downs counts the times it answered down.
type Fence struct {
	Fall   func() bool
	fallen atomic.Bool
	Lifted atomic.Bool
	Downs  atomic.Int64
}

// MayAct is the fence as the loops read it (fanout.Config.MayAct, reader.Config.MayAct).
func (f *Fence) MayAct() bool {
	if f.Lifted.Load() {
		return true
	}
	if !f.fallen.Load() && f.Fall != nil && !f.Fall() {
		return true
	}
	f.fallen.Store(true)
	f.Downs.Add(1)
	return false
}
