package profiles

import (
	"fmt"
	"slices"
	"testing"
)

// TestDedupe: both of dedupe's paths (scan for short lists, set for long ones) keep the first
// occurrence in order, and the result is clipped, so appending to it leaves the input's spare
// capacity (a neighbouring builder list) alone.
func TestDedupe(t *testing.T) {
	for _, n := range []int{1, dedupeScan, dedupeScan + 1, 3 * dedupeScan} {
		t.Run(fmt.Sprintf("ok/%d", n), func(t *testing.T) {
			backing := make([]string, 2*n+1)
			in := backing[: 0 : 2*n]
			var want []string
			for i := range n {
				v := fmt.Sprintf("s%d", i%(n/2+1))
				in = append(in, v, v)
				if !slices.Contains(want, v) {
					want = append(want, v)
				}
			}
			backing[2*n] = "neighbour"
			got := dedupe(in)
			if !slices.Equal(got, want) {
				t.Fatalf("dedupe = %v, want %v", got, want)
			}
			if cap(got) != len(got) {
				t.Fatalf("result not clipped: len %d cap %d", len(got), cap(got))
			}
			_ = append(got, "x")
			if backing[len(want)] == "x" || backing[2*n] != "neighbour" {
				t.Fatalf("append to the result wrote into the input's backing array")
			}
		})
	}
	if got := dedupe(nil); got != nil {
		t.Fatalf("dedupe(nil) = %v, want nil", got)
	}
}
