package lifecycle

import (
	"fmt"
	"strings"
)

// Service endpoint rows (seed 002), kept in the auth bucket (cotal_auth_<t>) beside the gates:
// read leader-served by STREAM.MSG.GET, written create-only or by expected revision, never given
// a TTL and never deleted (a DEL or PURGE marker reads as corrupt, which the route answers 503).
//
//	sep.name.<epTok>            the endpoint name's binding to an owner (operator name-bind)
//	sep.req.<epTok>.<iid>       the instance's request ledger (<= 64 requestIds -> body digests)
//	sep.prop.<epTok>.<iid>      the instance's current registration proposal
//	sep.root.<epTok>.<iid>      the instance's native root (created by its first activate)
//	sep.art.<hex>               one approved artifact, by its SHA-256 hex digest
const (
	sepNamePrefix = "sep.name."
	sepReqPrefix  = "sep.req."
	sepPropPrefix = "sep.prop."
	sepRootPrefix = "sep.root."
	sepArtPrefix  = "sep.art."
)

// ServiceAuthKeyPatterns are the sep. key families, each with its variable tokens as "*".
func ServiceAuthKeyPatterns() []string {
	return []string{sepNamePrefix + "*", sepReqPrefix + "*.*", sepPropPrefix + "*.*", sepRootPrefix + "*.*", sepArtPrefix + "*"}
}

// ServiceNameKey is sep.name.<endpoint token>.
func ServiceNameKey(endpoint string) (string, error) {
	tok, err := EndpointToken(endpoint)
	if err != nil {
		return "", fmt.Errorf("lifecycle: service name key: %w", err)
	}
	return sepNamePrefix + tok, nil
}

// ServiceLedgerKey is sep.req.<endpoint token>.<instanceId>.
func ServiceLedgerKey(endpoint, instanceID string) (string, error) {
	return endpointKey(sepReqPrefix, "service ledger", endpoint, instanceID)
}

// ServiceProposalKey is sep.prop.<endpoint token>.<instanceId>.
func ServiceProposalKey(endpoint, instanceID string) (string, error) {
	return endpointKey(sepPropPrefix, "service proposal", endpoint, instanceID)
}

// ServiceRootKey is sep.root.<endpoint token>.<instanceId>.
func ServiceRootKey(endpoint, instanceID string) (string, error) {
	return endpointKey(sepRootPrefix, "service root", endpoint, instanceID)
}

// ServiceArtifactKey is sep.art.<64 lowercase hex> for digest "sha256:<hex>".
func ServiceArtifactKey(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 || strings.Trim(hex, "0123456789abcdef") != "" {
		return "", fmt.Errorf("lifecycle: service artifact key: digest is not sha256:<64 lowercase hex>")
	}
	return sepArtPrefix + hex, nil
}
