// Package lifecycle is the closed grammar of Cotal's managed-lifecycle authority: the keys and
// rows authd keeps in a space's records bucket (cotal_records_<t>) and auth bucket
// (cotal_auth_<t>), the opIds that name its operations, the hosted runtime key, and the manager
// registration proof payload. It reads and writes no store: it builds, parses, encodes and
// decodes, and everything that moves a row (activation, the retirement barrier, registration)
// lives with its executor in authd.
//
// Keys. Records bucket: the head lifecycle.<owner>.<actor> (HeadKey), the uid reservation
// uid.<uid> (UIDKey), the retirement frontier frontier.<uid> (FrontierKey) and an endpoint
// instance's spec svc.<endpoint token>.<instanceId> (SpecKey). Auth bucket: the issuance gate
// gate.<uid> (GateKey), an operation's intent stage.<opId> (StageKey) and the endpoint gate
// epgate.<endpoint token>.<instanceId> (EndpointGateKey), one family for every endpoint; the
// manager is endpoint "manager" (ManagerEndpoint). Owners and actors follow pkg/space's token
// grammar, uids, instance ids and opIds its uid grammar, and an endpoint name is dotted
// DNS-shaped labels whose token joins them with '_' (EndpointToken). Each builder refuses a value
// outside its grammar rather than rewrite it; each Parse function refuses a key this package
// could not have built (ErrBadKey).
//
// Rows. Each row type (Head, Reservation, Frontier, Spec, Gate, EndpointGate, Stage) has an
// Encode function that validates it and writes its one canonical form, {"v":1,...} with the
// fields in a fixed order and no HTML escaping, and a Decode function that takes the key it was
// read at. A decoder refuses, with an error wrapping ErrCorrupt: more than MaxRowBytes, another
// version, an unknown, missing, null, duplicate or re-cased field, a wrong type, trailing data,
// any byte that differs from the canonical encoding, a state outside its set, an op where the
// state forbids one or none where it requires one, an op that is not the uid's own (a retiring
// head, a gate under a retirement, a frontier and a stage key carry ManagedRetirementOpID(uid); a
// gate under its activation carries ActivationOpID(uid) at generation 0), an open gate at
// generation 0, an endpoint gate retired by anything but a retirement, integers above 2^53-1,
// and a row that names another alias, uid or endpoint instance than its key. Corruption is never
// read as absence.
//
// OpIds. ManagedRetirementOpID, InteractiveRetirementOpID and ActivationOpID are the first 26 hex
// characters of SHA-256 of "retire:", "interactive-retire:" and "activate:" followed by the uid:
// pure functions of the uid, so a retry, a second caller or a restarted authd adopts the same
// operation. ManagedRuntimeKey is upstream's hosted runtime key for a (space, owner, actor, uid).
//
// Manager lease and registration. ManagerLease is managerd's lease.<instanceId> row in the manager
// bucket (LeaseKey), upstream's row plus the optional processEpoch and registrationRevision of the
// start authd registered; authd reads it to admit a register-manager request from its holder only.
// RegistrationOpID names the freeze a re-registration puts on an endpoint gate (ours: a pure
// function of the gate's endpoint instance and epoch, so a crashed registration's freeze is
// adopted). The register-manager rail's closed request and answer are EncodeRegisterManagerRequest
// and DecodeRegisterManagerReply and their inverses; the retire-lifecycle rail's are
// EncodeRetireLifecycleRequest and DecodeRetireLifecycleReply and theirs (a request body key
// given twice is refused too, and an answer's opId must be its uid's managed retirement).
//
// Registration proof. ProofPayload builds the exact bytes upstream's
// remoteManagerCurrentRegistrationProof MACs. The proof is signerd's Mac of that payload in
// ProofDomain ("sha256:" and 64 hex characters); only authd asks signerd for it, and it verifies a
// presented proof by recomputing it and comparing with ProofEqual (constant time).
package lifecycle
