// Package policy is signerd's per-caller policy: which caller identity may call which RPC, on
// which spaces, for which profiles, with which parameters, how long the credential may live and
// how often the caller may ask.
//
// Deciding is pure (Policy.Decide: request in, Decision with a stable Reason out; no I/O, no
// clock). Loading (Load, Parse), holding and swapping the policy in force (Store), and rate
// limiting (Limiter) are separate, so the decision can be tested and explained
// (`signerd policy explain`, via Policy.Explain) without signing anything.
//
// # The file
//
// A policy is YAML, decoded strictly: an unknown key, a duplicate key, a value of the wrong type
// or a second document is an error naming the key and its line. A full example (tested to
// parse; testdata/example.yaml is the same policy with more comments):
//
//	version: 1                        # required; must be 1
//	callers:                          # required; at least one entry
//	  # id: an exact SPIFFE ID, or a pattern in which a whole path segment is "*" (exactly one
//	  # segment, any value) or "{space}" (exactly one segment, which must equal the token of the
//	  # request's space). The trust domain is always literal.
//	  - id: spiffe://cotal.local/managerd/{space}
//	    rpcs: [Mint, Remint, GetSpace]   # required; from the closed set (see RPCs)
//	    spaces: ["{space}"]           # required; space names, "{space}" (only if the id binds
//	                                  # it) or "*" (every space; alone)
//	    rate: {per_second: 50, burst: 100}    # required; per_second > 0, burst >= 1
//	    profiles:                     # required iff rpcs include Mint, Remint or SignCalloutResponse
//	      supervisor:
//	        ttl_max: 24h
//	        owners: [local]
//	      agent:                      # a profile name (see pkg/profiles)
//	        ttl_max: 24h              # required; > 0; signerd also caps at the profile maximum
//	        owners: [local, alice]    # owner tokens; or any_owner: true (not both); default none
//	        channels: ["general", "team.*", "proj.alpha.>"]   # patterns the caller may grant
//	        exclude_channels: ["team.secrets"]                # never grantable; checked first
//	        roles: [reviewer, builder]        # default none
//	        capabilities: [spawn, run]        # default none
//	        remint: own               # own (default) | any | none
//	      provisioner: {ttl_max: 5m, remint: none}
//	      deprovisioner: {ttl_max: 5m, remint: none}
//	  - id: spiffe://cotal.local/deliveryd/{space}
//	    rpcs: [Mint, Remint, GetSpace]
//	    spaces: ["{space}"]
//	    rate: {per_second: 5, burst: 10}
//	    profiles:
//	      delivery: {ttl_max: 1h}
//	      membership-rw: {ttl_max: 1h}
//	      membership-observer: {ttl_max: 1h, remint: none}
//	      connection-evictor: {ttl_max: 5m, remint: none}
//	  - id: spiffe://cotal.local/authd/{space}
//	    rpcs: [Mint, Remint, GetSpace, OpenCalloutRequest, SignCalloutResponse, SignBearer, GetJWKS, DeriveOwner, Mac, SignServiceCredential]
//	    spaces: ["{space}"]
//	    rate: {per_second: 200, burst: 400}
//	    profiles:
//	      auth-callout: {ttl_max: 1h}
//	      auth-plane: {ttl_max: 1h}
//	      retirement-requester: {ttl_max: 5m, any_owner: true, remint: none}
//	      remote-manager: {ttl_max: 24h, any_owner: true, remint: none}
//	      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
//	      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
//	      service-serve: {ttl_max: 1m, any_owner: true, remint: none}
//	      agent: {ttl_max: 12h, any_owner: true, channels: [">"], capabilities: [spawn, run, admin], remint: any}
//	      observer: {ttl_max: 12h, any_owner: true}
//	      operator: {ttl_max: 15m, any_owner: true, channels: [">"]}
//	  - id: spiffe://cotal.local/monitor
//	    rpcs: [GetSpace, GetJWKS]
//	    spaces: ["*"]
//	    exclude_spaces: [staging]     # space names never allowed; checked first, by name and token
//	    rate: {per_second: 1, burst: 5}
//	  - id: spiffe://cotal.local/canary/*
//	    rpcs: [GetSpace]
//	    spaces: [alpha]
//	    rate: {per_second: 1, burst: 1}
//	limits:                           # optional, as is each key; the defaults are shown
//	  # every identity no entry matches, and every certificate without a usable identity
//	  # (keyed by its SHA-256 fingerprint): one bucket each
//	  unknown_callers: {per_second: 1, burst: 5}
//	  global: {per_second: 10000, burst: 20000}  # one bucket over every request of every caller
//	  refusal_audit_interval: 10s     # refusals past a rate: one audit line per caller and
//	                                  # reason per interval, with the count (1s..1h)
//
// Channel patterns are dotted names whose tokens are [A-Za-z0-9_-]+, or "*" (exactly one token),
// or, last only, ">" (one or more trailing tokens). Owners are [A-Za-z0-9_]+; roles and
// capabilities are [A-Za-z0-9_-]+ and have no wildcard.
//
// A request may ask for a channel pattern too (an agent's subscribe, allow_subscribe and
// allow_publish; "team.>" as upstream's ACLs hold). Each requested channel is judged by what it
// reaches on the broker (space.ChannelReach): a pattern whose last token is "*" reaches its whole
// subtree, because nats-server lets a permission's trailing "*" match a literal ">", so "team.*" is
// judged as "team.>". That reach must be covered by one channels pattern (space.PatternCovers:
// "team.a" is within "team.*", "team.*" and "team.>" within "team.>", "team.>" not within "team.*",
// ">" only within ">") and must overlap no exclude_channels pattern (space.PatternsIntersect); else
// the answer is channel-not-allowed. A rule of "team.*" therefore grants the concrete channels
// team.<x>, and a pattern grant needs a rule ending in ">".
//
// A deprovisioner's member_channels are not judged against channels: they grant no read or post,
// only the purge of the one target lifecycle's membership rows on those concrete channels, which
// the profile already pins (profiles.Build refuses a pattern there).
//
// Validation at load also refuses: an id that is neither a SPIFFE ID nor a valid pattern, a
// duplicate id, a pattern that an earlier pattern already matches entirely (it could never be
// selected), an unknown RPC or profile name, an unparsable or non-positive ttl_max, a missing or
// non-positive rate, a malformed channel pattern, "{space}" under spaces when the id binds none,
// duplicates in any list, and profiles on an entry whose RPCs take none (or none where they do).
// Errors are *Error values naming the caller index and id, the field and the line.
//
// # Deciding
//
// The entry with exactly the caller's id wins; otherwise the first matching pattern in file
// order. Exclusions are checked before permissions, and anything not listed is denied. See
// Policy.Decide for the order of checks and Reason for the codes callers receive. Remint
// rebuilds the presented credential from the parameters it was minted with, so its profile, the
// remint mode, the recorded minter and then those parameters are checked, exactly as for a Mint:
// a narrowed rule refuses the renewal. Admit is the caller, RPC and space part alone, which the
// server asks before it reads a Remint's credential.
//
// The file must be plain YAML: anchors, aliases, merge keys ("<<") and explicit tags are
// refused with their line, because each lets what a reviewer reads differ from what is decoded.
//
// # Rates
//
// Every request is charged, before signerd reads it, to its caller's bucket and to the global
// bucket (Limiter): a caller an entry matches at the entry's rate, one bucket per identity; any
// other identity, and any certificate without a usable identity, at limits.unknown_callers. A
// request either bucket refuses is answered RESOURCE_EXHAUSTED (REASON_RATE_LIMITED) without
// being parsed, and is not audited on its own line: signerd counts such refusals and writes one
// audit line per caller and reason every limits.refusal_audit_interval, with the count. The
// audit and metrics reason is rate-limited for the caller's own bucket and global-rate-limited
// for the global one.
//
// # Serving
//
// The server keeps a Store, takes Current() once per request, asks Limiter.Allow as soon as
// the caller is authenticated, then calls Decide, audits the outcome, and grants
// min(requested TTL or profile default, profile maximum, Decision.TTLCap). On SIGHUP it calls
// Store.ReloadFile, which keeps the old policy if the new file is invalid.
package policy
