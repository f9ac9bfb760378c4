package lifecycle

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/cotalgo/cotal/pkg/jsjson"
	"github.com/cotalgo/cotal/pkg/space"
)

// OpIDLen is the length of the opIds this package derives: 26 lower-case hex characters, which
// also pass the uid grammar every stored opId must pass.
const OpIDLen = 26

// ManagedRetirementOpID is the one opId of a managed lifecycle's retirement: the first 26 hex
// characters of SHA-256("retire:"+uid), upstream's managedRetirementOpId. The door and the rail
// derive it from the uid alone, so a retry or a second caller joins the same operation.
func ManagedRetirementOpID(uid string) (string, error) { return opID("retire:", uid) }

// InteractiveRetirementOpID is the interactive retirement door's opId: the first 26 hex
// characters of SHA-256("interactive-retire:"+uid).
func InteractiveRetirementOpID(uid string) (string, error) { return opID("interactive-retire:", uid) }

// ActivationOpID is the opId of a lifecycle's activation saga: the first 26 hex characters of
// SHA-256("activate:"+uid). It is ours (upstream mints a random one), so a retried activation
// adopts the frozen(activation) gate it left behind.
func ActivationOpID(uid string) (string, error) { return opID("activate:", uid) }

// RegistrationOpID is the opId of the registration that freezes an endpoint instance's gate at
// fromEpoch to reopen it at fromEpoch+1: the first 26 hex characters of
// SHA-256("register:"+<endpoint token>+"."+instanceId+":"+<fromEpoch in decimal>). It is ours
// (upstream's registration op is not in the reference): a pure function of the gate it freezes,
// so a registration that finds the gate frozen by a crashed start's registration adopts that
// freeze, and a frozen(registration) gate whose opId is not its own epoch's is corruption.
func RegistrationOpID(endpoint, instanceID string, fromEpoch uint64) (string, error) {
	tok, err := EndpointToken(endpoint)
	if err != nil {
		return "", fmt.Errorf("lifecycle: opId: %w", err)
	}
	if err := space.ValidateUID(instanceID); err != nil {
		return "", fmt.Errorf("lifecycle: opId: %w", err)
	}
	if fromEpoch > MaxSafeInteger {
		return "", errors.New("lifecycle: opId: epoch above 2^53-1")
	}
	return registrationOpID(tok, instanceID, fromEpoch), nil
}

// registrationOpID derives RegistrationOpID from a validated endpoint token and instance id.
func registrationOpID(tok, instanceID string, fromEpoch uint64) string {
	return mustOpID("register:", tok+"."+instanceID+":"+strconv.FormatUint(fromEpoch, 10))
}

func opID(prefix, uid string) (string, error) {
	if err := space.ValidateUID(uid); err != nil {
		return "", fmt.Errorf("lifecycle: opId: %w", err)
	}
	return mustOpID(prefix, uid), nil
}

// mustOpID derives an opId from a uid already validated.
func mustOpID(prefix, uid string) string {
	sum := sha256.Sum256([]byte(prefix + uid))
	return hex.EncodeToString(sum[:])[:OpIDLen]
}

// ManagedRuntimeKey is the provider key a managed seat's hosted runtime is created under:
// "cotal-" and the first 32 hex characters of the SHA-256 of the JSON array
// [space, owner, actor, uid] (JSON.stringify's encoding), upstream's managedRuntimeKey. It is a
// pure function of the full target, so whoever holds provider authority can close the runtime by
// lifecycle, never by name.
func ManagedRuntimeKey(spaceName, owner, actor, uid string) (string, error) {
	if err := space.ValidateName(spaceName); err != nil {
		return "", fmt.Errorf("lifecycle: runtime key: %w", err)
	}
	if _, err := space.PrincipalKey(owner, actor); err != nil {
		return "", fmt.Errorf("lifecycle: runtime key: %w", err)
	}
	if err := space.ValidateUID(uid); err != nil {
		return "", fmt.Errorf("lifecycle: runtime key: %w", err)
	}
	b := []byte{'['}
	for i, s := range []string{spaceName, owner, actor, uid} {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsjson.AppendString(b, s)
	}
	b = append(b, ']')
	sum := sha256.Sum256(b)
	return "cotal-" + hex.EncodeToString(sum[:])[:32], nil
}
