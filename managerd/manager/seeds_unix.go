package manager

import "syscall"

// syscallNoFollow is O_NONBLOCK (a FIFO must not hang the check) and O_NOFOLLOW for entries found by the walk; the named path itself may be a
// link (a deployment may point at the key directory through one).
func syscallNoFollow(top bool) int {
	if top {
		return syscall.O_NONBLOCK
	}
	return syscall.O_NOFOLLOW | syscall.O_NONBLOCK
}
