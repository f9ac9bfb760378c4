// Package serve is the service side of service endpoint access (seed 002, "Verified serving
// grant"): it turns the authority's credential answer into a process-local serving grant and
// serves an endpoint instance on the broker with it.
//
// ServeAuthenticityOf pins the issuer and keys of the authority's GET answer (the pinned
// authority URL's serviceEndpointInfo); it refuses an answer that does not publish them yet, so
// a service never serves on a bearer it cannot verify. AuthorizeGuestServeGrant is the sole
// constructor of a Grant: it verifies the access bearer with the shared serviceaccess.Validator
// under the pinned keys (EdDSA under the key its kid names, closed claims, iat at most five
// seconds ahead, no grace on exp) and binds the closure to the service's own embedded contract,
// not to the bearer. It refuses another account, a bearer from another issuer, space, subject
// or key, one naming another witness, instance, root or no serve duty, a closure set or artifact
// that is not the embedded one, and a closure that does not read at its digest. A bearer issued
// more than five seconds ahead of the process clock is a *ServiceAccessNotYetValidError, which
// unwraps to an *EpEnvelopeError with code permission-denied. No error holds token text.
//
// ServeEndpoint connects with the grant's bearer (the space's sentinel JWT as user JWT, the
// bearer as auth token), binds the responder on cotal.<t>.sep.<epTok>.<iid>.>, flushes and
// calls Ready once; before each bearer expires (at a random point in 50-80 % of its life) it
// pulls a fresh bearer, checks it with the grant, binds a new connection and only then drains
// the old one. A request whose reply subject is outside cotal.<t>.sep.reply.<epTok>.<iid>.> is
// dropped and counted. Every bearer it presents has passed the grant's Check.
//
// The trusted-snapshot check (authorizeTrustedServeSnapshot) stays in authd.
package serve
