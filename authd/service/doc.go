// Package service is authd, Cotal's auth service for one space (the NATS auth-callout responder,
// the loopback token exchange and the actor ledger), as a library a host embeds. `authd serve`
// is a thin wrapper around it (STYLE.md §18); a hosted platform runs the same code inside its
// own process, beside deliveryd's and managerd's runners.
//
// # Starting
//
//	cfg, err := service.LoadConfig("/etc/cotal/authd.yaml") // or build a service.Config
//	if err != nil { ... }
//	svc, err := service.Start(ctx, service.Inputs{Config: cfg}, service.RuntimeOptions{
//		Logger: log,
//		Events: func(e service.Event) { ... }, // must not block
//	})
//	var se *service.StartError
//	if errors.As(err, &se) { ... se.Code ... }
//	defer svc.Close(context.Background())
//
// Inputs is what to run: the Config (required; Start validates it and applies its defaults, so a
// host may fill in only the required fields), for a hosted context Hosted, and the local
// managerd's identity reader LocalManager. RuntimeOptions is how: the logger, the event callback,
// the clock, the pid the files name, the IdP's HTTP client, extra broker options, the broker-gone
// window, the interactive manager selection policy and the lifecycle Hooks. Config's nested types
// are aliased here (Signer, Rate, Duration), so a host outside this module can name everything it
// builds. The service itself never speaks to systemd: `authd serve` passes Hooks that send
// sd_notify READY=1 (OnReady) and STOPPING=1 (OnStopping).
//
// Start returns only once authd serves, and nothing it began survives a refusal. In order: the
// signerd client; the data-account connection on an auth-plane credential from the signer rail;
// the store check (cotal_auth_<space> and the lifecycle records store cotal_records_<space> must
// exist as provision.Plan makes them, else CodeStore naming the bucket: provision the space);
// the plane claim (key "plane" of cotal_auth_<space>: one authd per space); the lifecycle
// authority on the plane connection (its data account GetSpace's, which must be the plane
// credential's own, else CodeAccount); the boot resume of retirements a previous authd left
// owed (an intent that does not decode is CodeStore) and the retire-lifecycle rail; the callout
// connection on the auth-callout credential for authd's registered callout user key and the
// responder subscribed and flushed; the exchange listener bound, then the public face's when
// public_listen is set; the claim marked ready; and last the discovery file auth-service.json
// {ver, url, pid, cap, state, publicUrl?} (the CLI path only). A
// refused start is a *StartError (errors.As) with a stable Code (CodeConfig, CodeSigner,
// CodePlaneHeld, CodeAccount, CodeStore, ...); on the CLI path it is also written to
// auth-service-refusal.json {ver, pid, code, reason, details} (a second authd names the holder
// of the claim). A start whose ctx ends first is CodeCanceled and writes nothing.
//
// # The handle
//
// URL is the loopback exchange face. Cap is the per-start capability that authorizes the
// loopback host actions (auth-service.json's cap); it is never logged, and a host keeps it in
// the authority process. PublicURL is public_url, the https URL a TLS proxy publishes the
// public face at (exchange.NewPublic: /health, /jwks, /exchange without the cap or a view,
// /.well-known/cotal-mesh; no loopback door), or "" without public_listen. State and Ready say
// whether to route to this instance; Done is closed once it has stopped and Err says why. Close
// withdraws serving, releases the plane claim if it is still this instance's, closes every
// connection, and reports whether the release was confirmed (ErrReleaseUnconfirmed when the
// broker could not confirm it: the claim then expires with its TTL). Close is idempotent and
// returns the same answer to every caller, also after a stop the service decided itself.
//
// # Managed lifecycles
//
// Only managed rows (ledger managed-actors) have lifecycle heads and issuance gates. A managed
// agent's exchange activates its lifecycle at its row's uid before signerd signs its bearer,
// and the callout admits a managed row only while its gate is open (leader-read on every
// connect). A host activates one exact lifecycle at the uid it chose with POST
// /managed-lifecycle/activate on the loopback face (the cap, the closed body {accountPublicKey,
// owner, actor, lifecycleUid}; accountPublicKey must be the space's data account), or in
// process with ActivateManagedLifecycle, which refuses unless the service is ready. Refusals
// are *LifecycleError with a LifecycleCode; RetirementBegun says a retirement blocks the
// lifecycle. Every write re-checks that this instance holds the plane claim.
//
// A host retires one with POST /managed-lifecycle/retire ({owner, actor, lifecycleUid}, the
// same guards) once the managed grant at that uid is revoked (409 otherwise); a remote
// manager's retirement requester asks on the retire-lifecycle rail. Both join one barrier per
// uid: the gate freezes at once (no new bearer, no new connection), then the barrier waits for
// the alias's live connections to end (at most the 300 s bearer lifetime, plus 5 s) before it
// retires the gate and the head; 200 {retired:true} confirms it, and 503 means it is not done
// yet and the gate stays frozen (call again, or the next start resumes it).
//
// # Service endpoints
//
// With service_endpoints (Config.ServiceEndpoints, default off) both faces also serve GET and
// POST /service-endpoint-authority (seed 002; authd/internal/sepdoor): GET names the space's
// data account, the service token issuer and the keys /jwks publishes; POST takes a {request,
// proof} envelope, checks the proof against the kind x proof matrix (an operator proof needs the
// cap, and only the loopback face accepts one) and hands the request to the lifecycle
// authority. A door's failed proofs count in its face's /exchange failure window. Off, the
// route is 404 on both faces.
//
// # Manager-service authority
//
// Both faces serve POST /manager-service-authority (issue 25; authd/internal/msadoor, wire in
// pkg/managerauthority; the loopback door needs the cap): a remote manager's prepare, activate,
// renew and retire under the owner of an IdP token whose interactive row holds supervise, and the
// managed-agent kinds: enrollment runs the stock enrollment writer (authority.EnrollManagedAgent,
// its durables on authd's own provisioner, enroll.go). Its failed proofs count in the face's
// /exchange failure window. A prepare-retirement, under the target alias's lock, fences
// the target lifecycle's ACL row, reads deliveryd's lifecycleMemberships inventory on the plane
// connection (as local.authd), removes the footprint (the two durables, the ACL row and the
// membership rows on the grant's concrete allowSubscribe channels and the inventory's) on
// one-shot deprovisioner credentials, and then revokes the managed grant; the head is untouched.
// An unreadable inventory still removes what the grant names, keeps the grant and answers 503
// for a retry; a grant already gone is a no-op with zero counts.
//
// POST /manager-service-authority/verify-enrollment (loopback only: the retire door's guards and
// the cap; 404 on the public face) takes {owner, request} from a platform that keeps the
// managed-agent writers itself, and decides the enrollment, prepare-retirement, runtime-create
// and runtime-status kinds with the authority's checks; it writes nothing.
//
// # Readiness and events
//
// The state moves StateStarting -> StateReady -> StateUnavailable -> StateReady ... ->
// StateStopped, reported through State, through an EventState event, and (CLI path) through
// auth-service.json's state, which is rewritten atomically at each change and removed at stop;
// daemon.Ready (and Ready here) treats a file saying unavailable as not ready. authd is
// unavailable while:
//
//   - a broker connection (the data-account one or the callout one) has been down longer than
//     the broker-gone window (RuntimeOptions.BrokerGone, DefaultBrokerGone: 5 s, which rides
//     out a broker restart or a cluster failover and falls before the plane fence, at least 12 s
//     after a loss at the default plane_ttl); it is ready again once every connection is back;
//   - the plane claim is fenced (CodeFence): the service then stops with ErrPlaneLost;
//   - a credential expired without renewal (CodeCredential): signerd renews no expired
//     credential, so the service then stops with ErrCredentialExpired;
//   - it is stopping (CodeStopping), between the decision to stop and StateStopped.
//
// Warnings (EventWarning) are what authd survives and a host may want to know: a credential
// renewal that failed and will be retried (CodeCredential), a plane renewal unanswered or a plane
// row found gone and claimed again (CodePlane), a broker connection lost and being retried
// (CodeBroker), callout requests dropped past a local budget (CodeCalloutBudget) or denied by
// silence because signerd is unreachable (CodeSigner, both at most once a second), a discovery
// file that could not be rewritten (CodeDiscovery). No event carries a seed, JWT, bearer or cap.
//
// # Hosted contexts
//
// Inputs.Hosted makes the start a hosted auth context (seed 000 "Hosted auth context"). Its
// Account must be a data account public key (A...), LifecycleUID a lifecycle UID (26 to 32
// characters of [a-z0-9]), StoreIdentity one line of 1 to 256 bytes of printable UTF-8. The first credential authd gets from signerd, the
// auth-plane credential on the signer rail, must belong to Account (its issuer_account, or its
// issuer when the account key signed it itself), or Start refuses with CodeAccount before it
// opens a broker connection or claims the plane. A hosted context writes no discovery file and
// no refusal file, passes no Hooks (it is not the host process's unit), and when a broker connection stays down past the
// broker-gone window or the plane is fenced it becomes unavailable and closes itself (Err:
// ErrBrokerGone, ErrPlaneLost) without touching the host process. authd has no injected store:
// its ledger and IdP pin live in Config.StateDir, so StoreIdentity is checked for form only.
//
// # Interactive manager selection
//
// A manager-caller bearer (the /exchange view, both arms) is bound to one manager instance. By
// default (SelectRemoteFirst) an explicit managerInstanceId must be a live manager of the
// caller's owner; otherwise exactly one live remote manager of the owner is chosen, more than one
// or only non-live ones are refused, and with no remote one the local manager (Inputs.LocalManager)
// is chosen if live, else the exchange is refused. RuntimeOptions.InteractiveManagerSelection
// SelectLocalPrimary routes every unpinned human manager-caller exchange, and with it all
// unpinned interactive manager control, to the local managerd, even when the person has a live
// remote manager, or refuses it (no identity file, unreadable, another space, not live) without
// reading any remote manager's rows; explicit selectors and the agent arm keep remote-first. A
// host decides whether that routing is appropriate. Only a host composing authd sets it (no flag,
// configuration key or exchange field does); Start refuses any other value, and local-primary
// without a LocalManager, with CodeConfig before any effect. Live means: the gate
// epgate.manager.<iid> open, the spec svc.manager.<iid> and the lease lease.<iid> agreeing with
// its principal, process epoch and registration revision (package authority).
//
// # Instance identity and early reclaim
//
// instance.json in Config.StateDir holds this instance's stable id (InstanceID; Config.InstanceID
// pins it; a divergent record refuses with CodeIdentity and both are left intact), and the plane
// row carries it with the holder's user key and connection name. A start that finds another
// holder's live row reclaims it before its TTL only when a connection-liveness sweep over the
// cluster is conclusive that the holder is gone; otherwise it refuses with CodePlaneHeld
// (ErrHolderLive, ErrSweepInconclusive). A holder answers callouts only while its plane
// connection is connected and its claim was written after its latest reconnect.
//
// # While serving
//
// The rails renew both credentials at 75% of their life and the claim is renewed every half
// TTL, and every second after a renewal failed. A claim found taken by another instance stops
// the service (ErrPlaneTaken); a claim found gone is created again. The claim is fenced
// (pkg/lease): once the last write of the row the broker stored is older than the TTL less the
// lease's margin, the callout responder is closed at once (no callout is answered from then on)
// and the service stops with ErrPlaneLost, so it has stopped answering before the row can expire
// and a successor acquire it.
package service
