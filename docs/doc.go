// Package docs holds no Go code of its own: it is the Markdown documentation, one page per
// reader's task linked from README.md, and the home of the tests that check it. docs_test.go:
// relative links and anchors in README.md, CONTRIBUTING.md, SECURITY.md, CHANGELOG.md and
// docs/*.md resolve, every make target they name exists, and every command of the README before
// the split still appears. examples_test.go: every code block is run by a test or marked as a
// sketch, synopsis or example output. godoc_test.go: every public package's doc comment starts
// with "Package <name> ".
package docs
