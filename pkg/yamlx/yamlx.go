// Package yamlx is the one YAML reader of every Cotal daemon's configuration and of signerd's
// policy: plain YAML only, decoded strictly. What a reviewer reads in a file must be what the
// daemon decodes. Anchors and aliases let one entry take a value written elsewhere, a merge key
// ("<<") lets an entry inherit keys it does not show (a profiles map, say), and an explicit tag
// changes how a scalar is read (!!binary spells "alpha" as "YWxwaGE="). None is needed to write a
// configuration or a policy, so all are refused, with the line they are on. Decode also refuses
// an unknown key (naming it) and a second document.
package yamlx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"
)

// PlainError is an anchor, alias, merge key or explicit tag found by CheckPlain.
type PlainError struct {
	// Line is the 1-based line of the offending node.
	Line int
	// What names it ("anchor &x", "merge key <<", ...).
	What string
}

func (e *PlainError) Error() string {
	return fmt.Sprintf("line %d: %s", e.Line, e.Reason())
}

// Reason is the error without its line, for callers that report the line themselves.
func (e *PlainError) Reason() string {
	return e.What + " is not allowed: write every value where it applies (anchors, aliases, merge keys and tags are refused)"
}

// CheckNode walks a parsed node tree and refuses anchors, aliases, merge keys and explicit tags
// with a *PlainError.
func CheckNode(n *yaml.Node) error {
	if n == nil {
		return nil
	}
	bad := func(n *yaml.Node, what string) error { return &PlainError{Line: n.Line, What: what} }
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
		if err := CheckNode(c); err != nil {
			return err
		}
	}
	return nil
}

// CheckPlain parses data and refuses anchors, aliases, merge keys ("<<") and explicit tags
// anywhere in it with a *PlainError; malformed YAML is the decoder's error.
func CheckPlain(data []byte) error {
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
		if err := CheckNode(&n); err != nil {
			return err
		}
	}
}

// ErrMultipleDocuments: a configuration holds more than one YAML document.
var ErrMultipleDocuments = errors.New("more than one YAML document")

// Decode decodes one plain YAML document from data into out, strictly: CheckPlain's refusals,
// an unknown key (the decoder's error names it and its line), a value of the wrong type and a
// second document are errors. An empty document leaves out unchanged.
func Decode(data []byte, out any) error {
	if err := CheckPlain(data); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return ErrMultipleDocuments
	}
	return nil
}

// Duration is a time.Duration written as "10s" in YAML. Negative values are refused.
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: duration must be a string like \"10s\"", n.Line)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	if v < 0 {
		return fmt.Errorf("line %d: duration %s is negative", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// D returns the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
