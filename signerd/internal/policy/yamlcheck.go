package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// Plain YAML: what a reviewer reads in a policy or configuration file must be what signerd
// decodes. Anchors and aliases let one entry take a value written elsewhere, a merge key ("<<")
// lets an entry inherit keys it does not show (a profiles map, say), and an explicit tag changes
// how a scalar is read (!!binary spells "alpha" as "YWxwaGE="). None is needed to write a
// policy, so all are refused, with the line they are on.

// PlainYAMLError is an anchor, alias, merge key or explicit tag found by CheckPlainYAML.
type PlainYAMLError struct {
	// Line is the 1-based line of the offending node.
	Line int
	// What names it ("anchor &x", "merge key <<", ...).
	What string
}

func (e *PlainYAMLError) Error() string {
	return fmt.Sprintf("line %d: %s", e.Line, e.reason())
}

func (e *PlainYAMLError) reason() string {
	return e.What + " is not allowed: write every value where it applies (anchors, aliases, merge keys and tags are refused)"
}

// checkPlain is the policy parser's hook: CheckPlainYAML's check on the parsed tree, as an
// *Error naming path.
func checkPlain(root *yaml.Node, path string) error {
	var pe *PlainYAMLError
	if err := plainNode(root); errors.As(err, &pe) {
		return &Error{Path: path, Line: pe.Line, Caller: -1, Reason: pe.reason()}
	}
	return nil
}

// plainNode walks a parsed node tree and refuses anchors, aliases, merge keys and explicit tags.
func plainNode(n *yaml.Node) error {
	if n == nil {
		return nil
	}
	bad := func(n *yaml.Node, what string) error { return &PlainYAMLError{Line: n.Line, What: what} }
	switch {
	case n.Kind == yaml.AliasNode:
		return bad(n, fmt.Sprintf("alias *%.40s", n.Value))
	case n.Anchor != "":
		return bad(n, fmt.Sprintf("anchor &%.40s", n.Anchor))
	case n.Style&yaml.TaggedStyle != 0:
		return bad(n, fmt.Sprintf("explicit tag %.40s", n.Tag))
	}
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
				return bad(k, "merge key <<")
			}
		}
	}
	for _, c := range n.Content {
		if err := plainNode(c); err != nil {
			return err
		}
	}
	return nil
}

// CheckPlainYAML parses data and refuses anchors, aliases, merge keys ("<<") and explicit tags
// anywhere in it with a *PlainYAMLError; malformed YAML is the decoder's error. It is for files
// other than the policy (the signerd configuration); Parse applies the same check itself.
func CheckPlainYAML(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := plainNode(&n); err != nil {
			return err
		}
	}
}
