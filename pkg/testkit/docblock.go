package testkit

import (
	"os"
	"strings"
	"testing"
)

// DocBlock returns the one fenced code block of language lang (```yaml, say) in the Markdown file
// at path, failing t unless there is exactly one: the tests that load a page's configuration
// example with the daemon's own strict loader read it this way, so the page cannot drift from
// what the loader accepts.
func DocBlock(t testing.TB, path, lang string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks, cur []string
	in := false
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case !in && strings.TrimSpace(l) == "```"+lang:
			in, cur = true, nil
		case in && strings.TrimSpace(l) == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, l)
		}
	}
	if len(blocks) != 1 {
		t.Fatalf("%s: %d %s blocks, want 1", path, len(blocks), lang)
	}
	return blocks[0]
}
