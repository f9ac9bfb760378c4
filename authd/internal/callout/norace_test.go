//go:build !race

package callout

// raceEnabled: see race_test.go.
const raceEnabled = false
