package signerdtest

import (
	"crypto/x509"
	"net"
)

func loopbackIPs() []net.IP { return []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback} }

func serverUsages() []x509.ExtKeyUsage {
	return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
}
