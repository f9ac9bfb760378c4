package signerclient

import "github.com/cotalgo/cotal/pkg/mtls"

// FileConfig is the `signer:` block every daemon's configuration file carries: signerd's address
// and the daemon's client certificate as files. Daemons embed it (authd, deliveryd) so the block
// reads the same everywhere.
type FileConfig struct {
	// Address is host:port or unix:/path. Required.
	Address string `yaml:"address"`
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
		TLS:        mtls.ClientFiles{CertFile: f.Cert, KeyFile: f.Key, ServerCAFile: f.CA},
		ServerName: f.ServerName,
		ServerID:   f.ServerID,
	}
}

// Missing names the required keys f lacks, each prefixed with prefix (say "signer.").
func (f FileConfig) Missing(prefix string) []string {
	var out []string
	for _, k := range []struct{ name, v string }{{"address", f.Address}, {"ca", f.CA}, {"cert", f.Cert}, {"key", f.Key}} {
		if k.v == "" {
			out = append(out, prefix+k.name)
		}
	}
	return out
}
