package lifecycle

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

var (
	sWit  = "w_" + strings.Repeat("a", 52)
	sProp = "p_" + strings.Repeat("b", 26)
	sRoot = "r_" + strings.Repeat("c", 26)
	sDig  = "sha256:" + strings.Repeat("d", 64)
	sReq  = "req-0001"
)

// TestServiceRows: each service row family round-trips canonically at its key, refuses another
// key of its family, and refuses a value outside its grammar; the manager's spec encodes byte
// for byte as before the optional service part.
func TestServiceRows(t *testing.T) {
	art := []byte("manifest bytes")
	sum := sha256.Sum256(art)
	artDig := "sha256:" + hex.EncodeToString(sum[:])
	ep, ep2 := "svc.echo", "svc.other"
	cases := []struct {
		name       string
		key, other string
		encode     func() ([]byte, error)
		decode     func(key string, b []byte) (any, error)
	}{
		{"name", mustKey(ServiceNameKey(ep)), mustKey(ServiceNameKey(ep2)),
			func() ([]byte, error) {
				return EncodeServiceName(ServiceName{Endpoint: ep, Owner: tOwner, RequestID: sReq, Digest: sDig})
			},
			func(k string, b []byte) (any, error) { return DecodeServiceName(k, b) }},
		{"ledger", mustKey(ServiceLedgerKey(ep, tIID)), mustKey(ServiceLedgerKey(ep, tUID)),
			func() ([]byte, error) {
				return EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: []ServiceLedgerEntry{
					{RequestID: sReq, Operation: "register", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeRegistering, Proposal: sProp, Witness: sWit, Generation: 3, Epoch: 1, StartedAt: 100}},
					{RequestID: "req-0002", Operation: "activate", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeCredential}},
				}})
			},
			func(k string, b []byte) (any, error) { return DecodeServiceLedger(k, b) }},
		{"proposal", mustKey(ServiceProposalKey(ep, tIID)), mustKey(ServiceProposalKey(ep2, tIID)),
			func() ([]byte, error) {
				return EncodeServiceProposal(ServiceProposal{Proposal: sProp, Endpoint: ep, InstanceID: tIID, Owner: tOwner, ContractDigest: sDig,
					RequestID: sReq, State: ProposalApproved, CreatedAt: 10, ExpiresAt: 20, ApprovalExpiresAt: 30})
			},
			func(k string, b []byte) (any, error) { return DecodeServiceProposal(k, b) }},
		{"artifact", mustKey(ServiceArtifactKey(artDig)), mustKey(ServiceArtifactKey(sDig)),
			func() ([]byte, error) { return EncodeServiceArtifact(ServiceArtifact{Digest: artDig, Bytes: art}) },
			func(k string, b []byte) (any, error) { return DecodeServiceArtifact(k, b) }},
	}
	for _, c := range cases {
		t.Run("ok/"+c.name, func(t *testing.T) {
			b, err := c.encode()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte(`{"v":1,`)) {
				t.Fatalf("row %s does not start with the version", b)
			}
			if _, err := c.decode(c.key, b); err != nil {
				t.Fatalf("decode = %v", err)
			}
		})
		t.Run("fail/"+c.name+"/another key", func(t *testing.T) {
			b, _ := c.encode()
			if _, err := c.decode(c.other, b); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("decode at %s = %v, want ErrCorrupt", c.other, err)
			}
		})
		t.Run("fail/"+c.name+"/not canonical", func(t *testing.T) {
			b, _ := c.encode()
			for _, bad := range [][]byte{append(b, ' '), bytes.Replace(b, []byte(`{"v":1,`), []byte(`{"v":1, `), 1), append(b[:len(b)-1], []byte(`,"x":1}`)...)} {
				if _, err := c.decode(c.key, bad); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("decode(%q) = %v, want ErrCorrupt", bad, err)
				}
			}
		})
	}
	t.Run("ok/root", func(t *testing.T) {
		k := mustKey(ServiceRootKey(ep, tIID))
		b, err := EncodeServiceRoot(ServiceRoot{Root: sRoot, Witness: sWit, Generation: 1, CreatedAt: 5, ExpiresAt: 9})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := DecodeServiceRoot(k, b); err != nil || r.Root != sRoot || r.ExpiresAt != 9 {
			t.Fatalf("DecodeServiceRoot = %+v, %v", r, err)
		}
	})
	t.Run("fail/refusals", func(t *testing.T) {
		refused := map[string]error{}
		_, refused["artifact bytes not hashing to digest"] = EncodeServiceArtifact(ServiceArtifact{Digest: sDig, Bytes: art})
		_, refused["outcome field of another kind"] = EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: []ServiceLedgerEntry{
			{RequestID: sReq, Operation: "ready", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeReady, Witness: sWit, Proposal: sProp}}}})
		_, refused["outcome of another operation"] = EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: []ServiceLedgerEntry{
			{RequestID: sReq, Operation: "ready", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeRegistered, Witness: sWit}}}})
		_, refused["requestId twice"] = EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: []ServiceLedgerEntry{
			{RequestID: sReq, Operation: "activate", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeCredential}},
			{RequestID: sReq, Operation: "renew", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeCredential}}}})
		_, refused["short requestId"] = EncodeServiceName(ServiceName{Endpoint: ep, Owner: tOwner, RequestID: "short", Digest: sDig})
		_, refused["approved without its approval"] = EncodeServiceProposal(ServiceProposal{Proposal: sProp, Endpoint: ep, InstanceID: tIID, Owner: tOwner,
			ContractDigest: sDig, RequestID: sReq, State: ProposalApproved, CreatedAt: 10, ExpiresAt: 20})
		_, refused["service part on the manager's spec"] = EncodeSpec(Spec{Endpoint: ManagerEndpoint, InstanceID: tIID, Principal: ServicePrincipal(tOwner, tIID),
			Service: &SpecService{Witness: sWit, Owner: tOwner, Generation: 1, Contract: sDig}})
		_, refused["service spec under another principal"] = EncodeSpec(Spec{Endpoint: ep, InstanceID: tIID, Principal: tOwner + ".cli",
			Service: &SpecService{Witness: sWit, Owner: tOwner, Generation: 1, Contract: sDig}})
		entries := make([]ServiceLedgerEntry, MaxServiceLedgerEntries+1)
		for i := range entries {
			entries[i] = ServiceLedgerEntry{RequestID: "req-" + strings.Repeat("x", 4) + hex.EncodeToString([]byte{byte(i)}), Operation: "renew", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeCredential}}
		}
		_, refused["65 entries"] = EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: entries})
		for what, err := range refused {
			if err == nil {
				t.Errorf("%s: encoded", what)
			}
		}
		if _, err := EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: entries[:MaxServiceLedgerEntries]}); err != nil {
			t.Fatalf("64 entries: %v", err)
		}
	})
	t.Run("ok/service spec", func(t *testing.T) {
		s := Spec{Endpoint: ep, InstanceID: tIID, Principal: ServicePrincipal(tOwner, tIID), ProcessEpoch: 2,
			Service: &SpecService{Witness: sWit, Owner: tOwner, Generation: 5, Contract: sDig}}
		b, err := EncodeSpec(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeSpec(mustKey(SpecKey(ep, tIID)), b)
		if err != nil || got.Service == nil || *got.Service != *s.Service {
			t.Fatalf("DecodeSpec = %+v, %v", got, err)
		}
		m, _ := EncodeSpec(Spec{Endpoint: ManagerEndpoint, InstanceID: tIID, Principal: "m1.s1"})
		if want := `{"v":1,"endpoint":"manager","instanceId":"` + tIID + `","principal":"m1.s1","processEpoch":0}`; string(m) != want {
			t.Fatalf("manager spec = %s, want %s", m, want)
		}
	})
}

