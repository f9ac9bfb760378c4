// Package keystore is signerd's key custody: the only package in the project that turns seed
// files into signing keys. It defines the on-disk layout that `signerd init` writes and
// `signerd serve` reads, checks every secret file before reading it (0600, in a 0700 directory,
// owned by signerd's uid; anything looser refuses start-up naming the path), parses each seed
// once into an in-memory key that signs but never exports, and wipes every key on Close.
//
// # What is wiped
//
// Each secret file is read into one buffer, decoded straight from it (creds.UseSeedFile for
// seeds; this package's own strict PEM, PKCS#8 and base64 parsing for the rest, because
// encoding/pem, x509 and nkeys make copies nobody can reach to wipe), and the buffer and every
// intermediate one are zeroed as soon as the key is derived. The cached keys are the only copies
// left, public keys are computed from them, and Close zeroes them. What remains outside this
// package's reach, all documented where it happens: crypto/ed25519's cache of the expanded form
// of each key that has signed (SigningKey.Sign), crypto/ecdh's copy of the xkey scalar per box
// opened or sealed (curveKey), and crypto/hmac's key pads per owner derivation or MAC.
//
// # Layout
//
// The signer directory (config key_dir, or $CREDENTIALS_DIRECTORY under systemd) holds, per
// space, with <seg> = space.<hex of the name>:
//
//	<key_dir>/<seg>/data-signing.nk   data-account signing seed (SA…): signs data-account users
//	<key_dir>/<seg>/auth-signing.nk   callout-account signing seed (SA…): callout and sentinel users,
//	                                  authorization responses
//	<key_dir>/<seg>/xkey.nk           callout xkey seed (SX…): opens sealed callout requests
//	<key_dir>/<seg>/issuer.key        bearer issuer Ed25519 key, PKCS#8 PEM
//	<key_dir>/<seg>/owner-secret      32-byte owner-derivation secret, base64
//	<key_dir>/<seg>/mac.key           32-byte registration-proof MAC key, base64
//
// Under systemd the same files arrive flat through LoadCredential=, named <seg>.<file> (for
// example space.616c706861.data-signing.nk), because credential names cannot hold a '/'.
//
// The public directory holds what signerd needs to know but need not keep secret:
//
//	<public_dir>/broker.json          operator and system account JWTs
//	<public_dir>/<seg>.json           a space's account JWTs, keys and sentinel JWT
//
// A space is served only if its public facts and its signing keys agree (trust.Space
// VerifySigningKeys, on the public keys of the derived keys): a key directory from another space
// or broker is refused. The facts file's plain
// fields (keys, token, callout users) must also equal what its account JWTs say, and its
// sentinel must be the callout account's deny-all bearer user, because GetSpace serves them.
package keystore
