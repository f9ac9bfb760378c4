package lifecycle

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"strconv"

	"github.com/cotalgo/cotal/pkg/jsjson"
	"github.com/cotalgo/cotal/pkg/space"
)

// ProofDomain is the MAC domain of the registration proof; signerd's Mac computes
// "sha256:" + hex(HMAC-SHA256(mac key, ProofDomain + "\x00" + payload)).
const ProofDomain = "cotal/manager-current-registration/v1"

// ProofPrefix starts every registration proof.
const ProofPrefix = "sha256:"

// MaxSafeInteger is the largest integer every reader of these rows (a JavaScript one included)
// holds exactly: 2^53-1. Epochs, revisions, generations and sequences above it are refused.
const MaxSafeInteger = 1<<53 - 1

// Identities are the public user nkeys of a manager registration's five actors.
type Identities struct {
	Supervisor, Executor, Serve, GoalWriter, SessionLedger string
}

// Registration is what a manager's current registration proof binds: the space, the manager's
// principal and lifecycle, its instance, the nkeys of its five actors, and the registration
// revision and process epoch its gate records.
type Registration struct {
	Space                string
	Owner, Actor         string
	InstanceID           string
	LifecycleUID         string
	Identities           Identities
	RegistrationRevision uint64
	ProcessEpoch         uint64
}

// actorKeys are the payload's actor keys in order, with each actor name's prefix (the instance id
// follows it).
var actorKeys = [5]struct{ key, prefix string }{
	{"supervisor", "manager_"},
	{"executor", "manager_exec_"},
	{"serve", "manager_serve_"},
	{"goalWriter", "manager_goal_"},
	{"sessionLedger", "manager_session_"},
}

// ManagerActors returns the five actor names of a manager instance in the payload's key order:
// supervisor, executor, serve, goalWriter, sessionLedger.
func ManagerActors(instanceID string) ([5]string, error) {
	var out [5]string
	if err := space.ValidateUID(instanceID); err != nil {
		return out, fmt.Errorf("lifecycle: manager actors: %w", err)
	}
	for i, a := range actorKeys {
		out[i] = a.prefix + instanceID
	}
	return out, nil
}

// ServePrincipal is a manager instance's serve principal, <owner>.manager_serve_<instanceId>.
func ServePrincipal(owner, instanceID string) (string, error) {
	if err := space.ValidateUID(instanceID); err != nil {
		return "", fmt.Errorf("lifecycle: serve principal: %w", err)
	}
	return space.PrincipalKey(owner, "manager_serve_"+instanceID)
}

// ProofPayload returns the registration proof's payload, byte for byte upstream's
// JSON.stringify of
//
//	{v:1, kind:"manager-current-registration", space, owner, actor, instanceId, lifecycleUid,
//	 actors{supervisor, executor, serve, goalWriter, sessionLedger},
//	 identities{<same keys>:{id}}, registrationRevision, processEpoch}
//
// in that key order and with no HTML escaping. It refuses a registration with a field outside
// its grammar: the space name (pkg/space), owner and actor tokens, uid-grammar instance id and
// lifecycle uid, nkey-shaped identities ('U' and 55 of [A-Z2-7]), and integers above
// MaxSafeInteger. The proof itself is signerd's Mac of this payload in ProofDomain; only authd
// asks for it.
func ProofPayload(r Registration) ([]byte, error) {
	if err := space.ValidateName(r.Space); err != nil {
		return nil, fmt.Errorf("lifecycle: proof payload: %w", err)
	}
	if _, err := space.PrincipalKey(r.Owner, r.Actor); err != nil {
		return nil, fmt.Errorf("lifecycle: proof payload: %w", err)
	}
	if err := space.ValidateUID(r.LifecycleUID); err != nil {
		return nil, fmt.Errorf("lifecycle: proof payload: %w", err)
	}
	actors, err := ManagerActors(r.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: proof payload: %w", err)
	}
	ids := [5]string{r.Identities.Supervisor, r.Identities.Executor, r.Identities.Serve,
		r.Identities.GoalWriter, r.Identities.SessionLedger}
	for i, id := range ids {
		if !isUserNkeyShape(id) {
			return nil, fmt.Errorf("lifecycle: proof payload: identity %s %q is not 'U' and 55 of [A-Z2-7]", actorKeys[i].key, clip(id))
		}
	}
	if r.RegistrationRevision > MaxSafeInteger || r.ProcessEpoch > MaxSafeInteger {
		return nil, errors.New("lifecycle: proof payload: registration revision or process epoch above 2^53-1")
	}
	b := make([]byte, 0, 1024)
	b = append(b, `{"v":1,"kind":"manager-current-registration","space":`...)
	b = jsjson.AppendString(b, r.Space)
	b = append(b, `,"owner":`...)
	b = jsjson.AppendString(b, r.Owner)
	b = append(b, `,"actor":`...)
	b = jsjson.AppendString(b, r.Actor)
	b = append(b, `,"instanceId":`...)
	b = jsjson.AppendString(b, r.InstanceID)
	b = append(b, `,"lifecycleUid":`...)
	b = jsjson.AppendString(b, r.LifecycleUID)
	b = append(b, `,"actors":{`...)
	for i, a := range actorKeys {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsjson.AppendString(b, a.key)
		b = append(b, ':')
		b = jsjson.AppendString(b, actors[i])
	}
	b = append(b, `},"identities":{`...)
	for i, a := range actorKeys {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsjson.AppendString(b, a.key)
		b = append(b, `:{"id":`...)
		b = jsjson.AppendString(b, ids[i])
		b = append(b, '}')
	}
	b = append(b, `},"registrationRevision":`...)
	b = strconv.AppendUint(b, r.RegistrationRevision, 10)
	b = append(b, `,"processEpoch":`...)
	b = strconv.AppendUint(b, r.ProcessEpoch, 10)
	return append(b, '}'), nil
}

// IsProof reports whether s has a proof's shape: ProofPrefix and 64 lower-case hex characters.
func IsProof(s string) bool {
	if len(s) != len(ProofPrefix)+64 || s[:len(ProofPrefix)] != ProofPrefix {
		return false
	}
	for i := len(ProofPrefix); i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// ProofEqual reports whether a presented proof equals the one recomputed for the current
// registration, in time independent of where they differ. A value without a proof's shape never
// equals: verify by recomputing the proof (signerd's Mac of ProofPayload) and comparing with this.
func ProofEqual(presented, recomputed string) bool {
	if !IsProof(presented) || !IsProof(recomputed) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(presented), []byte(recomputed)) == 1
}

func isUserNkeyShape(s string) bool {
	if len(s) != 56 || s[0] != 'U' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}
