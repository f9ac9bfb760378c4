package space

import (
	"fmt"
	"strings"
)

// Grammar limits. Upstream bounds only the UID and the inbox nonce; the others are ours, sized so
// that the longest derived name (chathist_<owner>-<actor>-<uid>) stays well under JetStream's
// 255-byte name limit and a many-channel JWT stays under the broker's control-line cap.
const (
	// MaxIdentLen caps an owner, actor or role token in bytes.
	MaxIdentLen = 64
	// MaxChannelLen caps a channel in bytes.
	MaxChannelLen = 128
	// MaxKVKeyLen caps a KV key in bytes.
	MaxKVKeyLen = 256
	// MaxJSNameLen caps a stream or consumer name in bytes (JetStream's own limit).
	MaxJSNameLen = 255
	// MaxFilterLen caps a consumer filter subject in bytes.
	MaxFilterLen = 512
	// MaxScopeWordLen caps one scope word of a Cotal bearer in bytes.
	MaxScopeWordLen = 32
	// MaxScopeWords caps the scope words of one bearer: signerd signs no more, authd accepts no
	// more, and an actor row holds no more capability words.
	MaxScopeWords = 16
	// MaxCredentialIDLen caps a bearer's connect-credential id in bytes.
	MaxCredentialIDLen = 64
)

// IsScopeWord reports whether w is a Cotal bearer scope word: [a-z][a-z0-9_-]{0,31}. signerd
// signs only such words and authd accepts only them, so both use this one grammar.
func IsScopeWord(w string) bool {
	if w == "" || len(w) > MaxScopeWordLen || w[0] < 'a' || w[0] > 'z' {
		return false
	}
	for i := 1; i < len(w); i++ {
		if c := w[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// IsCredentialID reports whether id is a bearer's connect-credential id: [A-Za-z0-9_-]{1,64}.
func IsCredentialID(id string) bool {
	if id == "" || len(id) > MaxCredentialIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !isAlnum(c) && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// ValidateOwner checks an owner token: one token of [A-Za-z0-9_]+, at most MaxIdentLen bytes.
// '-' is excluded because it separates owner and actor in JetStream names; '.', '*' and '>' would
// let one owner's grant span or alias another's.
func ValidateOwner(s string) error { return validateIdent(KindOwner, s) }

// ValidateActor checks an actor token with the same grammar as ValidateOwner.
func ValidateActor(s string) error { return validateIdent(KindActor, s) }

func validateIdent(kind, s string) error {
	if s == "" {
		return nameErr(kind, s, "is empty")
	}
	if len(s) > MaxIdentLen {
		return nameErr(kind, s, fmt.Sprintf("is longer than %d bytes", MaxIdentLen))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' {
			return nameErr(kind, s, fmt.Sprintf("byte %d (%q) is outside [A-Za-z0-9_]", i, c))
		}
	}
	return nil
}

// ValidateDerivedOwner checks a server-derived owner token: "u_" and 26 lower-case base32
// characters ([a-z2-7]). The shape is disjoint from nkeys (56 upper-case characters), so an nkey
// can never pass as a real owner. Every derived owner also passes ValidateOwner.
func ValidateDerivedOwner(s string) error {
	if len(s) != 28 || !strings.HasPrefix(s, "u_") {
		return nameErr(KindDerivedOwner, s, `is not "u_" followed by 26 characters`)
	}
	for i := 2; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z') && !(c >= '2' && c <= '7') {
			return nameErr(KindDerivedOwner, s, fmt.Sprintf("byte %d (%q) is outside [a-z2-7]", i, c))
		}
	}
	return nil
}

// ValidateUID checks a lifecycle UID (also the grammar of a manager instance id): 26 to 32
// characters of [a-z0-9].
func ValidateUID(s string) error {
	if len(s) < 26 || len(s) > 32 {
		return nameErr(KindUID, s, "is not 26 to 32 characters long")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') {
			return nameErr(KindUID, s, fmt.Sprintf("byte %d (%q) is outside [a-z0-9]", i, c))
		}
	}
	return nil
}

// ValidateChannel checks a concrete channel: one or more tokens of [A-Za-z0-9_-]+ joined by '.',
// at most MaxChannelLen bytes. Empty tokens, '*' and '>' are refused: upstream lets policy name a
// channel subtree ("team.>"), but every channel this package accepts names exactly one channel, so
// no caller value can widen a grant.
func ValidateChannel(s string) error {
	if s == "" {
		return nameErr(KindChannel, s, "is empty")
	}
	if len(s) > MaxChannelLen {
		return nameErr(KindChannel, s, fmt.Sprintf("is longer than %d bytes", MaxChannelLen))
	}
	for i, tok := range strings.Split(s, ".") {
		if tok == "" {
			return nameErr(KindChannel, s, fmt.Sprintf("token %d is empty (leading, trailing or double dot)", i))
		}
		for j := 0; j < len(tok); j++ {
			if c := tok[j]; !isAlnum(c) && c != '_' && c != '-' {
				return nameErr(KindChannel, s, fmt.Sprintf("token %d contains %q, outside [A-Za-z0-9_-]", i, c))
			}
		}
	}
	return nil
}

