// Package serviceaccess is the wire floor of service endpoint access (seed 002): the
// /service-endpoint-authority envelope ({request, proof}) and its answers, the registration
// contract (closures and artifacts), the witness, and the service token claims with their one
// shared validator. authd's route and callout, pkg/authclient's Provider and pkg/serve all
// parse and check through this package, so the two sides cannot drift.
//
// Every parser is closed: an unknown or duplicated key, a key in another case, trailing data or
// a value outside its grammar is refused with an error that names the field and never holds
// token text. Every parser is fuzzed.
package serviceaccess
