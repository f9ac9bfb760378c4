// Package serviceaccess is the wire floor of service endpoint access (seed 002): the
// /service-endpoint-authority envelope ({request, proof}) and its answers, the registration
// contract (closures and artifacts), the witness, and the service token claims with their one
// shared validator. authd's route and callout, pkg/authclient's Provider and pkg/serve all
// parse and check through this package, so the two sides cannot drift.
//
// Every parser is closed: an unknown or duplicated key, a key in another case (encoding/json
// would match it case-insensitively; these parsers look keys up by their exact spelling),
// trailing data, null where a value is required, a value of another type, an integer with a
// sign, fraction or exponent or above 2^53-1, or a value outside its grammar is refused with an
// *Error that names the field and never holds token text. ParseEnvelope additionally refuses a
// request field of another kind and a missing one, a contract Contract.Check refuses, and a
// proof token where the proof kind carries none; ParseAnswer a field of another answer kind and
// a registered snapshot that is not the canonical bytes of its witness; ParseInfo an issuer
// other than Issuer(space) and a key that is not an Ed25519 signing key under its thumbprint
// kid.
//
// Validator refuses a service token with a *TokenError naming the failed step: not three
// unpadded base64url segments or over MaxTokenBytes; a header other than exactly
// {alg:"EdDSA", kid, typ}; a typ other than the kind's (so no kind passes as another, and a user
// bearer, typ "JWT", as neither); a kid the KeySource does not resolve; a bad signature; a
// payload other than exactly its kind's keys; iss, aud (a string only), sub, duty or use, ver,
// wit, ep, iid, root or jti off their values or grammars; iat or nbf more than
// IssuedAtTolerance ahead (wrapping ErrNotYetValid); exp not after now (no tolerance); a
// lifetime exp-iat of zero or less or over the kind's cap.
//
// Every parser is fuzzed (fuzz_test.go), and the package links no daemon and no NATS client or
// server (deps_test.go).
package serviceaccess
