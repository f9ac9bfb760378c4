package keystore

// OpenWithWipedKeyForTest opens with the space's xkey directly, bypassing the closed check, so a
// test can show the wiped key itself no longer opens what it sealed.
func OpenWithWipedKeyForTest(sp *Space, sealed []byte, sender string) ([]byte, error) {
	return sp.xkey.Open(sealed, sender)
}

// KeyMaterialForTest returns the buffers that hold sp's secrets, by name, so a test can see
// that Close zeroes them. They alias the Space's own buffers.
func KeyMaterialForTest(sp *Space) map[string][]byte {
	m := map[string][]byte{"issuer": sp.issuer, "owner secret": sp.ownerSecret, "MAC key": sp.macKey}
	if sp.DataSigning != nil {
		m["data signing"] = sp.DataSigning.priv
	}
	if sp.AuthSigning != nil {
		m["auth signing"] = sp.AuthSigning.priv
	}
	if sp.xkey != nil {
		m["xkey"] = sp.xkey.seed[:]
	}
	return m
}

// XKeyPublicForTest returns the public key of sp's cached xkey.
func XKeyPublicForTest(sp *Space) string { return sp.xkey.Public() }
