package mtls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

func TestParseID(t *testing.T) {
	tests := []struct {
		name, in   string
		wantTD     string
		wantPath   string
		wantReason string // substring of IDError.Reason; empty means success
	}{
		{name: "ok/authd", in: "spiffe://cotal.local/authd/space_1-x", wantTD: "cotal.local", wantPath: "/authd/space_1-x"},
		{name: "ok/signerd", in: "spiffe://cotal.local/signerd", wantTD: "cotal.local", wantPath: "/signerd"},
		{name: "ok/dots-in-segment", in: "spiffe://td/a.b/c", wantTD: "td", wantPath: "/a.b/c"},
		{name: "fail/empty", in: "", wantReason: "scheme"},
		{name: "fail/https", in: "https://cotal.local/authd/x", wantReason: "scheme"},
		{name: "fail/upper-scheme", in: "SPIFFE://cotal.local/authd/x", wantReason: "scheme"},
		{name: "fail/no-path", in: "spiffe://cotal.local", wantReason: "no path"},
		{name: "fail/root-path", in: "spiffe://cotal.local/", wantReason: "empty path"},
		{name: "fail/empty-td", in: "spiffe:///authd/x", wantReason: "empty trust domain"},
		{name: "fail/userinfo", in: "spiffe://u@cotal.local/authd/x", wantReason: "userinfo"},
		{name: "fail/port", in: "spiffe://cotal.local:8443/authd/x", wantReason: "port"},
		{name: "fail/query", in: "spiffe://cotal.local/authd/x?y=1", wantReason: "query"},
		{name: "fail/fragment", in: "spiffe://cotal.local/authd/x#y", wantReason: "fragment"},
		{name: "fail/upper-td", in: "spiffe://Cotal.local/authd/x", wantReason: "lower case"},
		{name: "fail/trailing-slash", in: "spiffe://cotal.local/authd/", wantReason: "trailing slash"},
		{name: "fail/double-slash", in: "spiffe://cotal.local/authd//x", wantReason: "empty path segment"},
		{name: "fail/dot", in: "spiffe://cotal.local/authd/./x", wantReason: `"."`},
		{name: "fail/dotdot", in: "spiffe://cotal.local/authd/../signerd", wantReason: `".."`},
		{name: "fail/percent", in: "spiffe://cotal.local/authd/%41", wantReason: "percent"},
		{name: "fail/space-char", in: "spiffe://cotal.local/authd/a b", wantReason: "outside"},
		{name: "fail/too-long", in: "spiffe://td/" + strings.Repeat("a", maxIDLen), wantReason: "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := ParseID(tt.in)
			if tt.wantReason != "" {
				var ie *IDError
				if !errors.As(err, &ie) || !errors.Is(err, ErrInvalidID) {
					t.Fatalf("ParseID(%q) error = %v, want *IDError matching ErrInvalidID", tt.in, err)
				}
				if ie.ID != tt.in || !strings.Contains(ie.Reason, tt.wantReason) {
					t.Fatalf("IDError = {ID %q, Reason %q}, want ID %q and reason containing %q", ie.ID, ie.Reason, tt.in, tt.wantReason)
				}
				if !id.IsZero() {
					t.Fatalf("ParseID(%q) returned non-zero ID %v with an error", tt.in, id)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseID(%q): %v", tt.in, err)
			}
			if id.TrustDomain() != tt.wantTD || id.Path() != tt.wantPath || id.String() != tt.in {
				t.Fatalf("ParseID(%q) = {%q %q %q}, want {%q %q %q}", tt.in, id.TrustDomain(), id.Path(), id.String(), tt.wantTD, tt.wantPath, tt.in)
			}
		})
	}
}

