package lifecycle

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cotalgo/cotal/pkg/space"
)

// Key prefixes. Each family has its own first token, so no key of one family parses as another.
const (
	// Records bucket (cotal_records_<t>).
	headPrefix     = "lifecycle."
	uidPrefix      = "uid."
	frontierPrefix = "frontier."
	specPrefix     = "svc."
	// Auth bucket (cotal_auth_<t>).
	gatePrefix   = "gate."
	stagePrefix  = "stage."
	epgatePrefix = "epgate."
)

// AuthKeyPatterns are the key families this package keeps in the auth bucket, each with its
// variable tokens as "*": gate.*, stage.* and epgate.*.*. They are the rows of the one credential
// that writes them (pkg/profiles' auth-plane, authd's); the plane claim's key is not among them.
func AuthKeyPatterns() []string {
	return []string{gatePrefix + "*", stagePrefix + "*", epgatePrefix + "*.*"}
}

// RecordsKeyPatterns are the key families of the records bucket, each with its variable tokens as
// "*": lifecycle.*.*, uid.*, frontier.* and svc.*.*.
func RecordsKeyPatterns() []string {
	return []string{headPrefix + "*.*", uidPrefix + "*", frontierPrefix + "*", specPrefix + "*.*"}
}

// ManagerEndpoint is the manager's endpoint name: its gate is epgate.manager.<instanceId> and its
// spec svc.manager.<instanceId>. Service endpoints use the same gate family under their own names.
const ManagerEndpoint = "manager"

// MaxEndpointTokenLen caps an endpoint token in bytes (upstream's bound).
const MaxEndpointTokenLen = 64

// ErrBadKey is wrapped by every key parser's refusal: the key is not one of this package's keys.
var ErrBadKey = errors.New("lifecycle: not a lifecycle key")

// EndpointToken validates a dotted endpoint name (one or more labels of
// [a-z0-9]([a-z0-9-]*[a-z0-9])?) and returns its key token: the labels joined by '_'. The mapping
// is one-to-one because a label cannot hold '_'; EndpointName inverts it.
func EndpointToken(name string) (string, error) {
	if name == "" {
		return "", errors.New("lifecycle: endpoint name is empty")
	}
	if len(name) > MaxEndpointTokenLen {
		return "", fmt.Errorf("lifecycle: endpoint name is longer than %d bytes", MaxEndpointTokenLen)
	}
	for _, l := range strings.Split(name, ".") {
		if !isEndpointLabel(l) {
			return "", fmt.Errorf("lifecycle: endpoint name %q: label %q is not [a-z0-9]([a-z0-9-]*[a-z0-9])?", clip(name), clip(l))
		}
	}
	return strings.ReplaceAll(name, ".", "_"), nil
}

// EndpointName returns the dotted endpoint name of a key token, refusing a token EndpointToken
// could not have produced.
func EndpointName(token string) (string, error) {
	name := strings.ReplaceAll(token, "_", ".")
	if t, err := EndpointToken(name); err != nil || t != token {
		return "", fmt.Errorf("lifecycle: %q is not an endpoint token", clip(token))
	}
	return name, nil
}

