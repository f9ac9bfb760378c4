package exchange

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server timeouts and limits for the exchange listener: a loopback client that opens connections
// and never finishes a request is cut off, and headers are bounded, before any handler runs.
const (
	ReadHeaderTimeout = 5 * time.Second
	ReadTimeout       = 10 * time.Second
	WriteTimeout      = 30 * time.Second
	IdleTimeout       = 60 * time.Second
	MaxHeaderBytes    = 16 << 10
)

// NewServer wraps h in an http.Server with the timeouts and header limit above. authd's serve
// runs it on a listener that CheckLoopback accepted.
func NewServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// CheckLoopback refuses a listen address that is not a loopback IP literal (or localhost) with a
// port: the exchange face is for processes on this host, and a wildcard or LAN address would
// hand every peer the chance to guess at the cap.
func CheckLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("exchange: listen address %.100q: %w", addr, err)
	}
	if port == "" {
		return fmt.Errorf("exchange: listen address %.100q has no port", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("exchange: listen address %.100q is not a loopback address (127.0.0.1, ::1 or localhost)", addr)
	}
	return nil
}
