package main

import (
	"errors"
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
)

// The dev users, made once (system users, no home, their own group) and kept between runs:
// managerd runs as the first; the second is an unprivileged user for the tests (the agents run
// as uids of their own from the launcher's range, devAgentUIDFirst). Neither can read the
// signer's seeds.
const (
	managerUser = "cotal-dev-manager"
	agentUser   = "cotal-dev-agent"
)

type devUsers struct {
	mgrUID, mgrGID     uint32
	agentUID, agentGID uint32
}

// ensureDevUsers looks the dev users up, creating the missing ones with useradd.
func ensureDevUsers() (*devUsers, error) {
	var u devUsers
	for _, x := range []struct {
		name     string
		uid, gid *uint32
	}{{managerUser, &u.mgrUID, &u.mgrGID}, {agentUser, &u.agentUID, &u.agentGID}} {
		acct, err := user.Lookup(x.name)
		if err != nil {
			var unknown user.UnknownUserError
			if !errors.As(err, &unknown) {
				return nil, fmt.Errorf("look up %s: %w", x.name, err)
			}
			out, err := exec.Command("useradd", "-r", "-M", "-U", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", x.name).CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("useradd %s: %v: %s (the agent demo runs managerd and the agents as their own users)", x.name, err, out)
			}
			if acct, err = user.Lookup(x.name); err != nil {
				return nil, fmt.Errorf("look up %s after useradd: %w", x.name, err)
			}
		}
		uid, err := strconv.ParseUint(acct.Uid, 10, 32)
		if err != nil {
			return nil, err
		}
		gid, err := strconv.ParseUint(acct.Gid, 10, 32)
		if err != nil {
			return nil, err
		}
		if uid == 0 || gid == 0 {
			return nil, fmt.Errorf("dev user %s has uid %d gid %d: it must not be root", x.name, uid, gid)
		}
		*x.uid, *x.gid = uint32(uid), uint32(gid)
	}
	return &u, nil
}
