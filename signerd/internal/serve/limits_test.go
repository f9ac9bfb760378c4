package serve_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	signerv1 "github.com/cotalgo/cotal/pkg/gen/cotal/signer/v1"
	"github.com/cotalgo/cotal/pkg/mtls"
	"github.com/cotalgo/cotal/pkg/testkit"
	"github.com/cotalgo/cotal/signerd/internal/serve"
)

// closeWait bounds how long a test waits for signerd to close a connection it must close.
const closeWait = 10 * time.Second

// startLimited runs signerd with the given limits block and a registry the test can read.
func startLimited(t *testing.T, limits string) (fixture, *running, *prometheus.Registry) {
	t.Helper()
	f := newFixture(t)
	cfg := f.config(t, "127.0.0.1:0", f.keyDir, "limits: "+limits+"\n")
	reg := prometheus.NewRegistry()
	s, err := serve.Start(cfg, nil, serve.Options{Registry: reg})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	r := &running{Signer: s, exited: make(chan struct{})}
	go func() {
		r.err = s.Run(context.Background())
		close(r.exited)
	}()
	t.Cleanup(func() {
		s.Stop()
		if err := r.wait(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return f, r, reg
}

// dialFrom connects over mTLS from the loopback address src (127.0.0.x).
func dialFrom(t *testing.T, target, src string, files mtls.ClientFiles) *grpc.ClientConn {
	t.Helper()
	tlsCfg, _, err := mtls.NewClientTLS(files, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// rawFrom opens a TCP connection from src that never sends a byte.
func rawFrom(t *testing.T, target, src string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", target)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantClosedBySigner waits (bounded) for signerd to close c, which has sent nothing.
func wantClosedBySigner(t *testing.T, c net.Conn, what string) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(closeWait)); err != nil {
		t.Fatal(err)
	}
	n, err := c.Read(make([]byte, 1))
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("%s: still open after %v", what, closeWait)
	case err == nil:
		t.Fatalf("%s: read %d bytes, want the connection closed", what, n)
	}
}

// mint asks for an agent credential over conn and fails t unless it is granted.
func mint(t *testing.T, conn *grpc.ClientConn) error {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := signerv1.NewSignerServiceClient(conn).Mint(ctxT(t), &signerv1.MintRequest{
		Space: "alpha", Profile: signerv1.Profile_PROFILE_AGENT, UserPublicKey: pub, Ttl: durationpb.New(time.Minute),
		Params: &signerv1.ProfileParams{Owner: "local", Actor: "bob", LifecycleUid: "abcdefghijklmnopqrstuvwxyz", Subscribe: []string{"general"}, AllowSubscribe: []string{"general"}},
	})
	if err != nil {
		return err
	}
	if resp.GetCredential().GetUserPublicKey() != pub || resp.GetCredential().GetJwt() == "" {
		t.Fatalf("Mint answered %v", resp)
	}
	return nil
}

// TestIdleConnectionsClosedAtHandshakeTimeout is finding 4 of issue 7: connections that never
// send a TLS ClientHello were held for gRPC's default 120 s, so enough of them exhausted the
// file descriptors. They are now closed at the handshake timeout, while a legitimate Mint
// still succeeds.
func TestIdleConnectionsClosedAtHandshakeTimeout(t *testing.T) {
	const idle = 300
	f, r, _ := startLimited(t, "{handshake_timeout: 1s, max_connections: 400, max_connections_per_source: 400}")
	addr := r.Addr().String()
	conns := make([]net.Conn, idle)
	for i := range conns {
		conns[i] = rawFrom(t, addr, "127.0.0.1")
	}
	if err := mint(t, dial(t, addr, f.client)); err != nil {
		t.Fatalf("Mint with %d idle connections open: %v", idle, err)
	}
	for i, c := range conns {
		wantClosedBySigner(t, c, "idle connection "+strconv.Itoa(i))
	}
}

// TestConnectionCaps is finding 4 of issue 7: connections beyond the cap per source address, or
// beyond the total cap, are closed at accept; a closed connection gives its slot back.
func TestConnectionCaps(t *testing.T) {
	f, r, reg := startLimited(t, "{handshake_timeout: 30s, max_connections: 3, max_connections_per_source: 2}")
	addr := r.Addr().String()
	a1 := rawFrom(t, addr, "127.0.0.1")
	rawFrom(t, addr, "127.0.0.1")
	wantClosedBySigner(t, rawFrom(t, addr, "127.0.0.1"), "third connection from 127.0.0.1")
	if err := mint(t, dialFrom(t, addr, "127.0.0.2", f.client)); err != nil {
		t.Fatalf("Mint from 127.0.0.2 (third connection in total): %v", err)
	}
	wantClosedBySigner(t, rawFrom(t, addr, "127.0.0.2"), "fourth connection in total")
	if got := refused(t, reg, "per-source"); got != 1 {
		t.Fatalf("per-source refusals = %v, want 1", got)
	}
	if got := refused(t, reg, "total"); got != 1 {
		t.Fatalf("total refusals = %v, want 1", got)
	}

	// Closing one gives its slot back to its source. One client connection is polled: each
	// new one would keep reconnecting in the background and could take the freed slot.
	if err := a1.Close(); err != nil {
		t.Fatal(err)
	}
	conn := dialFrom(t, addr, "127.0.0.1", f.client)
	testkit.Eventually(t, closeWait, func() error { return mint(t, conn) })
}

// refused reads signerd_connections_refused_total{cap}.
func refused(t *testing.T, reg *prometheus.Registry, cap string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "signerd_connections_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "cap" && lp.GetValue() == cap {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestLargeMessageRefusedAtSizeLimit is finding 4 of issue 7: a stream announcing a 4 MiB
// message (what gRPC's default limit allows) and sending it slowly made signerd wait for, and
// buffer, all of it. It is now refused with RESOURCE_EXHAUSTED as soon as the 5-byte message
// header is read, while the client has sent 1 KiB of the body.
func TestLargeMessageRefusedAtSizeLimit(t *testing.T) {
	f, r, _ := startLimited(t, "{}")
	tlsCfg, _, err := mtls.NewClientTLS(f.client, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", r.Addr().String(), tlsCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(closeWait)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hdr bytes.Buffer
	enc := hpack.NewEncoder(&hdr)
	for _, kv := range [][2]string{
		{":method", "POST"}, {":scheme", "https"}, {":path", "/cotal.signer.v1.SignerService/Mint"},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}); err != nil {
			t.Fatal(err)
		}
	}
	const streamID = 1
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: streamID, BlockFragment: hdr.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	// The gRPC message header: not compressed, 4 MiB long; then the first 1 KiB of it.
	msg := make([]byte, 5+1024)
	binary.BigEndian.PutUint32(msg[1:5], 4<<20)
	if err := fr.WriteData(streamID, false, msg); err != nil {
		t.Fatal(err)
	}

	dec := hpack.NewDecoder(4096, nil)
	for {
		frame, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no refusal of the 4 MiB message (%v)", err)
		}
		switch fr := frame.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame, *http2.PingFrame:
			continue
		case *http2.RSTStreamFrame:
			t.Fatalf("stream reset (%v) without a gRPC status", fr.ErrCode)
		case *http2.GoAwayFrame:
			t.Fatalf("connection closed (GOAWAY %v) without a gRPC status", fr.ErrCode)
		case *http2.HeadersFrame:
			fields, err := dec.DecodeFull(fr.HeaderBlockFragment())
			if err != nil {
				t.Fatal(err)
			}
			for _, hf := range fields {
				if hf.Name != "grpc-status" {
					continue
				}
				if hf.Value != strconv.Itoa(int(codes.ResourceExhausted)) {
					t.Fatalf("grpc-status %s, want %d (RESOURCE_EXHAUSTED)", hf.Value, codes.ResourceExhausted)
				}
				return
			}
		}
	}
}

// TestLimitsDoNotRefuseLargestRequest: a Mac over the largest payload signerd accepts (64 KiB)
// passes the receive limit, so the limit refuses only what no real caller sends.
func TestLimitsDoNotRefuseLargestRequest(t *testing.T) {
	f, r, _ := startLimited(t, "{}")
	conn := dial(t, r.Addr().String(), f.client)
	// managerd may not call Mac: the refusal must come from the policy, after the message was
	// received in full, not from the transport's size limit.
	_, err := signerv1.NewSignerServiceClient(conn).Mac(ctxT(t), &signerv1.MacRequest{
		Space: "alpha", Domain: signerv1.MacDomain(1), Payload: make([]byte, 64<<10)})
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied {
		t.Fatalf("a 64 KiB Mac from managerd: %v, want PERMISSION_DENIED from the policy", err)
	}
}

// TestConnectionAgeAndIdle is finding 4 (and 6) of issue 7: connections never aged out, so a
// client verified once kept its connection forever. An aged connection is closed and the next
// call makes a new one (a new handshake, verified afresh); an idle one is closed too.
func TestConnectionAgeAndIdle(t *testing.T) {
	t.Run("ok/aged-connection-replaced", func(t *testing.T) {
		f, r, _ := startLimited(t, "{max_connection_age: 300ms, max_connection_age_grace: 100ms}")
		conn := dial(t, r.Addr().String(), f.client)
		first, err := localAddr(t, conn)
		if err != nil {
			t.Fatalf("GetSpace: %v", err)
		}
		// A call racing the close of the aged connection may fail; only a call answered on
		// another connection ends the wait.
		testkit.Eventually(t, closeWait, func() error {
			a, err := localAddr(t, conn)
			if err == nil && a == first {
				err = errors.New("calls still use the first connection")
			}
			return err
		})
	})
	t.Run("ok/idle-connection-closed", func(t *testing.T) {
		f, r, _ := startLimited(t, "{max_connection_idle: 300ms}")
		conn := dial(t, r.Addr().String(), f.client)
		getSpace(t, conn)
		testkit.Eventually(t, closeWait, func() error {
			if s := conn.GetState(); s != connectivity.Idle {
				return errors.New("client connection is " + s.String())
			}
			return nil
		})
	})
}

// localAddr makes one call on conn and returns the client side address it used.
func localAddr(t *testing.T, conn *grpc.ClientConn) (string, error) {
	t.Helper()
	var p peer.Peer
	if _, err := signerv1.NewSignerServiceClient(conn).GetSpace(ctxT(t), &signerv1.GetSpaceRequest{Space: "alpha"}, grpc.Peer(&p)); err != nil {
		return "", err
	}
	if p.LocalAddr == nil {
		t.Fatal("no local address for the call")
	}
	return p.LocalAddr.String(), nil
}
