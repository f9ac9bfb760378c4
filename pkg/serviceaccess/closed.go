package serviceaccess

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// MaxSafeInteger is the largest integer every parser here accepts (2^53-1, so a JavaScript peer
// reads the same value).
const MaxSafeInteger = 1<<53 - 1

// Error is a refused value: Field names where (a dotted path such as "request.contract.closures"),
// Reason what. It never holds token text or the refused value itself beyond a short clipped name.
type Error struct {
	Field  string
	Reason string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return "serviceaccess: " + e.Reason
	}
	return "serviceaccess: " + e.Field + ": " + e.Reason
}

func fail(field, format string, args ...any) *Error {
	return &Error{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// obj is one JSON object decoded closed: its members by exact key.
type obj struct {
	path string
	m    map[string]json.RawMessage
}

// object decodes b as exactly one JSON object into its raw members, refusing anything else,
// a duplicated key and trailing data. Keys are exact: a member is looked up by its exact
// spelling, so "Kind" never stands in for "kind" as it would with encoding/json's struct
// matching.
func object(b []byte, path string) (*obj, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fail(path, "is not a JSON object")
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fail(path, "is not a JSON object")
		}
		k, ok := t.(string)
		if !ok {
			return nil, fail(path, "is not a JSON object")
		}
		if _, dup := out[k]; dup {
			return nil, fail(path, "key %.64q appears twice", k)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fail(path, "is not a JSON object")
		}
		out[k] = raw
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, fail(path, "is not a JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fail(path, "has data after its JSON value")
	}
	return &obj{path: path, m: out}, nil
}

// array decodes b as exactly one JSON array into its raw elements (at most max).
func array(b []byte, path string, max int) ([]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return nil, fail(path, "is not a JSON array")
	}
	var out []json.RawMessage
	for dec.More() {
		if len(out) == max {
			return nil, fail(path, "holds more than %d elements", max)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fail(path, "is not a JSON array")
		}
		out = append(out, raw)
	}
	if _, err := dec.Token(); err != nil { // ']'
		return nil, fail(path, "is not a JSON array")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fail(path, "has data after its JSON value")
	}
	return out, nil
}

func (o *obj) field(k string) string {
	if o.path == "" {
		return k
	}
	return o.path + "." + k
}

func (o *obj) has(k string) bool { _, ok := o.m[k]; return ok }

// only refuses a key outside allowed and a missing key of required (a subset of allowed).
func (o *obj) only(allowed []string, required ...string) error {
	for k := range o.m {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			return fail(o.path, "unknown key %.64q", k)
		}
	}
	for _, r := range required {
		if !o.has(r) {
			return fail(o.field(r), "is missing")
		}
	}
	return nil
}

// str reads member k as a JSON string (never null); a missing member reads as "".
func (o *obj) str(k string) (string, error) {
	raw, ok := o.m[k]
	if !ok {
		return "", nil
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", fail(o.field(k), "is not a string")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fail(o.field(k), "is not a string")
	}
	return s, nil
}

// integer reads member k as a JSON integer in 0..MaxSafeInteger (no sign, fraction or
// exponent); a missing member reads as 0.
func (o *obj) integer(k string) (int64, error) {
	raw, ok := o.m[k]
	if !ok {
		return 0, nil
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] < '0' || raw[0] > '9' {
		return 0, fail(o.field(k), "is not a non-negative integer")
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil || strings.ContainsAny(string(n), ".eE") {
		return 0, fail(o.field(k), "is not a non-negative integer")
	}
	v, err := n.Int64()
	if err != nil || v > MaxSafeInteger {
		return 0, fail(o.field(k), "is above 2^53-1")
	}
	return v, nil
}

// boolean reads member k as true or false; a missing member reads as false.
func (o *obj) boolean(k string) (bool, error) {
	raw, ok := o.m[k]
	if !ok {
		return false, nil
	}
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fail(o.field(k), "is not a boolean")
}

// sub reads member k as a closed JSON object.
func (o *obj) sub(k string) (*obj, error) {
	raw, ok := o.m[k]
	if !ok {
		return nil, fail(o.field(k), "is missing")
	}
	return object(raw, o.field(k))
}

// text checks a human sentence: 1 to max bytes of valid UTF-8 without control characters.
func text(field, s string, max int) error {
	if s == "" || len(s) > max {
		return fail(field, "is not 1 to %d bytes", max)
	}
	if !utf8.ValidString(s) {
		return fail(field, "is not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fail(field, "holds a control character")
		}
	}
	return nil
}

// marshalCanonical is v's JSON with every object's keys sorted, no insignificant whitespace,
// HTML characters unescaped and integers plain: v is encoded, read back with json.Number, and
// encoded again (encoding/json writes map keys sorted).
func marshalCanonical(v any) ([]byte, error) {
	first, err := marshalNoHTML(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(first))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return nil, err
	}
	return marshalNoHTML(generic)
}

func marshalNoHTML(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}
