// Package launcher is managerd's uid-dropping launcher: the one Cotal process that holds
// CAP_SETUID and CAP_SETGID (or runs as root), so that managerd never does. managerd with
// CAP_SETUID could start a child as any uid, root included; the launcher starts each agent as a
// uid of its own from the range its own configuration names (agents: uid_first, uid_count; the
// gid is the same number, no supplementary group), and nothing else. A request never names a uid.
//
// The server (Start, run by `managerd launcher --config FILE`) listens on a Unix socket, 0660 in
// a 0750 directory of managerd's group. Each connection carries one request and gets one answer:
//
//  1. The peer's uid (SO_PEERCRED, fixed at connect) must be managerd's configured uid; root and
//     every other uid are refused (PEER_NOT_ALLOWED) before a byte is read.
//  2. The frame is at most MaxRequestBytes (TOO_LARGE before the body is read) and decodes as
//     strict JSON (no unknown field, nothing after it).
//  3. The capability token, a random 32-byte secret the launcher writes at each start to a 0600
//     file in a 0700 directory owned by managerd, must match (constant-time; TOKEN_INVALID).
//  4. The values: the agent name matches ^[A-Za-z0-9_-]+$ (one path segment: no "/", no ".."),
//     the connector is in the launcher's table (the request carries no command), the request
//     names no uid or gid (TARGET_NOT_ALLOWED), each environment key is in env_allow.
//  5. Only then: the least recently released free uid of the range is taken (UIDS_EXHAUSTED when
//     none is free) and its cgroup, <cgroup_parent>/cotal-agent-<uid>, made; <agent_root>/<name>
//     is made or adopted through a descriptor on the root (no symbolic link followed) and set to
//     uid:manager 0750; the request's launch material is written to launch-material in it (0600,
//     the agent's); a PTY is opened and given to the uid; this binary is started as the agent's
//     trampoline (TrampolineArg) inside the cgroup from its first instruction (CLONE_INTO_CGROUP),
//     in a new session with the PTY as its controlling terminal, with an environment of PATH,
//     HOME, the allowed request variables and COTAL_LAUNCH_MATERIAL and none of the launcher's
//     own; the trampoline marks every descriptor above 2 close-on-exec, sets no supplementary
//     group, the gid, an empty capability bounding set, the uid (all four Uid fields), empty
//     capability sets and PR_SET_NO_NEW_PRIVS, proves them from /proc/thread-self/status, and
//     execs the connector's argv.
//  6. The answer carries the child's pid, its start time (field 22 of /proc/<pid>/stat, which
//     the trampoline reports: the launcher never reads its agents' /proc entries, which
//     ProtectProc=invisible may hide) and its uid and, as SCM_RIGHTS, the PTY master.
//
// Containment (cgroup.go says why a cgroup and not a PID namespace): the agent's life is its
// leader's. When the leader exits, the launcher (its parent, waitid without reaping) kills
// whatever is left in the agent's cgroup (cgroup.kill: a descendant that called setsid or
// double-forked too), waits until cgroup.events says populated 0, removes the cgroup, removes the
// launch material and gives the directory back to the launcher's uid (so the uid's next holder
// cannot enter it), frees the name and the uid, and only then reaps the leader. Start refuses to
// run without a writable cgroup v2 (no fallback), and first kills and removes any agent cgroup of
// its range a predecessor left.
//
// Because managerd runs as another uid than the agents, it cannot signal them itself: the
// launcher's signal operation (Client.Signal) sends SIGTERM to the process group, or SIGKILL to
// the whole cgroup, of a child it started and has not released, named by pid and start time; a
// probe (signal 0) answers CHILD_UNKNOWN only once the child is released. Terminate sends SIGTERM,
// then SIGKILL after a grace period, and returns once Child.Gone proves the leader gone from /proc
// and the launcher's probe proves its whole cgroup gone.
//
// managerd renews each agent's credential, but cannot write the agent's 0600 material file: the
// replace_material operation (Client.ReplaceMaterial), for a child the launcher started whose
// leader has not exited (pid and start time), writes the new material to a fresh file in the agent's
// directory (the agent's, 0600, at most MaxMaterialBytes), opened through the agent root's
// descriptor with no symbolic link followed, and renames it over launch-material.
//
// `managerd launcher` first closes every descriptor it inherited (CloseInheritedFDs), so nothing
// its starter left open reaches an agent.
//
// Client is managerd's side: Launch returns the Child and the PTY master as an *os.File.
package launcher
