package docs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Examples that run (issue 21 item 3): every fenced code block in README.md, SECURITY.md and
// docs/*.md is either checked by a test, listed in testedBlocks, or marked by the paragraph right
// before it, which starts with one of
//
//	*Sketch: ...*          commands that need a live system (root, systemd, a broker); not run
//	*Synopsis: ...*        a command's usage; `<daemon> --help` prints the current one
//	*Example output: ...*  what a command prints
//
// A mermaid block is a picture, not an example, and needs neither. CONTRIBUTING.md and
// CHANGELOG.md are not covered.

// markers are the prefixes of the line that marks a block no test runs.
var markers = []string{"*Sketch:", "*Synopsis:", "*Example output:"}

// testedBlock names a code block by its file and first line, and the test that checks it.
type testedBlock struct {
	file, first, test string
}

// testedBlocks lists every code block a test checks. A block whose first line changes, or that
// moves to another file, must be listed again here, after checking that its test still reads it.
var testedBlocks = []testedBlock{
	{"README.md", "make run    #", "deploy/local/cotal-dev TestDevStack runs the stack `make run` builds and starts; .ci/run runs `make check`, which runs `make test`"},
	{"docs/architecture.md", "proto/cotal/signer/v1/", "docs TestArchitectureLayout"},
	{"docs/authd.md", "space: demo", "authd/internal/config TestDocExample"},
	{"docs/deliveryd.md", "space: demo", "deliveryd/internal/config TestDocExample"},
	{"docs/deliveryd.md", "rep, err := provision.Run(", "docs TestGoFragments (pkg/provision ExampleRun, compiled)"},
	{"docs/deliveryd.md", "p, err := provision.RunProvisionAgent(", "docs TestGoFragments (pkg/provision ExampleRunProvisionAgent, compiled)"},
	{"docs/signerd.md", "listen: 127.0.0.1:7443", "signerd/internal/serve TestDocExample"},
	{"docs/connecting.md", "// Command connect mints", "examples/connect TestReadmeConnectExample"},
	{"docs/connecting.md", "// Mint an agent credential from signerd", "sdk/ts test/signerd.test.ts ok/readme-example"},
	{"docs/service-endpoints.md", "p, err := authclient.NewProvider(", "docs TestGoFragments (pkg/serve ExampleServeEndpoint, compiled)"},
}

// exampleFiles lists, relative to root, the files whose code blocks TestCodeBlocksAccountedFor
// checks.
func exampleFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md", "SECURITY.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

func TestCodeBlocksAccountedFor(t *testing.T) {
	root := repoRoot(t)
	srcs := map[string]string{}
	for _, f := range exampleFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		srcs[f] = string(data)
	}
	for _, p := range checkCodeBlocks(srcs, testedBlocks) {
		t.Error(p)
	}
}

// checkCodeBlocks returns a problem for every code block of srcs (file name to content) that is
// neither marked nor listed in tested, and for every entry of tested that names no block.
func checkCodeBlocks(srcs map[string]string, tested []testedBlock) []string {
	var problems []string
	used := make([]bool, len(tested))
	names := make([]string, 0, len(srcs))
	for name := range srcs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		blocks := parseBlocks(srcs[name])
		for i, b := range blocks {
			if !b.code || b.lang == "mermaid" {
				continue
			}
			if i > 0 && !blocks[i-1].code && marked(blocks[i-1]) {
				continue
			}
			first := ""
			if len(b.lines) > 0 {
				first = strings.TrimSpace(b.lines[0])
			}
			found := false
			for j, tb := range tested {
				if tb.file == name && strings.HasPrefix(first, tb.first) {
					used[j], found = true, true
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s:%d: code block %q is neither run by a test (list it in testedBlocks) nor marked as a sketch, synopsis or example output by the paragraph before it", name, b.start-1, first))
			}
		}
	}
	for j, tb := range tested {
		if !used[j] {
			problems = append(problems, fmt.Sprintf("testedBlocks: %s has no code block starting %q (checked by %s)", tb.file, tb.first, tb.test))
		}
	}
	return problems
}

// marked reports whether a prose block is a marker: its first line starts with one.
func marked(prose block) bool {
	first := strings.TrimSpace(prose.lines[0])
	for _, m := range markers {
		if strings.HasPrefix(first, m) {
			return true
		}
	}
	return false
}

// codeBlocks returns the code blocks of the Markdown file at path whose language is lang.
func codeBlocks(t *testing.T, path, lang string) []block {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []block
	for _, b := range parseBlocks(string(data)) {
		if b.code && b.lang == lang {
			out = append(out, b)
		}
	}
	return out
}