// FuzzDecodeServiceRows: whatever a service row decoder accepts is within its bound, is byte for
// byte its own canonical encoding and is read at its own key; whatever it refuses wraps
// ErrCorrupt.
func FuzzDecodeServiceRows(f *testing.F) {
	ep := "svc.echo"
	art := []byte("manifest")
	sum := sha256.Sum256(art)
	artDig := "sha256:" + hex.EncodeToString(sum[:])
	seed := func(fam uint8, key string, b []byte, err error) {
		if err != nil {
			f.Fatal(err)
		}
		f.Add(fam, key, b)
		f.Add(fam, key, b[:len(b)/2])
		f.Add(fam, key, append(append([]byte{}, b[:len(b)-1]...), `,"x":null}`...))
	}
	b, err := EncodeServiceName(ServiceName{Endpoint: ep, Owner: tOwner, RequestID: sReq, Digest: sDig})
	seed(0, mustKey(ServiceNameKey(ep)), b, err)
	b, err = EncodeServiceLedger(ServiceLedger{Endpoint: ep, InstanceID: tIID, Entries: []ServiceLedgerEntry{
		{RequestID: sReq, Operation: "register", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeRegistered, Proposal: sProp, Witness: sWit, Generation: 3, Epoch: 1}},
		{RequestID: "req-0002", Operation: "decide", Digest: sDig, Outcome: ServiceOutcome{Kind: OutcomeDecided, Proposal: sProp, Decision: "approve", ApprovalExpiresAt: 9}}}})
	seed(1, mustKey(ServiceLedgerKey(ep, tIID)), b, err)
	b, err = EncodeServiceProposal(ServiceProposal{Proposal: sProp, Endpoint: ep, InstanceID: tIID, Owner: tOwner, ContractDigest: sDig,
		RequestID: sReq, State: ProposalOpen, CreatedAt: 10, ExpiresAt: 20})
	seed(2, mustKey(ServiceProposalKey(ep, tIID)), b, err)
	b, err = EncodeServiceRoot(ServiceRoot{Root: sRoot, Witness: sWit, Generation: 1, CreatedAt: 5, ExpiresAt: 9})
	seed(3, mustKey(ServiceRootKey(ep, tIID)), b, err)
	b, err = EncodeServiceArtifact(ServiceArtifact{Digest: artDig, Bytes: art})
	seed(4, mustKey(ServiceArtifactKey(artDig)), b, err)
	f.Fuzz(func(t *testing.T, fam uint8, key string, b []byte) {
		var enc func() ([]byte, error)
		var err error
		max := MaxServiceRowBytes
		switch fam % 5 {
		case 0:
			var v ServiceName
			v, err = DecodeServiceName(key, b)
			enc = func() ([]byte, error) { return EncodeServiceName(v) }
		case 1:
			var v ServiceLedger
			v, err = DecodeServiceLedger(key, b)
			enc = func() ([]byte, error) { return EncodeServiceLedger(v) }
		case 2:
			var v ServiceProposal
			v, err = DecodeServiceProposal(key, b)
			enc = func() ([]byte, error) { return EncodeServiceProposal(v) }
		case 3:
			var v ServiceRoot
			v, err = DecodeServiceRoot(key, b)
			enc = func() ([]byte, error) { return EncodeServiceRoot(v) }
		case 4:
			var v ServiceArtifact
			v, err = DecodeServiceArtifact(key, b)
			enc = func() ([]byte, error) { return EncodeServiceArtifact(v) }
			max = MaxServiceArtifactRowBytes
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("refusal does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if len(b) > max {
			t.Fatalf("accepted %d bytes", len(b))
		}
		out, err := enc()
		if err != nil || !bytes.Equal(out, b) {
			t.Fatalf("accepted row re-encodes as %q, %v; read %q", out, err, b)
		}
	})
}
