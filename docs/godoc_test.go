package docs_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestPackageDocs: the doc comment of every public package (not a main package, not under an
// internal/ directory) starts with "Package <name> ", the one sentence `go doc` shows first
// saying what the package is for. One `go list` over the module.
func TestPackageDocs(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not on PATH")
	}
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}}|{{.Name}}|{{.Doc}}", "./...")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=auto")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	for _, p := range checkPackageDocs(string(out)) {
		t.Error(p)
	}
}

// checkPackageDocs returns a problem for every line of `go list -f
// '{{.ImportPath}}|{{.Name}}|{{.Doc}}'` output naming a public non-main package whose doc does not
// start with "Package <name> ".
func checkPackageDocs(list string) []string {
	var problems []string
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		path, rest, ok := strings.Cut(line, "|")
		name, doc, ok2 := strings.Cut(rest, "|")
		if !ok || !ok2 {
			problems = append(problems, fmt.Sprintf("go list: unexpected line %q", line))
			continue
		}
		if name == "main" || strings.HasSuffix(name, "_test") || isInternal(path) {
			continue
		}
		switch {
		case doc == "":
			problems = append(problems, fmt.Sprintf("%s: no package doc comment; want one starting %q", path, "Package "+name+" "))
		case !strings.HasPrefix(doc, "Package "+name+" "):
			problems = append(problems, fmt.Sprintf("%s: package doc starts %q; want %q", path, doc, "Package "+name+" ..."))
		}
	}
	return problems
}

// isInternal reports whether import path has an internal element (importable only from within
// its parent tree).
func isInternal(path string) bool {
	for _, e := range strings.Split(path, "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}

func TestCheckPackageDocs(t *testing.T) {
	tests := []struct {
		name, list string
		want       []string
	}{
		{name: "ok/documented", list: "m/pkg/a|a|Package a does one thing.\n"},
		{name: "ok/main-and-internal-skipped", list: "m/cmd|main|\nm/x/internal/y|y|\nm/internal|internal|\n"},
		{name: "fail/empty", list: "m/pkg/a|a|\n", want: []string{"m/pkg/a: no package doc comment"}},
		{name: "fail/wrong-start", list: "m/pkg/a|a|This package does a thing.\n", want: []string{`m/pkg/a: package doc starts "This package`}},
		{name: "fail/other-name", list: "m/pkg/a|a|Package ab does a thing.\n", want: []string{`m/pkg/a: package doc starts "Package ab`}},
		{name: "fail/every-failure", list: "m/a|a|\nm/b|b|x\n", want: []string{"m/a:", "m/b:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkPackageDocs(tt.list)
			if len(got) != len(tt.want) {
				t.Fatalf("got %q, want %d problems %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("problem %d: %q, want prefix %q", i, got[i], w)
				}
			}
		})
	}
}