// ValidateRole checks a service role: one token of [A-Za-z0-9_-]+, at most MaxIdentLen bytes.
// Upstream passes roles through the lossy space token; we refuse what it would rewrite so two
// roles can never share a svc_<role> consumer.
func ValidateRole(s string) error {
	if s == "" {
		return nameErr(KindRole, s, "is empty")
	}
	if len(s) > MaxIdentLen {
		return nameErr(KindRole, s, fmt.Sprintf("is longer than %d bytes", MaxIdentLen))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '-' {
			return nameErr(KindRole, s, fmt.Sprintf("byte %d (%q) is outside [A-Za-z0-9_-]", i, c))
		}
	}
	return nil
}

// ValidateInboxNonce checks the token that fills a private reply inbox _INBOX_<nonce>: 8 to 120
// characters of [A-Za-z0-9_-]. It admits user nkeys (56 characters) and client-chosen random
// nonces while refusing '*', '>', '.' and spaces, so the inbox grant can never cover another
// connection's inbox.
func ValidateInboxNonce(s string) error {
	if len(s) < 8 || len(s) > 120 {
		return nameErr(KindInboxNonce, s, "is not 8 to 120 characters long")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '-' {
			return nameErr(KindInboxNonce, s, fmt.Sprintf("byte %d (%q) is outside [A-Za-z0-9_-]", i, c))
		}
	}
	return nil
}

// ValidateKVKey checks a concrete KV key: tokens of [-/_=A-Za-z0-9]+ joined by '.', at most
// MaxKVKeyLen bytes. This is the NATS KV key alphabet without its wildcards.
func ValidateKVKey(s string) error {
	if s == "" {
		return nameErr(KindKVKey, s, "is empty")
	}
	if len(s) > MaxKVKeyLen {
		return nameErr(KindKVKey, s, fmt.Sprintf("is longer than %d bytes", MaxKVKeyLen))
	}
	for i, tok := range strings.Split(s, ".") {
		if tok == "" {
			return nameErr(KindKVKey, s, fmt.Sprintf("token %d is empty", i))
		}
		for j := 0; j < len(tok); j++ {
			if c := tok[j]; !isAlnum(c) && c != '_' && c != '-' && c != '/' && c != '=' {
				return nameErr(KindKVKey, s, fmt.Sprintf("token %d contains %q, outside [-/_=A-Za-z0-9]", i, c))
			}
		}
	}
	return nil
}

// validateJSName checks a stream or consumer name as used inside an API subject. We restrict to
// [A-Za-z0-9_-] (every name this package builds fits), which is narrower than JetStream's rule and
// excludes '.', wildcards and whitespace that would change the subject's shape.
func validateJSName(kind, s string) error {
	if s == "" {
		return nameErr(kind, s, "is empty")
	}
	if len(s) > MaxJSNameLen {
		return nameErr(kind, s, fmt.Sprintf("is longer than %d bytes", MaxJSNameLen))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '_' && c != '-' {
			return nameErr(kind, s, fmt.Sprintf("byte %d (%q) is outside [A-Za-z0-9_-]", i, c))
		}
	}
	return nil
}

// ValidateFilter checks a subject used as a consumer filter or permission: non-empty tokens
// joined by '.', printable ASCII only (no whitespace or control bytes), '*' only as a whole token
// and '>' only as the whole last token.
func ValidateFilter(s string) error {
	if s == "" {
		return nameErr(KindFilter, s, "is empty")
	}
	if len(s) > MaxFilterLen {
		return nameErr(KindFilter, s, fmt.Sprintf("is longer than %d bytes", MaxFilterLen))
	}
	toks := strings.Split(s, ".")
	for i, tok := range toks {
		if tok == "" {
			return nameErr(KindFilter, s, fmt.Sprintf("token %d is empty", i))
		}
		if tok == "*" {
			continue
		}
		if tok == ">" {
			if i != len(toks)-1 {
				return nameErr(KindFilter, s, "'>' is not the last token")
			}
			continue
		}
		for j := 0; j < len(tok); j++ {
			c := tok[j]
			if c <= ' ' || c >= 0x7f || c == '*' || c == '>' {
				return nameErr(KindFilter, s, fmt.Sprintf("token %d contains %q", i, c))
			}
		}
	}
	return nil
}