func TestNewID(t *testing.T) {
	tests := []struct {
		name     string
		td       string
		segments []string
		want     string
		wantErr  bool
	}{
		{name: "ok/caller", td: "cotal.local", segments: []string{"authd", "sp1"}, want: "spiffe://cotal.local/authd/sp1"},
		{name: "ok/signerd", td: "cotal.local", segments: []string{"signerd"}, want: "spiffe://cotal.local/signerd"},
		{name: "fail/no-segments", td: "cotal.local", wantErr: true},
		{name: "fail/slash-in-segment", td: "cotal.local", segments: []string{"authd", "a/b"}, wantErr: true},
		{name: "fail/empty-segment", td: "cotal.local", segments: []string{"authd", ""}, wantErr: true},
		{name: "fail/bad-td", td: "Cotal", segments: []string{"authd"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := NewID(tt.td, tt.segments...)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidID) {
					t.Fatalf("NewID error = %v, want ErrInvalidID", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id.String() != tt.want {
				t.Fatalf("NewID = %q, want %q", id, tt.want)
			}
			if got := strings.Join(id.Segments(), ","); got != strings.Join(tt.segments, ",") {
				t.Fatalf("Segments = %q, want %q", got, tt.segments)
			}
		})
	}
}

// issue issues a leaf for tests and fails the test on error.
func issue(t *testing.T, ca *CA, spec LeafSpec) *Leaf {
	t.Helper()
	if spec.NotBefore.IsZero() {
		spec.NotBefore = time.Now().Add(-time.Hour)
	}
	if spec.NotAfter.IsZero() {
		spec.NotAfter = time.Now().Add(time.Hour)
	}
	leaf, err := ca.Issue(spec)
	if err != nil {
		t.Fatalf("Issue %q: %v", spec.CommonName, err)
	}
	return leaf
}

func newTestCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	if err != nil {
		t.Fatalf("NewCA %q: %v", name, err)
	}
	return ca
}

