package creds_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/cotalgo/cotal/pkg/creds"
)

func newUserSeed(t *testing.T) (*creds.Seed, string, []byte) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	raw = append([]byte(nil), raw...)
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return creds.NewSeed(raw), pub, raw
}

func TestSeedKeyPairAndPublic(t *testing.T) {
	s, pub, _ := newUserSeed(t)
	got, err := s.Public()
	if err != nil || got != pub {
		t.Fatalf("Public() = %q, %v; want %q", got, err, pub)
	}
	kp, err := s.KeyPair()
	if err != nil {
		t.Fatal(err)
	}
	defer kp.Wipe()
	sig, err := kp.Sign([]byte("msg"))
	if err != nil {
		t.Fatal(err)
	}
	vk, err := nkeys.FromPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := vk.Verify([]byte("msg"), sig); err != nil {
		t.Fatalf("signature from KeyPair does not verify: %v", err)
	}
	p, err := s.Prefix()
	if err != nil || p != nkeys.PrefixByteUser {
		t.Fatalf("Prefix() = %v, %v; want user", p, err)
	}
}

func TestNewSeedCopies(t *testing.T) {
	s, pub, raw := newUserSeed(t)
	clear(raw) // the caller wiping its buffer must not affect the Seed
	got, err := s.Public()
	if err != nil || got != pub {
		t.Fatalf("Public() after wiping the caller's buffer = %q, %v; want %q", got, err, pub)
	}
}

func TestSeedWipe(t *testing.T) {
	s, _, _ := newUserSeed(t)
	var held []byte
	if err := s.Use(func(b []byte) error { held = b; return nil }); err != nil {
		t.Fatal(err)
	}
	s.Wipe()
	if !bytes.Equal(held, make([]byte, len(held))) {
		t.Fatalf("Wipe left non-zero bytes in the seed buffer")
	}
	for name, f := range map[string]func() error{
		"KeyPair": func() error { _, err := s.KeyPair(); return err },
		"Public":  func() error { _, err := s.Public(); return err },
		"Prefix":  func() error { _, err := s.Prefix(); return err },
		"Use":     func() error { return s.Use(func([]byte) error { return nil }) },
	} {
		if err := f(); !errors.Is(err, creds.ErrNoSeed) {
			t.Errorf("%s after Wipe: err = %v, want ErrNoSeed", name, err)
		}
	}
	var nilSeed *creds.Seed
	nilSeed.Wipe() // must not panic
	if _, err := nilSeed.Public(); !errors.Is(err, creds.ErrNoSeed) {
		t.Errorf("nil Seed Public: err = %v, want ErrNoSeed", err)
	}
}

func TestSeedInvalid(t *testing.T) {
	s := creds.NewSeed([]byte("SUnot-a-seed"))
	if _, err := s.KeyPair(); err == nil || errors.Is(err, creds.ErrNoSeed) {
		t.Fatalf("KeyPair of garbage: err = %v, want an invalid-seed error", err)
	} else if strings.Contains(err.Error(), "SUnot") {
		t.Fatalf("error quotes the seed: %v", err)
	}
}

type holder struct {
	Name  string
	Seed  *creds.Seed
	Value creds.Seed
}

func TestSeedRedaction(t *testing.T) {
	s, _, raw := newUserSeed(t)
	secret := string(raw)
	h := holder{Name: "x", Seed: s, Value: *s}

	tests := []struct {
		name string
		out  func() string
	}{
		{"ok/%v", func() string { return fmt.Sprintf("%v", s) }},
		{"ok/%+v", func() string { return fmt.Sprintf("%+v", s) }},
		{"ok/%#v", func() string { return fmt.Sprintf("%#v", s) }},
		{"ok/%s", func() string { return fmt.Sprintf("%s", s) }},
		{"ok/%q", func() string { return fmt.Sprintf("%q", s) }},
		{"ok/%x", func() string { return fmt.Sprintf("%x", s) }},
		{"ok/%d", func() string { return fmt.Sprintf("%d", s) }},
		{"ok/value %v", func() string { return fmt.Sprintf("%v", *s) }},
		{"ok/struct %v", func() string { return fmt.Sprintf("%v", h) }},
		{"ok/struct %+v", func() string { return fmt.Sprintf("%+v", h) }},
		{"ok/struct %#v", func() string { return fmt.Sprintf("%#v", h) }},
		{"ok/struct ptr %+v", func() string { return fmt.Sprintf("%+v", &h) }},
		{"ok/Sprint", func() string { return fmt.Sprint(s, *s) }},
		{"ok/String", func() string { return s.String() }},
		{"ok/GoString", func() string { return s.GoString() }},
		{"ok/slog json", func() string {
			var buf bytes.Buffer
			slog.New(slog.NewJSONHandler(&buf, nil)).Info("m", "seed", s, "value", *s, "holder", h)
			return buf.String()
		}},
		{"ok/slog text", func() string {
			var buf bytes.Buffer
			slog.New(slog.NewTextHandler(&buf, nil)).Info("m", "seed", s, slog.Any("value", *s), "holder", h)
			return buf.String()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.out()
			if strings.Contains(got, secret) || strings.Contains(got, secret[:10]) {
				t.Fatalf("output leaks the seed: %s", got)
			}
			if !strings.Contains(got, creds.Redacted) {
				t.Fatalf("output %q does not say %s", got, creds.Redacted)
			}
		})
	}
}

func TestSeedRefusesSerialisation(t *testing.T) {
	s, _, raw := newUserSeed(t)
	tests := []struct {
		name string
		v    any
	}{
		{"fail/json pointer", s},
		{"fail/json value", *s},
		{"fail/json struct", holder{Seed: s}},
		{"fail/json map value", map[string]*creds.Seed{"k": s}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := json.Marshal(tt.v)
			if !errors.Is(err, creds.ErrSerialize) {
				t.Fatalf("json.Marshal = %q, %v; want ErrSerialize", out, err)
			}
			if bytes.Contains(out, raw) {
				t.Fatalf("json output leaks the seed")
			}
		})
	}
	if out, err := s.MarshalText(); !errors.Is(err, creds.ErrSerialize) || out != nil {
		t.Fatalf("MarshalText = %q, %v; want nil, ErrSerialize", out, err)
	}
}
