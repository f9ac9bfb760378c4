package keystore

// OpenWithWipedKeyForTest opens with the space's xkey directly, bypassing the closed check, so a
// test can show the wiped key itself no longer opens what it sealed.
func OpenWithWipedKeyForTest(sp *Space, sealed []byte, sender string) ([]byte, error) {
	return sp.xkey.Open(sealed, sender)
}
