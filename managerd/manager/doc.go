// Package manager is managerd, the signerless agent supervisor of one space on one machine, as
// a host embeds it. `managerd serve` is a thin wrapper around it (it adds sd_notify and the
// systemd watchdog), so an embedded manager is the daemon, not a lookalike.
//
// # Embedding
//
//	cfg, err := manager.LoadConfig("/etc/cotal/managerd.yaml") // or build a *manager.Config
//	m, err := manager.Start(ctx, manager.Inputs{Config: cfg}, manager.RuntimeOptions{
//		Logger: log,
//		Events: func(e manager.Event) { host.Route("managerd", e.State) }, // must not block
//	})
//	var se *manager.StartError // every refusal; se.Code is CodeLeaseHeld, CodeSigner, ...
//	if errors.As(err, &se) { ... }
//	...
//	err = m.Close(ctx) // agents keep running; an error if the lease release was not confirmed
//
// Start returns only once the manager serves, and runs it until ctx ends (a default shutdown),
// Close or Shutdown. The handle says where it is: State (StateStarting, StateReady,
// StateUnavailable, StateStopped) and Ready, Done and Err once stopped. Events receives every
// state change and every nonfatal warning (EventWarning: a failed renewal it retries, the
// broker connection lost, a lost or re-put lease, launcher or custody trouble), each with a
// stable Code (the Code constants); none carries a seed, JWT or token.
//
// # What it runs
//
// Start, in order: the configuration is validated (Config.Validate); the signer's key paths
// (Config.SignerSeedPaths) are proven unreadable to this uid, upstream's "seed readable by the
// manager uid" refusal (only Inputs.AllowReadableSeeds, the development flag, lets a single-uid
// stack past it, with a loud warning); the supervisor credential is minted by signerd for a key
// held only in memory and proven on the broker (a signerd that cannot be reached refuses the
// start); the broker connection (reconnecting for ever); the instance lease lease.<instance_id>
// in cotal_manager_<space> (a live holder refuses with a *LeaseHeld cause; a dead predecessor on
// this root is waited out); a predecessor's agents are reaped from their custody records; the
// manager liveness plane; ManagerService (gRPC) on Config.API.Socket, admitting only the peer
// uids of Config.API.AllowUIDs. A refusal leaves nothing running and nothing held. Once it serves,
// a background loop asks authd on the register-manager rail to register this start of the
// instance, retrying until it does (it never refuses the start nor holds up Ready), then records
// the committed epoch in the lease row and writes IdentityFile in Config.StateDir
// (Manager.Registration; register.go).
//
// A remote managerd (Config.Authority "remote"; remote.go) holds no signerd certificate: its
// identity (RemoteIdentityFile) is loaded or made, the supervisor credential is prepared by
// authd's manager-service authority (Inputs.RemoteAuthority, by default the HTTPAuthority client
// of Config.AuthorityURL) and proven on the broker, the lease is taken as the gate principal
// <owner>.manager_serve_<instance id>, and the authority activates this start before it serves
// (its epoch and revision in the lease row); renewals ask the authority too. Its Spawn enrolls
// the agent at the authority and launches it with the exchange form of its launch material
// (enroll.go); its Stop retires the agent's lifecycle through the authority and the
// retire-lifecycle rail, keeping a pending-retirement record until it is retired (retire.go).
//
// Spawn (ManagerService, or Backend in process) admits a request before any signer call (name,
// connector, capacity counting spawns in progress, channels, environment), then per agent: a
// fresh user nkey and lifecycle uid, its durables and ACL row through a one-shot provisioner
// credential, its credential minted by signerd (agent profile), and its launch through the
// Launcher, which writes the launch material (credential included) 0600 as the agent's uid and
// starts it on a PTY. Each agent's credential is reminted for the same nkey at 75% of its
// lifetime and its material replaced through the launcher; a failed renewal keeps the last good
// credential, raises a RENEWAL warning and retries. Stop ends one agent (SIGTERM to its group,
// SIGKILL after the grace) and, once its process is proven gone, deprovisions exactly its
// durables, ACL row and membership rows on its concrete read channels with a one-shot
// deprovisioner credential (provision.RunDeprovisionAgent; the response lists what it removed,
// and a slot left uncertain refuses the Stop, which a later Stop retries). A custody record of each
// running agent in Config.StateDir lets the next manager on that directory reap what this one
// left.
//
// State is StateReady while the manager holds its instance lease on a live broker connection,
// and StateUnavailable while the lease is not confirmed (its renewal failing, its row taken by
// another), the connection is down, the supervisor credential has expired, or a shutdown runs;
// it comes back to StateReady on its own. Unavailable is reported, not enforced: ManagerService
// keeps answering and a spawn is not refused for it (no ManagerService reason names a lost lease
// yet; one that needs the broker fails at that step), so a host routes around an unavailable
// manager.
//
// # What it holds
//
// No seed: signerd holds every signing key, and this package links no signerd code (a test
// proves it). The manager holds user nkeys it generates in memory (its own supervisor key; each
// agent's key, kept for remint proofs and wiped at stop) and the JWTs signerd mints for them;
// an agent's key leaves the process only in its launch material, through the launcher. There is
// therefore no secret store to inject.
//
// # What the host provides
//
//   - signerd, reachable at Config.Signer.Address over mTLS: its CA file and a managerd client
//     certificate and key for this space (spiffe://<trust domain>/managerd/<space token>), whose
//     policy lets it mint the supervisor, agent, provisioner and deprovisioner profiles.
//   - A provisioned space on the brokers (Config.Brokers): the cotal_manager_<space> bucket with
//     its TTL, the DM and DLV streams and the ACL bucket.
//   - The launcher: `managerd launcher` running as root (or with CAP_SETUID and CAP_SETGID) on
//     Config.Launcher.Socket, with the token file it writes at Config.Launcher.TokenFile; or a
//     RuntimeOptions.Launcher of the host's that keeps the Launcher promises.
//   - Config.StateDir (0700, the manager's uid) and a path for Config.API.Socket (its directory
//     is made 0750 if missing).
//   - Signer keys unreadable to this process's uid, named in Config.SignerSeedPaths: run the
//     manager as its own uid, never signerd's.
//
// Whatever the host supplies (the Launcher, the Provisioner, the Events, OnFirstSeen and Now
// callbacks, the Logger's handler) may fail in any way: a panic with any value, or an error that
// cannot be read, is recovered, logged, raised as a HOOK warning and refused with its text
// (RejectionText; "an unreadable rejection" when even that panics), and the manager keeps
// serving (rejection.go). A panic in a ManagerService call is INTERNAL for that call only.
//
// Inputs carry no hosted context (assigned account, lifecycle uid, store identity): the account
// the manager's credentials belong to is signerd's policy for its client certificate.
//
// # Upstream Manager rules
//
// Kept: start is single-flight and a failed start holds nothing; stop runs once and later calls
// join it (one asking the other mode is refused SHUTDOWN_CONFLICT); a default stop spares the
// agents, with_agents stops and deprovisions every one, and the lease is released only once
// each is proven gone, else it is kept and the stop fails loud; the instance lease (bucket,
// per-instance key, 10 s TTL, renewal every TTL/4 with a 2 s deadline, row {holder, instanceId,
// runtime, root, pid, since}); a lost key is put again and does not end the process, and a
// stopping manager never re-puts it; serveLiveness("manager"); a fresh nkey and lifecycle uid
// per spawn, durables through a one-shot provisioner and removal through a target-pinned
// one-shot deprovisioner; agent credentials reminted for the same nkey at 75%, the last good one
// kept on failure; launch material 0600 with only its path in the environment; SIGTERM, then
// SIGKILL after 3 s; a host learns nonfatal conditions as warnings, not log lines.
//
// Changed: upstream's Manager reads the space's signer through its secretStore and mints in
// process; here signerd mints every credential for public keys this process sends, over mTLS,
// and nothing signing is in the manager's memory. Agents run as uids of their own through the
// root launcher instead of at the manager's uid. Start takes typed Inputs and RuntimeOptions
// (upstream: `new Manager(opts)` and `start()`). The control surface is ManagerService on a
// Unix socket gated by SO_PEERCRED, not the broker-registered v0.4 endpoint and the loopback
// HTTP console. A lost lease or broker connection is reported as StateUnavailable; upstream's
// exit after about 40 s without its connection is not done (the manager reconnects for ever,
// and a host that wants the exit watches State).
//
// Left out: daemon-credential renewal ownership (remintDaemonCreds; deliveryd renews its own
// credential from signerd); static-slot reconciliation, v0.4 registration, issuance gates and
// epochs, the goal writer, the §13.6 session plane (ManagerService Attach replaces it),
// workflow restarts, user-auth mode, runtimes other than pty, persona files and rosters; the
// CLI's pidfile and `cotal down --with-agents` intent file (ManagerService.Shutdown with
// with_agents replaces it); the mesh registry record, COTAL_HOME and the workspace root
// (Config.Root only names this instance's root in its lease row).
package manager
