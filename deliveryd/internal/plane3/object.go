package plane3

import (
	"encoding/json"
	"unicode/utf8"
)

// field is one member of a JSON object: its key as json.Unmarshal decodes it into a map key, and
// its value's bytes as they stand (a json.RawMessage of the input, not a copy).
type field struct {
	key string
	raw json.RawMessage
}

// objectFields splits b, which json.Valid has accepted, into its top-level members in order; ok
// is false unless b is a JSON object. It is what json.Unmarshal into a map[string]json.RawMessage
// reads, without the map or a copy of each value: a chat message is split this way by both loops,
// each post once per loop, where the map cost more than the rest of a copy's handling
// (BENCHMARKS.md, issue 27). Duplicate keys are all returned; the last one counts, as in the map.
// On input json.Valid refuses it returns ok false, never panics (FuzzDecodeMessage).
func objectFields(b []byte) (fields []field, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	fields = make([]field, 0, 8)
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return fields, true
	}
	for i < len(b) && b[i] == '"' {
		kend := stringEnd(b, i)
		if kend < 0 {
			return nil, false
		}
		key, kok := objectKey(b[i:kend])
		if !kok {
			return nil, false
		}
		i = skipSpace(b, kend)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		vend := valueEnd(b, i)
		if vend < 0 {
			return nil, false
		}
		fields = append(fields, field{key: key, raw: b[i:vend]})
		i = skipSpace(b, vend)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return fields, true
		default:
			return nil, false
		}
	}
	return nil, false
}

// last is the value of the last member named key.
func last(fields []field, key string) (json.RawMessage, bool) {
	for i := len(fields) - 1; i >= 0; i-- {
		if fields[i].key == key {
			return fields[i].raw, true
		}
	}
	return nil, false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the index just past the string literal that starts at b[i] ('"'), or -1.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd is the index just past the value that starts at b[i], or -1.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := stringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default: // a number, true, false or null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// objectKey decodes a key literal (quotes included) as json.Unmarshal decodes a map key: as it
// stands when it is plain printable ASCII, else through json.Unmarshal itself (escapes, and
// invalid UTF-8 replaced).
func objectKey(lit []byte) (string, bool) {
	plain := true
	for _, c := range lit[1 : len(lit)-1] {
		if c == '\\' || c < ' ' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return string(lit[1 : len(lit)-1]), true
	}
	var key string
	if json.Unmarshal(lit, &key) != nil {
		return "", false
	}
	return key, true
}
