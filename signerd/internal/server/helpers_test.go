package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cotalgo/cotal/pkg/creds"
	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// callTimeout bounds every RPC a test makes.
const callTimeout = 10 * time.Second

// uid is a valid lifecycle UID ([a-z0-9]{26,32}).
const uid = "abcdefghijklmnopqrstuvwxyz"

// errorDomain is the ErrorInfo domain the proto promises; spelled out here rather than taken
// from the server package so a change there breaks this test.
const errorDomain = "signer.cotal.dev"

// dial connects to s over mTLS with files and returns a SignerService client. It is a plain
// generated client, not pkg/signerclient: these tests pin the wire contract.
func dial(t *testing.T, addr string, files mtls.ClientFiles) signerv1.SignerServiceClient {
	t.Helper()
	tlsCfg, _, err := mtls.NewClientTLS(files, "localhost")
	if err != nil {
		t.Fatalf("client TLS: %v", err)
	}
	return dialTLS(t, addr, tlsCfg)
}

// dialTLS connects with an arbitrary TLS configuration (for clients mtls would not build).
func dialTLS(t *testing.T, addr string, tlsCfg *tls.Config) signerv1.SignerServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatalf("grpc client: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return signerv1.NewSignerServiceClient(conn)
}

// dialAs connects to s as the caller identity id, with a certificate from s's CA.
func dialAs(t *testing.T, s *signerdtest.Signer, id string) signerv1.SignerServiceClient {
	t.Helper()
	return dial(t, s.Addr, s.Client(t, id))
}

// noCertTLS verifies signerd like a real client but presents no certificate.
func noCertTLS(t *testing.T, s *signerdtest.Signer) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(s.ServerCAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("server CA file holds no certificate")
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, ServerName: "localhost", RootCAs: pool}
}

