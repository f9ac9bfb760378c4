package creds

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/nats-io/nkeys"
)

// seedText returns a fresh encoded seed of the kind create makes, with its public key.
func seedText(t testing.TB, create func() (nkeys.KeyPair, error)) ([]byte, string) {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(seed), pub
}

// TestDecodeSeed is finding 9's seed decoder: every kind nkeys makes decodes to what nkeys
// decodes, and anything but the canonical text (which nkeys.DecodeSeed partly accepts) is refused.
func TestDecodeSeed(t *testing.T) {
	creates := map[string]func() (nkeys.KeyPair, error){
		"account": nkeys.CreateAccount, "user": nkeys.CreateUser, "operator": nkeys.CreateOperator,
		"curve": nkeys.CreateCurveKeys, "server": nkeys.CreateServer, "cluster": nkeys.CreateCluster,
	}
	for name, create := range creates {
		t.Run("ok/"+name, func(t *testing.T) {
			text, pub := seedText(t, create)
			wantKind, wantRaw, err := nkeys.DecodeSeed(text)
			if err != nil {
				t.Fatal(err)
			}
			var kept []byte
			err = DecodeSeed(text, func(kind nkeys.PrefixByte, raw []byte) error {
				if kind != wantKind || !bytes.Equal(raw, wantRaw) {
					t.Errorf("decoded %s %x, nkeys decodes %s %x", kind, raw, wantKind, wantRaw)
				}
				got, err := PublicKey(kind, raw)
				if err != nil || got != pub {
					t.Errorf("PublicKey = %q, %v; want %q", got, err, pub)
				}
				kept = raw
				return nil
			})
			if err != nil {
				t.Fatalf("DecodeSeed: %v", err)
			}
			if !bytes.Equal(kept, make([]byte, RawSeedLen)) {
				t.Fatal("the raw seed handed to f was not wiped after f returned")
			}
		})
	}

	account, _ := seedText(t, nkeys.CreateAccount)
	last := len(account) - 1
	// The last character carries three bits of the CRC and two unused bits: setting an unused
	// bit changes the text but not what Go's base32 decoder (and so nkeys) reads.
	strayBits := slices.Clone(account)
	strayBits[last] = b32Alphabet[strings.IndexByte(b32Alphabet, account[last])|1]
	if strayBits[last] == account[last] {
		strayBits[last] = b32Alphabet[strings.IndexByte(b32Alphabet, account[last])&^1]
	}
	badCRC := slices.Clone(account)
	badCRC[last-2] = b32Alphabet[(strings.IndexByte(b32Alphabet, account[last-2])+1)%32]
	_, accountPub := seedText(t, nkeys.CreateAccount)
	for _, tt := range []struct {
		name string
		text []byte
	}{
		{"fail/trailing-newline", append(slices.Clone(account), '\n')},
		{"fail/inner-crlf", slices.Concat(account[:20], []byte("\r\n"), account[20:])},
		{"fail/lower-case", bytes.ToLower(account)},
		{"fail/padding", append(slices.Clone(account), "======"...)},
		{"fail/stray-trailing-bits", strayBits},
		{"fail/bad-crc", badCRC},
		{"fail/public-key", []byte(accountPub)},
		{"fail/truncated", account[:last]},
		{"fail/empty", nil},
		{"fail/private-key-kind", mustEncodeSeedish(t)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			err := DecodeSeed(tt.text, func(nkeys.PrefixByte, []byte) error { called = true; return nil })
			if !errors.Is(err, ErrSeedEncoding) || called {
				t.Fatalf("DecodeSeed = %v (f called %v), want ErrSeedEncoding", err, called)
			}
			if len(tt.text) > 8 && strings.Contains(err.Error(), string(tt.text[:8])) {
				t.Fatal("the error quotes the input")
			}
		})
	}
}

const b32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// mustEncodeSeedish encodes a seed whose kind byte is the private-key prefix, which no seed has:
// the same layout as a seed, valid CRC, unknown kind.
func mustEncodeSeedish(t *testing.T) []byte {
	t.Helper()
	bin := make([]byte, binarySeedLen)
	kind := byte(nkeys.PrefixBytePrivate)
	bin[0] = byte(nkeys.PrefixByteSeed) | kind>>5
	bin[1] = (kind & 31) << 3
	crc := crc16(bin[:binarySeedLen-2])
	bin[binarySeedLen-2], bin[binarySeedLen-1] = byte(crc), byte(crc>>8)
	var out []byte
	acc, bits := uint32(0), 0
	for _, b := range bin {
		acc = acc<<8 | uint32(b)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out = append(out, b32Alphabet[acc>>bits&31])
		}
	}
	out = append(out, b32Alphabet[acc<<(5-bits)&31])
	if len(out) != encodedSeedLen {
		t.Fatalf("encoded %d characters", len(out))
	}
	return out
}

