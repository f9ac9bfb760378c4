package lifecycle

import (
	"errors"
	"fmt"
)

// railReplyWire is the answer envelope both auth rails share, {"v":1,"ok":true,"result":W} or
// {"v":1,"ok":false,"code":C,"error":E}, around a rail's result wire W (pointer fields, so a
// missing field is told from a zero one).
type railReplyWire[W any] struct {
	V      *int    `json:"v"`
	OK     *bool   `json:"ok"`
	Result *W      `json:"result,omitempty"`
	Code   *string `json:"code,omitempty"`
	Error  *string `json:"error,omitempty"`
}

// encodeRailReply writes an answer of the rail what: ok with result (which the caller checked),
// or a refusal with code ([a-z-]) and msg (clipped to maxRailTextBytes).
func encodeRailReply[W any](what string, ok bool, result *W, code, msg string) ([]byte, error) {
	v := 1
	w := railReplyWire[W]{V: &v, OK: &ok}
	if ok {
		w.Result = result
	} else {
		if err := checkRailCode(code); err != nil {
			return nil, fmt.Errorf("lifecycle: %s reply: %w", what, err)
		}
		msg = clipText(msg, maxRailTextBytes)
		w.Code, w.Error = &code, &msg
	}
	return marshalNoHTML(w)
}

// decodeRailReply reads an answer of the rail what with decode (a closed decoder): v 1 and ok
// present; ok true carries exactly a result (returned, for the caller to check its fields), ok
// false exactly a code ([a-z-], at most 64 bytes) and an error of at most maxRailTextBytes.
func decodeRailReply[W any](what string, b []byte, decode func([]byte, any) error) (result *W, code, msg string, err error) {
	var w railReplyWire[W]
	if err := decode(b, &w); err != nil {
		return nil, "", "", fmt.Errorf("lifecycle: %s reply: %w", what, err)
	}
	if w.V == nil || *w.V != 1 || w.OK == nil {
		return nil, "", "", fmt.Errorf("lifecycle: %s reply: v must be 1 and ok present", what)
	}
	if *w.OK {
		if w.Result == nil || w.Code != nil || w.Error != nil {
			return nil, "", "", fmt.Errorf("lifecycle: %s reply: ok carries exactly a result", what)
		}
		return w.Result, "", "", nil
	}
	if w.Result != nil || w.Code == nil || w.Error == nil {
		return nil, "", "", fmt.Errorf("lifecycle: %s reply: a refusal carries exactly a code and an error", what)
	}
	if err := checkRailCode(*w.Code); err != nil {
		return nil, "", "", fmt.Errorf("lifecycle: %s reply: %w", what, err)
	}
	if len(*w.Error) > maxRailTextBytes {
		return nil, "", "", fmt.Errorf("lifecycle: %s reply: error over %d bytes", what, maxRailTextBytes)
	}
	return nil, *w.Code, *w.Error, nil
}

var errNoResult = errors.New("the result is missing a field")