// foreignCAClient issues a client certificate for id from a CA signerd does not trust, and
// returns files that verify signerd itself correctly.
func foreignCAClient(t *testing.T, s *signerdtest.Signer, id string) mtls.ClientFiles {
	t.Helper()
	ca, err := mtls.NewCA("foreign CA", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(mtls.LeafSpec{CommonName: "foreign", URIs: []string{id},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := mtls.ClientFiles{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"), ServerCAFile: s.ServerCAFile}
	if err := os.WriteFile(files.CertFile, leaf.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := creds.WriteFileAtomic(files.KeyFile, leaf.KeyPEM()); err != nil {
		t.Fatal(err)
	}
	return files
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newUser returns a fresh user key pair and its public key.
func newUser(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Wipe)
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// wantRefusal asserts err is a gRPC status with code and, when reason is not empty, exactly one
// ErrorInfo with that reason, the signer domain and the kebab-case code in its metadata. An
// empty reason asserts there is no ErrorInfo at all.
func wantRefusal(t *testing.T, err error, code codes.Code, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded; want %v %s", code, reason)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error is not a gRPC status: %v", err)
	}
	if st.Code() != code {
		t.Fatalf("code = %v (%q), want %v", st.Code(), st.Message(), code)
	}
	var infos []*errdetails.ErrorInfo
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			infos = append(infos, info)
		}
	}
	if reason == "" {
		if len(infos) != 0 {
			t.Fatalf("ErrorInfo = %v, want none", infos)
		}
		return
	}
	if len(infos) != 1 {
		t.Fatalf("got %d ErrorInfo details (%v), want 1 with reason %s", len(infos), st.Details(), reason)
	}
	info := infos[0]
	if info.GetReason() != reason || info.GetDomain() != errorDomain {
		t.Fatalf("ErrorInfo = {reason %q, domain %q}, want {%q, %q}", info.GetReason(), info.GetDomain(), reason, errorDomain)
	}
	if _, ok := signerv1.Reason_value["REASON_"+reason]; !ok {
		t.Fatalf("reason %s is not a signer.proto Reason value", reason)
	}
	if got, want := info.GetMetadata()["code"], kebab(reason); got != want {
		t.Fatalf("ErrorInfo metadata code = %q, want %q", got, want)
	}
}

// kebab turns "RATE_LIMITED" into "rate-limited".
func kebab(reason string) string {
	b := []byte(reason)
	for i, c := range b {
		switch {
		case c == '_':
			b[i] = '-'
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// wantNoCredential asserts a refused call returned no message and so no JWT.
func wantNoCredential(t *testing.T, resp proto.Message) {
	t.Helper()
	if resp != nil && resp.ProtoReflect().IsValid() {
		t.Fatalf("refused call returned a response: %v", resp)
	}
	if h, ok := resp.(interface{ GetCredential() *signerv1.Credential }); ok && h.GetCredential().GetJwt() != "" {
		t.Fatal("refused call returned a JWT")
	}
}

// auditRecords reads every line of the audit file.
func auditRecords(t *testing.T, path string) []audit.Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Record
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), audit.MaxLineBytes+1)
	for sc.Scan() {
		var r audit.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line %d: %v", len(out)+1, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// auditWant is what one audit line must say.
type auditWant struct {
	caller, rpc, space, profile string
	decision                    audit.Decision
	reason                      string
}

func (w auditWant) check(t *testing.T, got audit.Record) {
	t.Helper()
	if got.Caller != w.caller || got.RPC != w.rpc || got.Decision != w.decision || got.Reason != w.reason ||
		got.Space != w.space || got.Profile != w.profile {
		t.Fatalf("audit line = {caller %q rpc %q space %q profile %q decision %q reason %q}, want %+v",
			got.Caller, got.RPC, got.Space, got.Profile, got.Decision, got.Reason, w)
	}
	if w.decision == audit.Denied && got.JTI != "" {
		t.Fatalf("denied audit line carries jti %q", got.JTI)
	}
	if w.decision == audit.Granted && (got.JTI == "" || got.Expiry.IsZero()) {
		t.Fatalf("granted audit line lacks jti or expiry: %+v", got)
	}
}

// verifyAudit checks the audit file's chain and that it holds no JWT and nothing shaped like a
// seed or private key.
func verifyAudit(t *testing.T, path string) audit.Summary {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := audit.Verify(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("audit.Verify: %v", err)
	}
	if sum.Lines == 0 {
		t.Fatal("audit file is empty")
	}
	for _, bad := range []string{"eyJ", "PRIVATE KEY"} {
		if bytes.Contains(data, []byte(bad)) {
			t.Fatalf("audit file contains %q", bad)
		}
	}
	if m := seedLike.Find(data); m != nil {
		t.Fatalf("audit file contains seed-like text %.6s...", m)
	}
	return sum
}

// seedLike matches an nkey seed (S, a type prefix, 56 more base32 characters) or a
// base64 PKCS#8 Ed25519 private key body.
var seedLike = regexp.MustCompile(`\bS[AOUNCXP][A-Z2-7]{56}\b|MC4CAQAwBQYDK2Vw`)

// remintProof signs the Remint challenge as signer.proto defines it:
// "cotal-remint/v1" NUL space NUL jti NUL decimal(unix seconds).
func remintProof(t *testing.T, kp nkeys.KeyPair, spaceName, jti string, at int64) []byte {
	t.Helper()
	msg := []byte("cotal-remint/v1\x00" + spaceName + "\x00" + jti + "\x00" + strconv.FormatInt(at, 10))
	sig, err := kp.Sign(msg)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// offsetClock is signerd's clock in tests that move time: the wall clock plus an offset.
type offsetClock struct{ off atomic.Int64 }

func (c *offsetClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

func (c *offsetClock) Set(d time.Duration) { c.off.Store(int64(d)) }

// wantLifetime asserts a credential lives exactly ttl. jwt.Encode stamps iat from the wall
// clock after signerd computed exp from its own, so when a second boundary falls between the
// two reads exp-iat is one second short; that (harmless, shorter) case is accepted.
func wantLifetime(t *testing.T, cred *signerv1.Credential, ttl time.Duration) {
	t.Helper()
	iat, exp := cred.GetIssuedAt().AsTime(), cred.GetExpiresAt().AsTime()
	if got := exp.Sub(iat); got != ttl && got != ttl-time.Second {
		t.Fatalf("exp - iat = %v, want %v", got, ttl)
	}
}
