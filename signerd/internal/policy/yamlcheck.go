package policy

import (
	"errors"

	"go.yaml.in/yaml/v3"

	"github.com/cotalgo/cotal/pkg/yamlx"
)

// checkPlain is the policy parser's hook: yamlx's plain-YAML check on the parsed tree, as an
// *Error naming path (see pkg/yamlx for why anchors, aliases, merge keys and tags are refused).
func checkPlain(root *yaml.Node, path string) error {
	var pe *yamlx.PlainError
	if err := yamlx.CheckNode(root); errors.As(err, &pe) {
		return &Error{Path: path, Line: pe.Line, Caller: -1, Reason: pe.Reason()}
	}
	return nil
}
