package keystore

import (
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/nkey"
)

// ErrNoXKey is returned by OpenCallout and SealCallout on a Space that holds no callout xkey
// (a zero Space, not one made by Open).
var ErrNoXKey = errors.New("keystore: space holds no callout xkey")

// XKeyError says which callout xkey operation failed and with which peer key. The peer key is a
// server's public curve key, never a secret, so the error may name it.
type XKeyError struct {
	// Op is "open" or "seal".
	Op string
	// Space is the space whose xkey was used.
	Space string
	// Peer is the server's curve public key the box was meant to come from or go to.
	Peer string
	// Err is the nkeys cause (for example nkeys.ErrCouldNotDecrypt or nkeys.ErrInvalidSender).
	Err error
}

func (e *XKeyError) Error() string {
	return fmt.Sprintf("keystore: space %q: %s callout box with server xkey %.64q: %v", e.Space, e.Op, e.Peer, e.Err)
}

// Unwrap returns the nkeys cause.
func (e *XKeyError) Unwrap() error { return e.Err }

// OpenCallout opens an authorization request that a NATS server sealed to this space's callout
// xkey; serverXKey is the server's curve public key (the Nats-Server-Xkey header). It refuses a
// serverXKey that is not a curve public key, a box not sealed by that server to this xkey, and
// any box that fails authentication. The xkey itself never leaves the keystore.
func (sp *Space) OpenCallout(sealed []byte, serverXKey string) ([]byte, error) {
	if sp.xkey == nil {
		return nil, ErrNoXKey
	}
	if sp.isClosed() {
		return nil, ErrSpaceClosed
	}
	if !nkey.IsCurve(serverXKey) {
		return nil, &XKeyError{Op: "open", Space: sp.Name, Peer: serverXKey, Err: nkeys.ErrInvalidSender}
	}
	data, err := sp.xkey.Open(sealed, serverXKey)
	if err != nil {
		return nil, &XKeyError{Op: "open", Space: sp.Name, Peer: serverXKey, Err: err}
	}
	return data, nil
}

// SealCallout seals data (an authorization response JWT) from this space's callout xkey to the
// server's curve public key serverXKey, so that only that server can open it. It refuses a
// serverXKey that is not a curve public key.
func (sp *Space) SealCallout(data []byte, serverXKey string) ([]byte, error) {
	if sp.xkey == nil {
		return nil, ErrNoXKey
	}
	if sp.isClosed() {
		return nil, ErrSpaceClosed
	}
	if !nkey.IsCurve(serverXKey) {
		return nil, &XKeyError{Op: "seal", Space: sp.Name, Peer: serverXKey, Err: nkeys.ErrInvalidRecipient}
	}
	out, err := sp.xkey.Seal(data, serverXKey)
	if err != nil {
		return nil, &XKeyError{Op: "seal", Space: sp.Name, Peer: serverXKey, Err: err}
	}
	return out, nil
}