func isEndpointLabel(l string) bool {
	if l == "" || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for i := 0; i < len(l); i++ {
		if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// HeadKey is an alias's lifecycle head in the records bucket: lifecycle.<owner>.<actor>.
func HeadKey(owner, actor string) (string, error) {
	p, err := space.PrincipalKey(owner, actor)
	if err != nil {
		return "", fmt.Errorf("lifecycle: head key: %w", err)
	}
	return headPrefix + p, nil
}

// ParseHeadKey returns the owner and actor of a head key.
func ParseHeadKey(key string) (owner, actor string, err error) {
	parts, err := split(key, headPrefix, 2)
	if err != nil {
		return "", "", err
	}
	if space.ValidateOwner(parts[0]) != nil || space.ValidateActor(parts[1]) != nil {
		return "", "", badKey(key)
	}
	return parts[0], parts[1], nil
}

// UIDKey is a lifecycle uid's space-global reservation in the records bucket: uid.<uid>.
func UIDKey(uid string) (string, error) { return uidKey(uidPrefix, "reservation", uid) }

// ParseUIDKey returns the uid of a reservation key.
func ParseUIDKey(key string) (string, error) { return parseUIDKey(key, uidPrefix) }

// FrontierKey is a retired lifecycle's frontier in the records bucket: frontier.<uid>.
func FrontierKey(uid string) (string, error) { return uidKey(frontierPrefix, "frontier", uid) }

// ParseFrontierKey returns the uid of a frontier key.
func ParseFrontierKey(key string) (string, error) { return parseUIDKey(key, frontierPrefix) }

// GateKey is a lifecycle's issuance gate in the auth bucket: gate.<uid>.
func GateKey(uid string) (string, error) { return uidKey(gatePrefix, "gate", uid) }

// ParseGateKey returns the uid of a gate key.
func ParseGateKey(key string) (string, error) { return parseUIDKey(key, gatePrefix) }

// StageKey is an operation's intent in the auth bucket: stage.<opId>. An opId has the uid grammar.
func StageKey(opID string) (string, error) { return uidKey(stagePrefix, "stage", opID) }

// ParseStageKey returns the opId of a stage key.
func ParseStageKey(key string) (string, error) { return parseUIDKey(key, stagePrefix) }

// SpecKey is an endpoint instance's registration spec in the records bucket:
// svc.<endpoint token>.<instanceId>. Its KV revision is the registration revision.
func SpecKey(endpoint, instanceID string) (string, error) {
	return endpointKey(specPrefix, "spec", endpoint, instanceID)
}

// ParseSpecKey returns the endpoint name and instance id of a spec key.
func ParseSpecKey(key string) (endpoint, instanceID string, err error) {
	return parseEndpointKey(key, specPrefix)
}

// EndpointGateKey is an endpoint instance's gate in the auth bucket:
// epgate.<endpoint token>.<instanceId>.
func EndpointGateKey(endpoint, instanceID string) (string, error) {
	return endpointKey(epgatePrefix, "endpoint gate", endpoint, instanceID)
}

// ParseEndpointGateKey returns the endpoint name and instance id of an endpoint gate key.
func ParseEndpointGateKey(key string) (endpoint, instanceID string, err error) {
	return parseEndpointKey(key, epgatePrefix)
}

func uidKey(prefix, what, uid string) (string, error) {
	if err := space.ValidateUID(uid); err != nil {
		return "", fmt.Errorf("lifecycle: %s key: %w", what, err)
	}
	return prefix + uid, nil
}

func parseUIDKey(key, prefix string) (string, error) {
	parts, err := split(key, prefix, 1)
	if err != nil {
		return "", err
	}
	if space.ValidateUID(parts[0]) != nil {
		return "", badKey(key)
	}
	return parts[0], nil
}

func endpointKey(prefix, what, endpoint, instanceID string) (string, error) {
	tok, err := EndpointToken(endpoint)
	if err != nil {
		return "", fmt.Errorf("lifecycle: %s key: %w", what, err)
	}
	if err := space.ValidateUID(instanceID); err != nil {
		return "", fmt.Errorf("lifecycle: %s key: instance id: %w", what, err)
	}
	return prefix + tok + "." + instanceID, nil
}

func parseEndpointKey(key, prefix string) (string, string, error) {
	parts, err := split(key, prefix, 2)
	if err != nil {
		return "", "", err
	}
	name, err := EndpointName(parts[0])
	if err != nil || space.ValidateUID(parts[1]) != nil {
		return "", "", badKey(key)
	}
	return name, parts[1], nil
}

// split checks the prefix, the bound and the token count of key and returns its tokens after the
// prefix.
func split(key, prefix string, n int) ([]string, error) {
	if len(key) > space.MaxKVKeyLen || !strings.HasPrefix(key, prefix) {
		return nil, badKey(key)
	}
	parts := strings.Split(key[len(prefix):], ".")
	if len(parts) != n {
		return nil, badKey(key)
	}
	return parts, nil
}

func badKey(key string) error { return fmt.Errorf("%w: %q", ErrBadKey, clip(key)) }

// clip bounds a hostile value quoted in an error.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
