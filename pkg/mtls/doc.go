// Package mtls builds the mutual-TLS configurations signerd and its callers use, extracts the
// caller identity from a verified client certificate, reloads certificates and CA bundles when
// their files change, and writes the development PKI that `signerd pki init` lays down.
//
// A caller is named by the single URI SAN of its verified leaf certificate, a SPIFFE ID such as
// spiffe://cotal.local/authd/<space-token>. Nothing else in a certificate (common name, DNS
// names, unverified peer certificates) is ever taken as an identity. Servers require TLS 1.3
// and a client certificate verified against a dedicated client CA; anything else is refused
// at the handshake.
package mtls
