package testkit

import (
	"fmt"
	"strings"
)

// Runs writes a sequence of events as runs, for an ordering test's failure message and log:
// ["a", "a", "b", "c", "c", "c"] is "a ×2, b, c ×3". A test asserting that no effect follows a
// fence compares or prints this rather than thousands of lines.
func Runs(events []string) string {
	var out []string
	for i := 0; i < len(events); {
		j := i
		for j < len(events) && events[j] == events[i] {
			j++
		}
		if j-i > 1 {
			out = append(out, fmt.Sprintf("%s ×%d", events[i], j-i))
		} else {
			out = append(out, events[i])
		}
		i = j
	}
	return strings.Join(out, ", ")
}
