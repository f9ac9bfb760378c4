package signerclient

import (
	"strings"

	"github.com/cotalgo/cotal/pkg/mtls"
)

// FileConfig is the `signer:` block every daemon's configuration file carries: signerd's address
// (or its replicas' addresses) and the daemon's client certificate as files. Daemons embed it
// (authd, deliveryd, managerd) so the block reads the same everywhere.
type FileConfig struct {
	// Address is host:port or unix:/path. Exactly one of Address and Addresses is required.
	Address string `yaml:"address"`
	// Addresses lists several signerd replicas, each host:port or unix:/path, no duplicates
	// (Config.Addrs): calls spread over the healthy ones and fail over between them.
	Addresses []string `yaml:"addresses"`
	// CA is the bundle signerd's certificate must chain to. Required.
	CA string `yaml:"ca"`
	// Cert and Key are the daemon's client certificate (URI SAN spiffe://<td>/<daemon>/<space>)
	// and key. Required.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
	// ServerName is the name signerd's certificate is verified for; default "localhost".
	ServerName string `yaml:"server_name"`
	// ServerID, if set, is the SPIFFE ID signerd's certificate must carry.
	ServerID string `yaml:"server_id"`
}

// ClientConfig is the Dial configuration for f.
func (f FileConfig) ClientConfig() Config {
	return Config{
		Addr:       f.Address,
		Addrs:      f.Addresses,
		TLS:        mtls.ClientFiles{CertFile: f.Cert, KeyFile: f.Key, ServerCAFile: f.CA},
		ServerName: f.ServerName,
		ServerID:   f.ServerID,
	}
}

// Missing names the required keys f lacks, each prefixed with prefix (say "signer."); "address"
// when neither Address nor Addresses is set. Dial checks the addresses themselves
// (one of the two keys, each well formed, no duplicate), so a daemon refuses a bad list at
// start.
func (f FileConfig) Missing(prefix string) []string {
	var out []string
	if f.Address == "" && len(f.Addresses) == 0 {
		out = append(out, prefix+"address")
	}
	for _, k := range []struct{ name, v string }{{"ca", f.CA}, {"cert", f.Cert}, {"key", f.Key}} {
		if k.v == "" {
			out = append(out, prefix+k.name)
		}
	}
	return out
}

// Endpoint names where credentials come from, for a report: Address, or the Addresses joined
// with ",".
func (f FileConfig) Endpoint() string {
	if f.Address != "" {
		return f.Address
	}
	return strings.Join(f.Addresses, ",")
}
