package manager

import (
	"os"

	"github.com/cotalgo/cotal/managerd/internal/launcher"
	"github.com/cotalgo/cotal/managerd/internal/term"
)

var _ Launcher = (*launcher.Client)(nil)

func newLauncherClient(c LauncherConfig) Launcher {
	return &launcher.Client{Socket: c.Socket, TokenFile: c.TokenFile}
}

// newTerm shares an agent's PTY master among attach sessions (the Terminal takes the master).
func newTerm(master *os.File) (Terminal, error) {
	return term.New(master, term.Options{})
}