func TestIdentityFromCert(t *testing.T) {
	ca := newTestCA(t, "test CA")
	tests := []struct {
		name    string
		uris    []string
		want    string
		wantErr error
	}{
		{name: "ok/one-spiffe-uri", uris: []string{"spiffe://cotal.local/authd/sp1"}, want: "spiffe://cotal.local/authd/sp1"},
		{name: "fail/no-uri-san", wantErr: ErrNoURISAN},
		{name: "fail/two-uri-sans", uris: []string{"spiffe://cotal.local/authd/a", "spiffe://cotal.local/authd/b"}, wantErr: ErrManyURISANs},
		{name: "fail/https-scheme", uris: []string{"https://cotal.local/authd/a"}, wantErr: ErrInvalidID},
		{name: "fail/no-path", uris: []string{"spiffe://cotal.local"}, wantErr: ErrInvalidID},
		{name: "fail/query", uris: []string{"spiffe://cotal.local/authd/a?x=1"}, wantErr: ErrInvalidID},
		{name: "fail/fragment", uris: []string{"spiffe://cotal.local/authd/a#x"}, wantErr: ErrInvalidID},
		{name: "fail/userinfo", uris: []string{"spiffe://evil@cotal.local/authd/a"}, wantErr: ErrInvalidID},
		{name: "fail/port", uris: []string{"spiffe://cotal.local:1/authd/a"}, wantErr: ErrInvalidID},
		{name: "fail/escaped-slash", uris: []string{"spiffe://cotal.local/authd%2Fa"}, wantErr: ErrInvalidID},
		{name: "fail/dotdot", uris: []string{"spiffe://cotal.local/authd/../signerd"}, wantErr: ErrInvalidID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			leaf := issue(t, ca, LeafSpec{CommonName: tt.name, URIs: tt.uris})
			got, err := IdentityFromCert(leaf.Certificate())
			if tt.wantErr != nil {
				var ce *CertError
				if !errors.Is(err, tt.wantErr) || !errors.As(err, &ce) {
					t.Fatalf("IdentityFromCert error = %v, want *CertError wrapping %v", err, tt.wantErr)
				}
				if ce.Subject != "CN="+tt.name || len(ce.URIs) != len(tt.uris) {
					t.Fatalf("CertError = %+v, want subject CN=%s and %d URIs", ce, tt.name, len(tt.uris))
				}
				if got != "" {
					t.Fatalf("IdentityFromCert returned %q with an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("IdentityFromCert = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	t.Run("fail/nil-cert", func(t *testing.T) {
		if _, err := IdentityFromCert(nil); !errors.Is(err, ErrNotVerified) {
			t.Fatalf("IdentityFromCert(nil) error = %v, want ErrNotVerified", err)
		}
	})
}

// plainAuthInfo is the AuthInfo of a connection without TLS.
type plainAuthInfo struct{}

func (plainAuthInfo) AuthType() string { return "insecure" }

func TestIdentityFromContext(t *testing.T) {
	ca := newTestCA(t, "test CA")
	leaf := issue(t, ca, LeafSpec{CommonName: "c", URIs: []string{"spiffe://cotal.local/managerd/sp"}})
	other := issue(t, ca, LeafSpec{CommonName: "u", URIs: []string{"spiffe://cotal.local/authd/forged"}})
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	withPeer := func(ai credentials.AuthInfo) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: ai})
	}
	tests := []struct {
		name    string
		ctx     context.Context
		want    string
		wantErr error
	}{
		{
			name: "ok/verified-leaf",
			ctx: withPeer(credentials.TLSInfo{State: tls.ConnectionState{
				PeerCertificates: []*x509.Certificate{leaf.Certificate()},
				VerifiedChains:   [][]*x509.Certificate{{leaf.Certificate(), ca.Certificate()}},
			}}),
			want: "spiffe://cotal.local/managerd/sp",
		},
		{name: "fail/no-peer", ctx: context.Background(), wantErr: ErrNoPeer},
		{name: "fail/nil-authinfo", ctx: withPeer(nil), wantErr: ErrNotTLS},
		{name: "fail/not-tls", ctx: withPeer(plainAuthInfo{}), wantErr: ErrNotTLS},
		{
			// A certificate the peer sent but nobody verified must never name a caller.
			name: "fail/unverified-peer-cert",
			ctx: withPeer(credentials.TLSInfo{State: tls.ConnectionState{
				PeerCertificates: []*x509.Certificate{other.Certificate()},
			}}),
			wantErr: ErrNotVerified,
		},
		{
			name:    "fail/empty-chain",
			ctx:     withPeer(credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{}}}}),
			wantErr: ErrNotVerified,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IdentityFromContext(tt.ctx)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || got != "" {
					t.Fatalf("IdentityFromContext = %q, %v; want error %v", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("IdentityFromContext = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// FuzzParseID checks that ParseID never panics, that what it accepts round-trips exactly, and
// that net/url (which crypto/x509 uses on SANs) reads an accepted ID the same way.
func FuzzParseID(f *testing.F) {
	for _, s := range []string{
		"spiffe://cotal.local/authd/sp1",
		"spiffe://cotal.local/signerd",
		"spiffe://cotal.local",
		"spiffe://cotal.local/",
		"spiffe://u@td:1/a?b#c",
		"spiffe://td/a/../b",
		"spiffe://td/a%2Fb",
		"spiffe://TD/a",
		"spiffe:///a",
		"spiffe:td/a",
		"http://td/a",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidID) || !id.IsZero() {
				t.Fatalf("ParseID(%q) = %v, %v: want zero ID and ErrInvalidID", s, id, err)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("ParseID(%q).String() = %q", s, id.String())
		}
		again, err := ParseID(id.String())
		if err != nil || again != id {
			t.Fatalf("re-parse of %q = %v, %v", s, again, err)
		}
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("url.Parse(%q) rejects an accepted ID: %v", s, err)
		}
		if u.Scheme != "spiffe" || u.Host != id.TrustDomain() || u.Path != id.Path() ||
			u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.String() != s {
			t.Fatalf("url.Parse(%q) = %#v disagrees with ParseID %v", s, u, id)
		}
		for _, seg := range id.Segments() {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("ParseID(%q) accepted segment %q", s, seg)
			}
		}
	})
}
