// Package service runs deliveryd, Cotal's durable delivery daemon for one space (the fan-out
// writer, the trusted reader and the ctl.delivery responders behind the space's single-instance
// lease), inside a Go process. `deliveryd serve` is a thin wrapper around it; a hosting platform
// embeds it the same way (STYLE.md §18, seeds 000 and 004). It holds no signing key: signerd
// mints and renews its delivery credential.
//
// # Starting
//
//	cfg, err := service.LoadConfig("/etc/cotal/deliveryd.yaml") // or build a *service.Config
//	...
//	svc, err := service.Start(ctx, service.Inputs{
//		Config: cfg,
//		Hosted: &service.Hosted{Account: account, LifecycleUID: uid, StoreIdentity: store},
//	}, service.RuntimeOptions{Logger: logger, Events: onEvent})
//	var se *service.StartError
//	if errors.As(err, &se) { /* se.Code says why: CodeLeaseHeld, CodeAccount, CodeMissing, ... */ }
//	defer svc.Close(context.Background())
//
// Inputs is what to run: the configuration (required; Config.Validate fills its defaults) and,
// for a hosting platform, the Hosted context (nil is the CLI path). RuntimeOptions is how: the
// logger, the Events callback, the pid, extra broker connection options, the environment.
//
// Start returns once deliveryd serves, never earlier: the delivery credential minted through
// signerd (its own user nkey, generated in memory) and proven on the broker; one connection and
// one authenticated reachability probe; every stream and bucket the daemon uses opened, never
// created (a missing one is named: provision the space); the lease (key lease.0 of
// cotal_delivery_<space>) created with ready false; the fan-out writer, the trusted reader, the
// ctl.delivery and ctl.delivery-admin responders and the liveness rail bound; the mandatory watch
// on lease.0 bound; the lease marked ready. A refused start is a *StartError with a stable code
// (Code* constants) and closes everything it opened: a start refused after the lease was created
// releases it. Canceling ctx before Start returns refuses with CodeCanceled; canceling it later
// stops the service as Close does.
//
// # Hosted context
//
// Hosted (daemon.Hosted, the same value authd takes) carries what a platform assigned this
// instance, every field required: Account, the data account public key (A…) its delivery
// credential must belong to; LifecycleUID, the instance's lifecycle uid (it names the instance in
// the lease row when the configuration names no holder); StoreIdentity, the identity of the store
// the platform renews credentials through (ctl.delivery-admin's reloadStoreIdentity answers it,
// {kind:"injected", identity}, instead of the signer endpoint). Start refuses a malformed context with CodeConfig, and a first
// credential of another account (its issuer_account, or its issuer when the account key signed
// it) with CodeAccount, before it connects: no lease row, no connection and no file is left. A
// hosted Start writes no file at all (no state file, no refusal file) and never notifies systemd;
// a failed or stopped hosted instance never exits the process.
//
// # Readiness and events
//
// State (also Ready) is what a host routes on:
//
//	starting     Start has not returned
//	ready        serving: lease held and renewed on the current connection, everything bound
//	unavailable  alive but not serving: the broker connection dropped (CodeBroker), the broker
//	             closed it as the credential expired (CodeCredential), the lease is being
//	             re-checked after a failed renewal, a fallen fence or a foreign write (CodeLease),
//	             or Drain is under way (CodeDraining)
//	stopped      final; Err says why
//
// unavailable returns to ready by itself: a reconnect followed by a stored lease renewal, a
// proven credential renewal, or a lease re-check that resumes. A broker that stays gone past the
// broker-gone window (broker_gone, COTAL_DELIVERY_BROKER_GONE_MS; 15 s by default), or a
// credential that expires without renewal, stops the service (Err matches ErrBrokerGone or
// ErrCredentialExpired): a hosted instance then closes without exiting the process, and the host
// may Start another; `deliveryd serve` exits 1 and its supervisor restarts it. A lease taken by
// another instance (ErrLeaseTaken) or gone and taken before it was created again (ErrLeaseLost)
// stops it too.
//
// RuntimeOptions.Events receives every change of state (EventState, with the code of the cause)
// and every nonfatal condition deliveryd survives (EventWarning): a failed credential renewal it
// retries (CodeCredential), a broker connection error (CodeBroker), a failed lease renewal, a
// failed resume it retries, an unknown lease state, a release it retries (CodeLease), a wait for
// the broker before the release (CodeBroker). Events never carry a seed or JWT. The callback runs
// on deliveryd's goroutines, in order: it must not block or call back into the Service.
//
// On the CLI path (no Hosted) the state is also written, at every change, to the state file
// <state_dir>/delivery-service.json {ver, pid, state} (pkg/daemon WriteState, 0600, atomic), once
// this instance holds the lease; a reader trusts it only while pid is alive. A refused start
// writes <state_dir>/delivery-service-refusal.json instead (code, reason, details).
//
// # Stopping
//
// Close withdraws serving (the loops and responders stop, unacked messages redeliver to the next
// holder) and releases only this instance's lease: it deletes the row by CAS if it is still its
// own. If the connection is down, or drops while the release is in flight, it waits for a
// reconnect up to the broker-gone window from the drop (at most shutdown_timeout, and no longer
// than ctx allows) and repeats the release once before it decides. It returns nil when the row is
// released or was already gone, and a *ReleaseError otherwise: ErrReleaseUnconfirmed (the broker
// did not confirm the release; the row expires with its 30 s TTL and a successor is refused until
// then) or ErrForeignRow (another instance's row is there: this one held no lease to release).
// After a fatal stop Close returns the outcome of the release that stop made (a broker gone past
// its window is ErrReleaseUnconfirmed).
//
// Drain is Close after the work in flight: it stops intake (the responders are unbound so no new
// request is taken, the loops fetch no new pass), lets the requests and passes in flight finish
// (their messages acked, so nothing waits out the 60 s ack wait on the next holder), then closes
// as Close does, with the same promise. ctx bounds the whole; past it, what is still in flight is
// abandoned (it redelivers) and the release is made. Close and Drain are idempotent and safe to
// call concurrently; each returns the same outcome. Done is closed once everything is down; Err
// is then daemon.ErrStopped after Close or Drain, context.Canceled after Start's ctx ended, or the
// fatal cause.
//
// # How the lease fences the work
//
// Every effect of the writer, the reader and the responders is fenced by MayAct: not quiesced,
// the lease's fence not fallen (pkg/lease: the send time of the last write of the row the broker
// stored, plus the TTL, less the margin, so nothing is done once the row could have expired), and
// no reconnect since the lease was last renewed. The broker connection keeps no reconnect
// buffer, so nothing published while it was down is sent when it comes back; a reconnect
// prompts a renewal at once, and only a stored renewal on the new connection lifts the fence.
// A failed renewal, a fallen fence, or a foreign row or a delete seen by the watch, quiesces the
// daemon (loops and responders stopped), withdraws readiness (best effort), re-reads the key and
// acts (reference/delivery.md §2): held resumes; gone creates the row again and resumes (failing
// to create it is fatal; a resume that fails to bind stays quiesced and is retried for up to one
// lease TTL); taken is fatal and the row is left alone; unknown stays quiesced and asks again.
// The broker-gone watchdog turns a connection down for too long into a fatal stop, as does a
// credential that expired without renewal.
//
// ctl.delivery-admin's reloadCreds renews the credential now (prove, then adopt); it is refused
// with "this daemon has not finished starting", adopting nothing, until Start has finished (after
// the lease watch is bound): the lease can be ready before that.
//
// deliveryd serves the delivery plane's liveness rail (upstream #1577): an empty request on
// live.delivery.<owner>.<actor> with a reply subject under it (.reply.<nonce>) is answered
// {"plane":"delivery","responder":"bound"|"unbound","instance":<token>}, in the queue group
// live.delivery, from the first bind until Close. It is graded from this instance's own state:
// bound while MayAct holds and the lease row is ready, unbound otherwise; instance is an opaque
// token drawn at start, which tells two responders apart and names nothing else. A request
// whose reply subject is not under its own subject is dropped.
package service
