package testkit_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/cotalgo/cotal/pkg/testkit"
)

// TestHoldProxy: an armed proxy withholds the replies on the connection that sent the marker,
// and only there, until Free; the target's echo then arrives whole, and a later Arm does not
// hold that connection again.
func TestHoldProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	p := testkit.StartHoldProxy(t, ln.Addr().String())
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c, bufio.NewReader(c)
	}
	echo := func(c net.Conn, r *bufio.Reader, line string) (string, error) {
		if _, err := io.WriteString(c, line+"\n"); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		got, err := r.ReadString('\n')
		_ = c.SetReadDeadline(time.Time{})
		return got, err
	}
	a, ar := dial()
	b, br := dial()
	if got, err := echo(a, ar, "before"); err != nil || got != "before\n" {
		t.Fatalf("unarmed echo = %q, %v", got, err)
	}
	p.Arm("HOLD")
	if got, err := echo(a, ar, "HOLD me"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("held echo = %q, %v; want it withheld", got, err)
	}
	if got, err := echo(b, br, "other"); err != nil || got != "other\n" {
		t.Fatalf("echo on another connection = %q, %v; want it passed", got, err)
	}
	if n := p.Held(); n != 1 {
		t.Fatalf("Held = %d; want 1", n)
	}
	p.Free()
	_ = a.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := ar.ReadString('\n'); err != nil || got != "HOLD me\n" {
		t.Fatalf("freed echo = %q, %v", got, err)
	}
	// A new Arm does not hold again what the last one held and Free let go.
	p.Arm("AGAIN")
	if got, err := echo(a, ar, "after"); err != nil || got != "after\n" {
		t.Fatalf("echo on a freed connection under a new Arm = %q, %v; want it passed", got, err)
	}
	if n := p.Held(); n != 0 {
		t.Fatalf("Held after a new Arm = %d; want 0", n)
	}
}
