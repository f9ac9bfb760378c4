package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/signerclient"
	"github.com/cotalgo/cotal/signerd/internal/audit"
	"github.com/cotalgo/cotal/signerd/signerdtest"
)

// streamClient dials s through pkg/signerclient as id: its Calls go over the Stream RPC.
func streamClient(t *testing.T, s *signerdtest.Signer, id string) *signerclient.Client {
	t.Helper()
	c, err := signerclient.Dial(signerclient.Config{Addr: s.Addr, TLS: s.Client(t, id)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func agentMint(user, requestID string) *signerv1.MintRequest {
	r := benchRequest(user)
	r.RequestId = requestID
	return r
}

// claimShape is what two agent JWTs minted from the same request for different keys share.
func claimShape(t *testing.T, token string) string {
	t.Helper()
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	tags := slices.Clone(uc.Tags)
	slices.Sort(tags)
	return strings.ReplaceAll(fmt.Sprintf("iss_acct=%s name=%s pub=%v/%v sub=%v/%v resp=%v tags=%v bearer=%v ttl=%d",
		uc.IssuerAccount, uc.Name, uc.Pub.Allow, uc.Pub.Deny, uc.Sub.Allow, uc.Sub.Deny, uc.Resp, tags,
		uc.BearerToken, uc.Expires-uc.IssuedAt), uc.Subject, "<subject>")
}

// lastAudit returns the audit lines of s written after the first n.
func auditSince(t *testing.T, s *signerdtest.Signer, n int) []audit.Record {
	t.Helper()
	recs := auditRecords(t, s.AuditPath)
	if len(recs) < n {
		t.Fatalf("audit file shrank from %d to %d lines", n, len(recs))
	}
	return recs[n:]
}

// TestStream runs each call kind through the Stream RPC (pkg/signerclient's Calls) and checks
// that it answers what the unary RPC answers, with the same audit line.
func TestStream(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: benchPolicyWithAuthd})
	managerdID := signerdtest.ID(mtls.KindManagerd, benchSpace)
	unary := dialAs(t, s, managerdID)
	sc := streamClient(t, s, managerdID)
	calls := sc.Calls()

	t.Run("ok/mint-matches-unary", func(t *testing.T) {
		_, u1 := newUser(t)
		_, u2 := newUser(t)
		before := len(auditRecords(t, s.AuditPath))
		ur, err := unary.Mint(ctxT(t), agentMint(u1, ""))
		if err != nil {
			t.Fatal(err)
		}
		cred, err := calls.Mint(ctxT(t), agentMint(u2, ""))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := claimShape(t, cred.GetJwt()), claimShape(t, ur.GetCredential().GetJwt()); got != want {
			t.Fatalf("stream claims:\n%s\nunary claims:\n%s", got, want)
		}
		if cred.GetUserPublicKey() != u2 || cred.GetProfile() != signerv1.Profile_PROFILE_AGENT || cred.GetSigningKey() != ur.GetCredential().GetSigningKey() {
			t.Fatalf("stream credential = {user %s profile %v key %s}, want {%s agent %s}", cred.GetUserPublicKey(), cred.GetProfile(), cred.GetSigningKey(), u2, ur.GetCredential().GetSigningKey())
		}
		if calls.Opened() != 1 || calls.FellBack() != 0 {
			t.Fatalf("streams opened %d, calls fallen back %d; want 1 and 0", calls.Opened(), calls.FellBack())
		}
		recs := auditSince(t, s, before)
		if len(recs) != 2 {
			t.Fatalf("%d audit lines, want 2 (one per call)", len(recs))
		}
		for i, jti := range []string{ur.GetCredential().GetJti(), cred.GetJti()} {
			auditWant{caller: managerdID, rpc: "Mint", space: benchSpace, profile: "agent", decision: audit.Granted}.check(t, recs[i])
			if recs[i].JTI != jti {
				t.Fatalf("audit line %d jti %s, want %s", i, recs[i].JTI, jti)
			}
		}
	})

	t.Run("fail/policy-refusal-as-unary", func(t *testing.T) {
		_, u := newUser(t)
		req := agentMint(u, "")
		req.Profile, req.Params = signerv1.Profile_PROFILE_PROBE, nil
		before := len(auditRecords(t, s.AuditPath))
		_, uerr := unary.Mint(ctxT(t), req)
		wantRefusal(t, uerr, codes.PermissionDenied, "PROFILE_NOT_ALLOWED")
		_, serr := calls.Mint(ctxT(t), req)
		wantRefusal(t, serr, codes.PermissionDenied, "PROFILE_NOT_ALLOWED")
		var se *signerclient.Error
		if !errors.As(serr, &se) || se.Detail != status.Convert(uerr).Message() {
			t.Fatalf("stream error %v, unary message %q: want the same detail", serr, status.Convert(uerr).Message())
		}
		recs := auditSince(t, s, before)
		if len(recs) != 2 {
			t.Fatalf("%d audit lines, want 2", len(recs))
		}
		for _, r := range recs {
			auditWant{caller: managerdID, rpc: "Mint", space: benchSpace, profile: "probe", decision: audit.Denied, reason: "profile-not-allowed"}.check(t, r)
		}
	})

	t.Run("fail/unknown-caller-per-request", func(t *testing.T) {
		stranger := "spiffe://cotal.local/stranger/alpha"
		sc := streamClient(t, s, stranger)
		_, u := newUser(t)
		for i := range 2 {
			_, err := sc.Calls().Mint(ctxT(t), agentMint(u, ""))
			wantRefusal(t, err, codes.PermissionDenied, "CALLER_UNKNOWN")
			if sc.Calls().Opened() != 1 {
				t.Fatalf("call %d: streams opened %d, want 1 (the refusal is per request, the stream stays)", i, sc.Calls().Opened())
			}
		}
		_, err := dialAs(t, s, stranger).Mint(ctxT(t), agentMint(u, ""))
		wantRefusal(t, err, codes.PermissionDenied, "CALLER_UNKNOWN")
	})

	t.Run("ok/request-id-across-unary-and-stream", func(t *testing.T) {
		_, u := newUser(t)
		req := agentMint(u, "stream-idem-1")
		before := len(auditRecords(t, s.AuditPath))
		ur, err := unary.Mint(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		cred, err := calls.Mint(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		if cred.GetJti() != ur.GetCredential().GetJti() || cred.GetJwt() != ur.GetCredential().GetJwt() {
			t.Fatalf("stream replay jti %s, unary jti %s: want the same credential", cred.GetJti(), ur.GetCredential().GetJti())
		}
		// And the other way: first on the stream, then unary.
		_, u2 := newUser(t)
		req2 := agentMint(u2, "stream-idem-2")
		cred2, err := calls.Mint(ctxT(t), req2)
		if err != nil {
			t.Fatal(err)
		}
		ur2, err := unary.Mint(ctxT(t), req2)
		if err != nil {
			t.Fatal(err)
		}
		if ur2.GetCredential().GetJti() != cred2.GetJti() {
			t.Fatalf("unary replay jti %s, stream jti %s", ur2.GetCredential().GetJti(), cred2.GetJti())
		}
		recs := auditSince(t, s, before)
		var replays []string
		for _, r := range recs {
			replays = append(replays, r.Reason)
		}
		if !slices.Equal(replays, []string{"", "replay", "", "replay"}) {
			t.Fatalf("audit reasons %q, want a grant and a replay twice", replays)
		}
	})

	t.Run("ok/concurrent-requests-right-ids", func(t *testing.T) {
		const goroutines, perG = 32, 7 // 224 requests
		keys := new(userKeys).take(t, goroutines*perG)
		before := len(auditRecords(t, s.AuditPath))
		opened := calls.Opened()
		errs := make(chan error, goroutines)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range perG {
					u := keys[g*perG+i]
					// Calls.Mint refuses an answer whose credential names another key than its
					// request: a mixed-up id fails here.
					cred, err := calls.Mint(ctxT(t), agentMint(u, ""))
					if err != nil {
						errs <- err
						return
					}
					if cred.GetUserPublicKey() != u {
						errs <- fmt.Errorf("credential for %s, asked for %s", cred.GetUserPublicKey(), u)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if calls.Opened() != opened || calls.FellBack() != 0 {
			t.Fatalf("streams opened %d (was %d), fallen back %d: want every call on the one stream", calls.Opened(), opened, calls.FellBack())
		}
		recs := auditSince(t, s, before)
		seen := map[string]bool{}
		for _, r := range recs {
			if r.RPC != "Mint" || r.Decision != audit.Granted {
				t.Fatalf("audit line rpc %s decision %s, want Mint granted", r.RPC, r.Decision)
			}
			seen[r.Subject] = true
		}
		if len(recs) != goroutines*perG || len(seen) != goroutines*perG {
			t.Fatalf("%d audit lines for %d subjects, want %d each", len(recs), len(seen), goroutines*perG)
		}
	})

	t.Run("ok/callout-matches-unary", func(t *testing.T) {
		authdID := signerdtest.ID(mtls.KindAuthd, benchSpace)
		authdUnary := dialAs(t, s, authdID)
		ac := streamClient(t, s, authdID).Calls()
		gs, err := authdUnary.GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: benchSpace})
		if err != nil {
			t.Fatal(err)
		}
		srv := newForgedServer(t)
		nonce := newNonce()
		sealed, user := srv.request(t, gs, nonce, nil)
		before := len(auditRecords(t, s.AuditPath))
		open := &signerv1.OpenCalloutRequestRequest{Space: benchSpace, SealedRequest: sealed, ServerXkey: srv.xkey}
		uo, err := authdUnary.OpenCalloutRequest(ctxT(t), open)
		if err != nil {
			t.Fatal(err)
		}
		so, err := ac.OpenCalloutRequest(ctxT(t), open)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(uo, so) || so.GetUserNkey() != user {
			t.Fatalf("stream open = %v\nunary open = %v", so, uo)
		}
		expires := time.Now().Add(10 * time.Minute)
		sign := &signerv1.SignCalloutResponseRequest{Space: benchSpace, SealedRequest: sealed, ServerXkey: srv.xkey,
			Decision: &signerv1.SignCalloutResponseRequest_Grant{Grant: agentGrant(expires)}}
		resp, err := ac.SignCalloutResponse(ctxT(t), sign)
		if err != nil {
			t.Fatal(err)
		}
		rc := srv.openResponse(t, gs, resp.GetSealedResponse())
		uc, err := jwt.DecodeUserClaims(rc.Jwt)
		if err != nil {
			t.Fatal(err)
		}
		if rc.Subject != user || rc.Audience != srv.id || rc.Error != "" || uc.Subject != user || uc.ID != resp.GetUserJti() ||
			!slices.Contains(uc.Sub.Allow, "_INBOX_"+nonce+".>") {
			t.Fatalf("response {sub %s aud %s error %q} user JWT {sub %s jti %s sub.allow %v}; want %s, %s, none, %s, %s, the nonce inbox",
				rc.Subject, rc.Audience, rc.Error, uc.Subject, uc.ID, uc.Sub.Allow, user, srv.id, user, resp.GetUserJti())
		}
		// A refusal through the stream: another space is not authd's.
		bad := proto.CloneOf(sign)
		bad.Space = "beta"
		_, uerr := authdUnary.SignCalloutResponse(ctxT(t), bad)
		_, serr := ac.SignCalloutResponse(ctxT(t), bad)
		if status.Code(serr) != status.Code(uerr) || signerclient.ReasonOf(serr) != signerclient.ReasonOf(uerr) || serr == nil {
			t.Fatalf("stream refusal %v, unary %v: want the same code and reason", serr, uerr)
		}
		recs := auditSince(t, s, before)
		var rpcs []string
		for _, r := range recs {
			rpcs = append(rpcs, r.RPC+"/"+string(r.Decision))
		}
		want := []string{"OpenCalloutRequest/granted", "OpenCalloutRequest/granted", "SignCalloutResponse/granted",
			"SignCalloutResponse/denied", "SignCalloutResponse/denied"}
		if !slices.Equal(rpcs, want) {
			t.Fatalf("audit lines %v, want %v", rpcs, want)
		}
		if recs[2].JTI != resp.GetUserJti() || recs[2].Caller != authdID {
			t.Fatalf("SignCalloutResponse audit {jti %s caller %s}, want {%s %s}", recs[2].JTI, recs[2].Caller, resp.GetUserJti(), authdID)
		}
	})
}

// benchPolicyWithAuthd is benchPolicy plus authd of the bench space with its callout RPCs.
const benchPolicyWithAuthd = benchPolicy + `  - id: spiffe://cotal.local/authd/{space}
    rpcs: [GetSpace, OpenCalloutRequest, SignCalloutResponse]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent:
        ttl_max: 1h
        any_owner: true
        channels: ["general"]
`

// TestStreamRateLimited checks a caller past its rate is refused per request on the stream as
// on the unary RPC, and the stream stays usable.
func TestStreamRateLimited(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint]
    spaces: ["{space}"]
    rate: {per_second: 0.001, burst: 2}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: ["general", "team.*"], roles: [reviewer], capabilities: [spawn]}
`})
	id := signerdtest.ID(mtls.KindManagerd, benchSpace)
	calls := streamClient(t, s, id).Calls()
	keys := new(userKeys).take(t, 4)
	for i := range 2 {
		if _, err := calls.Mint(ctxT(t), agentMint(keys[i], "")); err != nil {
			t.Fatalf("mint %d within the burst: %v", i, err)
		}
	}
	t.Run("fail/stream-past-rate", func(t *testing.T) {
		_, err := calls.Mint(ctxT(t), agentMint(keys[2], ""))
		wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")
	})
	t.Run("fail/unary-past-rate", func(t *testing.T) {
		_, err := dialAs(t, s, id).Mint(ctxT(t), agentMint(keys[3], ""))
		wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")
	})
	if calls.Opened() != 1 || calls.FellBack() != 0 {
		t.Fatalf("streams opened %d, fallen back %d; want 1 and 0", calls.Opened(), calls.FellBack())
	}
}

// TestStreamRefusesBadFrames speaks the Stream RPC directly: an id already in flight and a
// request without a call are refused for their id, and the stream answers the rest.
func TestStreamRefusesBadFrames(t *testing.T) {
	// A one-second group-commit wait keeps the first Mint in flight while the next frames are
	// read.
	s := signerdtest.Start(t, signerdtest.Options{Policy: benchPolicy, AuditMaxDelay: time.Second})
	c := dialAs(t, s, signerdtest.ID(mtls.KindManagerd, benchSpace))
	st, err := c.Stream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	md, err := st.Header()
	if err != nil || len(md.Get(signerclient.StreamHeader)) != 1 {
		t.Fatalf("stream header %v (%v), want %s", md, err, signerclient.StreamHeader)
	}
	_, u := newUser(t)
	mint := &signerv1.StreamRequest_Mint{Mint: agentMint(u, "")}
	for _, r := range []*signerv1.StreamRequest{{Id: 7, Call: mint}, {Id: 7, Call: mint}, {Id: 8}} {
		if err := st.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("stream ended with %v, want a clean end after the half-close", err)
		}
		switch res := r.GetResult().(type) {
		case *signerv1.StreamResponse_Mint:
			if res.Mint.GetCredential().GetUserPublicKey() != u {
				t.Fatalf("minted for %s, want %s", res.Mint.GetCredential().GetUserPublicKey(), u)
			}
			got = append(got, fmt.Sprintf("%d:mint", r.GetId()))
		case *signerv1.StreamResponse_Status:
			var p spb.Status
			if err := proto.Unmarshal(res.Status, &p); err != nil {
				t.Fatal(err)
			}
			serr := status.FromProto(&p).Err()
			wantRefusal(t, serr, codes.InvalidArgument, "INVALID_ARGUMENT")
			got = append(got, fmt.Sprintf("%d:invalid", r.GetId()))
		default:
			t.Fatalf("unexpected answer %v", r)
		}
	}
	slices.Sort(got)
	if want := []string{"7:invalid", "7:mint", "8:invalid"}; !slices.Equal(got, want) {
		t.Fatalf("answers %v, want %v", got, want)
	}
}

// TestStreamPerCallerCap checks the 17th stream of one caller is refused before any request,
// with RESOURCE_EXHAUSTED, and that closing one lets another open.
func TestStreamPerCallerCap(t *testing.T) {
	s := signerdtest.Start(t, signerdtest.Options{Policy: benchPolicy})
	c := dialAs(t, s, signerdtest.ID(mtls.KindManagerd, benchSpace))
	open := func(ctx context.Context) (signerv1.SignerService_StreamClient, error) {
		st, err := c.Stream(ctx)
		if err != nil {
			return nil, err
		}
		md, err := st.Header()
		if err == nil && len(md.Get(signerclient.StreamHeader)) == 0 {
			_, err = st.Recv()
		}
		return st, err
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	// The first stream has its own context, so it alone can be closed; the rest end with ctx.
	firstCtx, first := context.WithCancel(ctx)
	defer first()
	for i := range 16 {
		sctx := ctx
		if i == 0 {
			sctx = firstCtx
		}
		if _, err := open(sctx); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	t.Run("fail/seventeenth", func(t *testing.T) {
		_, err := open(ctx)
		wantRefusal(t, err, codes.ResourceExhausted, "RATE_LIMITED")
	})
	t.Run("ok/after-one-closes", func(t *testing.T) {
		first()
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err := open(ctx)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no stream opened after one closed: %v", err)
			}
			time.Sleep(10 * time.Millisecond) // poll interval, not synchronisation
		}
	})
}
