//go:build race

package callout

// raceEnabled: the race detector slows signerd, the broker and the responder several times over,
// so a test that counts what a fixed request rate costs measures the detector instead.
const raceEnabled = true