// FuzzDecodeSeed checks the seed decoder against nkeys: whatever it accepts, nkeys decodes to
// the same kind and bytes and re-encodes to exactly the input (canonical round trip); whatever
// nkeys decodes and re-encodes to the input, it accepts too.
func FuzzDecodeSeed(f *testing.F) {
	for _, create := range []func() (nkeys.KeyPair, error){nkeys.CreateAccount, nkeys.CreateUser, nkeys.CreateOperator, nkeys.CreateCurveKeys} {
		text, pub := seedText(f, create)
		f.Add(text)
		f.Add([]byte(pub))
		f.Add(append(slices.Clone(text), '\n'))
	}
	f.Add([]byte(""))
	f.Add([]byte("SAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"))
	f.Fuzz(func(t *testing.T, text []byte) {
		var gotKind nkeys.PrefixByte
		var gotRaw []byte
		err := DecodeSeed(text, func(kind nkeys.PrefixByte, raw []byte) error {
			gotKind, gotRaw = kind, bytes.Clone(raw)
			return nil
		})
		wantKind, wantRaw, nerr := nkeys.DecodeSeed(text)
		canonical := false
		if nerr == nil {
			enc, eerr := nkeys.EncodeSeed(wantKind, wantRaw)
			canonical = eerr == nil && bytes.Equal(enc, text)
		}
		switch {
		case err == nil && !canonical:
			t.Fatalf("accepted a text nkeys does not decode to itself (nkeys: %v)", nerr)
		case err == nil && (gotKind != wantKind || !bytes.Equal(gotRaw, wantRaw)):
			t.Fatalf("decoded %s %x, nkeys %s %x", gotKind, gotRaw, wantKind, wantRaw)
		case err != nil && canonical:
			t.Fatalf("refused a canonical seed nkeys decodes: %v", err)
		case err != nil && !errors.Is(err, ErrSeedEncoding):
			t.Fatalf("error %v is not ErrSeedEncoding", err)
		}
	})
}

// TestSeedFileBuffersWiped is finding 9's file path: the bytes read from an .nk file are zeroed
// once the seed is decoded, whether it is accepted or refused, and the raw seed handed to
// UseSeedFile's callback is zeroed when it returns.
func TestSeedFileBuffersWiped(t *testing.T) {
	text, pub := seedText(t, nkeys.CreateAccount)
	zero := func(t *testing.T, what string, b []byte) {
		t.Helper()
		if len(b) == 0 || !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("%s not zeroed", what)
		}
	}
	t.Run("ok/parse-wipes-file-bytes", func(t *testing.T) {
		data := append(slices.Clone(text), '\n')
		s, err := parseSeedFile("x.nk", data)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Wipe()
		zero(t, "file bytes", data)
		if got, err := s.Public(); err != nil || got != pub {
			t.Fatalf("Public = %q, %v; want %q", got, err, pub)
		}
	})
	t.Run("ok/use-wipes-file-bytes-then-raw", func(t *testing.T) {
		data := append([]byte("  "), append(slices.Clone(text), '\n')...)
		var raw []byte
		err := useSeedFile("x.nk", data, func(kind nkeys.PrefixByte, r []byte) error {
			zero(t, "file bytes while the key is derived", data)
			if p, err := PublicKey(kind, r); err != nil || p != pub {
				t.Errorf("PublicKey = %q, %v; want %q", p, err, pub)
			}
			raw = r
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		zero(t, "raw seed after the callback", raw)
	})
	t.Run("fail/refused-file-bytes-wiped", func(t *testing.T) {
		for _, data := range [][]byte{slices.Concat(text[:20], []byte("\n"), text[20:]), []byte("not a seed at all")} {
			if _, err := parseSeedFile("x.nk", data); err == nil {
				t.Fatal("parseSeedFile accepted a non-canonical seed")
			}
			zero(t, "refused file bytes", data)
			data2 := slices.Clone(data)
			if err := useSeedFile("x.nk", data2, func(nkeys.PrefixByte, []byte) error { return nil }); err == nil {
				t.Fatal("useSeedFile accepted a non-canonical seed")
			}
			zero(t, "refused file bytes", data2)
		}
	})
}

// recordingReader hands out r's bytes a few at a time and remembers every buffer it was asked
// to fill, so a test can check what the reader's caller left behind in them.
type recordingReader struct {
	r    io.Reader
	bufs [][]byte
}

func (rr *recordingReader) Read(p []byte) (int, error) {
	rr.bufs = append(rr.bufs, p[:cap(p)])
	return rr.r.Read(p)
}

// TestReadWipingLeavesNoCopy is finding 9's file read: when a secret file turns out larger than
// its size said, the buffers outgrown are zeroed; only the returned one holds the content.
func TestReadWipingLeavesNoCopy(t *testing.T) {
	secret := bytes.Repeat([]byte("SECRET-"), 300) // 2100 bytes: the buffer grows from 512 three times
	rr := &recordingReader{r: iotest.HalfReader(bytes.NewReader(secret))}
	got, err := readWiping(rr, 10)
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("readWiping = %d bytes, %v", len(got), err)
	}
	outgrown := 0
	for _, b := range rr.bufs {
		if &b[:cap(b)][cap(b)-1] == &got[:cap(got)][cap(got)-1] {
			continue // a window into the returned buffer
		}
		outgrown++
		if !bytes.Equal(b, make([]byte, len(b))) {
			t.Fatalf("an outgrown read buffer of %d bytes still holds content", cap(b))
		}
	}
	if outgrown == 0 {
		t.Fatal("the buffer never grew: the test does not exercise growth")
	}

	t.Run("fail/too-large-wiped", func(t *testing.T) {
		rr := &recordingReader{r: io.LimitReader(iotest.HalfReader(repeatReader('S')), MaxSecretFileSize+10)}
		if _, err := readWiping(rr, 10); err == nil {
			t.Fatal("readWiping accepted more than MaxSecretFileSize")
		}
		for _, b := range rr.bufs {
			if bytes.IndexByte(b, 'S') >= 0 {
				t.Fatalf("a read buffer of %d bytes still holds content after the refusal", cap(b))
			}
		}
	})
}

type repeatReader byte

func (r repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
