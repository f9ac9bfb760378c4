package exchange_test

import (
	"strings"
	"testing"

	"github.com/cotalgo/cotal/authd/internal/exchange"
)

func TestCheckLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		err  string
	}{
		{addr: "127.0.0.1:8081"},
		{addr: "127.0.0.1:0"},
		{addr: "[::1]:8081"},
		{addr: "localhost:8081"},
		{addr: "0.0.0.0:8081", err: "not a loopback"},
		{addr: ":8081", err: "not a loopback"},
		{addr: "[::]:8081", err: "not a loopback"},
		{addr: "192.168.1.2:8081", err: "not a loopback"},
		{addr: "example.com:8081", err: "not a loopback"},
		{addr: "127.0.0.1", err: "missing port"},
		{addr: "127.0.0.1:", err: "no port"},
	} {
		name := "ok/" + tc.addr
		if tc.err != "" {
			name = "fail/" + tc.addr
		}
		t.Run(name, func(t *testing.T) {
			err := exchange.CheckLoopback(tc.addr)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("CheckLoopback(%q) = %v, want %q", tc.addr, err, tc.err)
			}
		})
	}
}

func TestNewServerLimits(t *testing.T) {
	s := exchange.NewServer(nil)
	if s.ReadHeaderTimeout != exchange.ReadHeaderTimeout || s.ReadTimeout != exchange.ReadTimeout || s.WriteTimeout != exchange.WriteTimeout ||
		s.IdleTimeout != exchange.IdleTimeout || s.MaxHeaderBytes != exchange.MaxHeaderBytes {
		t.Fatalf("server limits = %+v", s)
	}
}
