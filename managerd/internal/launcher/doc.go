// Package launcher is managerd's uid-dropping launcher: the one Cotal process that holds
// CAP_SETUID and CAP_SETGID (or runs as root), so that managerd never does. managerd with
// CAP_SETUID could start a child as any uid, root included; the launcher starts agents as the
// one agent uid its own configuration names, and nothing else.
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
//     the connector is in the launcher's table (the request carries no command), a uid or gid the
//     request names is the configured agent's (TARGET_NOT_ALLOWED otherwise), each environment
//     key is in env_allow.
//  5. Only then: <agent_root>/<name> is made or adopted through a descriptor on the root (no
//     symbolic link followed) and set to agent:manager 0750; the request's launch material is
//     written to launch-material in it (0600, the agent's); a PTY is opened; the connector's argv
//     is started with setgroups/setgid/setuid to the agent uid (all four Uid fields), in a new
//     session with the PTY as its controlling terminal, with an environment of PATH, HOME, the
//     allowed request variables and COTAL_LAUNCH_MATERIAL, and none of the launcher's own.
//  6. The answer carries the child's pid and start time (field 22 of /proc/<pid>/stat) and, as
//     SCM_RIGHTS, the PTY master.
//
// The launcher reaps its children. Because managerd runs as another uid than the agents, it
// cannot signal them itself: the launcher's signal operation sends SIGTERM or SIGKILL to the
// process group of a child it started and has not reaped, named by pid and start time (Client.Signal).
// Terminate sends SIGTERM, then SIGKILL after a grace period, and returns once Child.Gone proves
// the child gone from /proc (no waitpid: managerd is not the parent).
//
// managerd renews each agent's credential, but cannot write the agent's 0600 material file: the
// replace_material operation (Client.ReplaceMaterial), for a child the launcher started and has
// not reaped (pid and start time), writes the new material to a fresh file in the agent's
// directory (the agent's, 0600, at most MaxMaterialBytes), opened through the agent root's
// descriptor with no symbolic link followed, and renames it over launch-material.
//
// Client is managerd's side: Launch returns the Child and the PTY master as an *os.File.
package launcher