// TestArchitectureLayout: every path docs/architecture.md's layout names exists, and every
// directory under pkg/ has a line of its own there.
func TestArchitectureLayout(t *testing.T) {
	root := repoRoot(t)
	blocks := codeBlocks(t, filepath.Join(root, "docs", "architecture.md"), "")
	if len(blocks) != 1 {
		t.Fatalf("docs/architecture.md: %d unlabeled code blocks, want 1 (the layout)", len(blocks))
	}
	listed := map[string]bool{}
	for i, l := range blocks[0].lines {
		if l == "" || l[0] == ' ' {
			continue // a continuation line
		}
		p := strings.TrimSuffix(strings.Fields(l)[0], "/")
		listed[p] = true
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("docs/architecture.md:%d: %s: %v", blocks[0].start+i, p, err)
		}
	}
	dirs, err := os.ReadDir(filepath.Join(root, "pkg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if d.IsDir() && !listed["pkg/"+d.Name()] {
			t.Errorf("docs/architecture.md: the layout has no line for pkg/%s", d.Name())
		}
	}
}

// goFragments maps a Markdown file to the Go file that holds, compiled, the lines of its ```go
// blocks.
var goFragments = map[string]string{
	"docs/deliveryd.md":         "pkg/provision/example_test.go",
	"docs/service-endpoints.md": "pkg/serve/example_test.go",
}

// TestGoFragments: each line of each ```go block of the files in goFragments appears, in order and
// with runs of white space counted as one space, in its Go file (lines may come between them
// there); that file's examples are compiled by `go vet` and `go test`.
func TestGoFragments(t *testing.T) {
	root := repoRoot(t)
	for doc, src := range goFragments {
		data, err := os.ReadFile(filepath.Join(root, src))
		if err != nil {
			t.Fatal(err)
		}
		var have []string
		for _, l := range strings.Split(string(data), "\n") {
			have = append(have, strings.TrimSpace(collapseSpace(l)))
		}
		blocks := codeBlocks(t, filepath.Join(root, doc), "go")
		if len(blocks) == 0 {
			t.Errorf("%s: no go blocks", doc)
		}
		for _, b := range blocks {
			for _, p := range inOrder(b, have) {
				t.Errorf("%s:%d: %q is not in %s (after the block's previous line)", doc, p.line, p.text, src)
			}
		}
	}
}

type missingLine struct {
	line int
	text string
}

// inOrder returns the lines of b that do not appear in have after the previous line's match.
func inOrder(b block, have []string) []missingLine {
	var missing []missingLine
	at := 0
	for i, l := range b.lines {
		want := strings.TrimSpace(collapseSpace(l))
		if want == "" {
			continue
		}
		j := slices.Index(have[at:], want)
		if j < 0 {
			missing = append(missing, missingLine{b.start + i, want})
			continue
		}
		at += j + 1
	}
	return missing
}

func TestCheckCodeBlocks(t *testing.T) {
	tested := []testedBlock{{"a.md", "go run", "T"}}
	tests := []struct {
		name string
		srcs map[string]string
		want []string
	}{
		{name: "ok/tested", srcs: map[string]string{"a.md": "Text.\n\n```sh\ngo run ./x\n```\n"}},
		{name: "ok/sketch", srcs: map[string]string{"a.md": "Text.\n\n```sh\ngo run ./x\n```\n\nSo:\n\n*Sketch: needs root.*\n\n```sh\nsudo x\n```\n"}},
		{name: "ok/synopsis-and-output", srcs: map[string]string{"a.md": "```sh\ngo run\n```\n\n*Synopsis: usage.*\n```\nx FILE\n```\n*Example output:*\n```\nok\n```\n"}},
		{name: "ok/mermaid", srcs: map[string]string{"a.md": "```sh\ngo run\n```\n\n```mermaid\nflowchart LR\n```\n"}},
		{name: "ok/marker-wrapped", srcs: map[string]string{"a.md": "```sh\ngo run\n```\n\n*Sketch: needs\nroot.*\n\n```sh\nsudo x\n```\n"}},
		{name: "fail/unmarked", srcs: map[string]string{"a.md": "```sh\ngo run\n```\n\nRun:\n\n```sh\nsudo x\n```\n"}, want: []string{`a.md:7: code block "sudo x"`}},
		{name: "fail/marker-not-first", srcs: map[string]string{"a.md": "```sh\ngo run\n```\n\nRun:\n*Sketch: x.*\n\n```sh\nsudo x\n```\n"}, want: []string{`a.md:8: code block "sudo x"`}},
		{name: "fail/marker-not-right-before", srcs: map[string]string{"a.md": "```sh\ngo run\n```\n\n*Sketch: x.*\n\nRun:\n\n```sh\nsudo x\n```\n"}, want: []string{`a.md:9: code block "sudo x"`}},
		{name: "fail/stale-entry", srcs: map[string]string{"a.md": "*Sketch: x.*\n```sh\ngo run\n```\n"}, want: []string{`testedBlocks: a.md has no code block starting "go run"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkCodeBlocks(tt.srcs, tested)
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
