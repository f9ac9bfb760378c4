// Package daemon is the one way to be a Cotal daemon (STYLE.md §18): what authd, deliveryd and
// managerd each do once lives here, not in three copies.
//
//   - LoadConfig reads a configuration file strictly: bounded in size, plain YAML only, an
//     unknown key stops start-up naming it (pkg/yamlx).
//   - ScanSecrets refuses a configuration file or state directory that holds an operator,
//     account or curve seed, or a private JWK, naming the file. A daemon that holds no signing
//     key must not start next to one: signerd alone holds those (pkg/creds decodes them).
//   - WriteDiscovery and WriteRefusal publish readiness and a refused start as 0600 JSON files
//     in a 0700 directory, written atomically; the discovery file carries the daemon's state
//     (ready or unavailable) and is rewritten at each change. Ready waits for a ready file or a
//     refusal on behalf of a launcher, bound to the daemon's pid.
//   - NotifyContext ends a context on SIGINT or SIGTERM, and Notify sends sd_notify READY=1
//     when, and only when, systemd asked for it (NOTIFY_SOCKET set).
package daemon
