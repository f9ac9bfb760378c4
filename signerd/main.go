// Command signerd is the only Cotal process that holds signing seeds. It serves SignerService
// over mutual TLS and is also the operator tool that creates the trust (init, pki init) and
// checks policies and audit logs. See `signerd --help`.
package main

import (
	"context"
	"os"

	"github.com/cotalgo/cotal/signerd/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
