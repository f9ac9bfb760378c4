// The SDK against a live signerd: the Go binary (bin/signerd, or $SIGNERD_BIN) is initialised
// into a temporary directory with a dev PKI and a test policy, served on 127.0.0.1, and called
// from Node over mTLS exactly as a hosted platform would.

import assert from "node:assert/strict";
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { create } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { createUser } from "nkeys.js";

import {
  ERROR_DOMAIN,
  Profile,
  STREAM_MAX_AGE_MS,
  STREAM_RETRY_AFTER_MS,
  createSignerCalls,
  decodeStatus,
  type Credential,
  type SignerCalls,
  ProfileParamsSchema,
  Reason,
  SignerConfigError,
  SignerError,
  SignerService,
  createSignerClient,
  createSignerTransport,
  reasonOf,
  remint,
  signerErrors,
  remintProof,
  toSignerError,
  type SignerClient,
  type SignerTransport,
  type SignerTransportOptions,
} from "@cotalgo/signer";

const run = promisify(execFile);

const SPACE = "alpha";
const SERVER_ID = "spiffe://cotal.local/signerd";
/** The policy cap on agent credentials; Mint asks for more to see it applied. */
const TTL_MAX_SECONDS = 600;
/** Per-test deadline: every case is a handful of loopback calls. */
const TIMEOUT = { timeout: 15_000 };

/** managerd of alpha may Mint, Remint and read its space, and mint agents for at most 10 minutes
 * on channel "general"; it may not mint a supervisor. */
const POLICY = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent:
        ttl_max: 10m
        any_owner: true
        channels: ["general"]
`;

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));
const signerdBin = process.env.SIGNERD_BIN ?? join(repoRoot, "bin", "signerd");

let dir = "";
let signerd: ChildProcess | undefined;
let address = "";
let transport: SignerTransport;
let client: SignerClient;
const opened: { close(): void }[] = [];

before(
  async () => {
    assert.ok(existsSync(signerdBin), `${signerdBin} is missing: build it with 'make test-ts' (go build -o bin/signerd ./signerd)`);
    dir = mkdtempSync(join(tmpdir(), "signer-ts-"));
    await run(signerdBin, ["init", "--dir", dir, "--space", SPACE]);
    await run(signerdBin, ["pki", "init", "--dir", join(dir, "pki"), "--space", SPACE]);
    const policy = join(dir, "policy.yaml");
    writeFileSync(policy, POLICY, { mode: 0o600 });
    const config = join(dir, "serve.yaml");
    // JSON is YAML: every path is quoted whatever the temporary directory is called.
    writeFileSync(
      config,
      JSON.stringify({ ...serveConfig(), audit: { path: join(dir, "audit", "signerd.audit"), replica: "ts-1" } }),
      { mode: 0o600 },
    );
    const started = await startSignerd(config, 20_000);
    signerd = started.child;
    address = started.listen;
    transport = createSignerTransport(managerd());
    opened.push(transport);
    client = createSignerClient(transport);
  },
  { timeout: 60_000 },
);

after(
  async () => {
    for (const t of opened) {
      t.close();
    }
    try {
      if (signerd !== undefined && signerd.exitCode === null) {
        const code = await stopSignerd(signerd, 10_000);
        assert.equal(code, 0, "signerd did not stop cleanly on SIGTERM");
      }
    } finally {
      if (dir !== "") {
        rmSync(dir, { recursive: true, force: true });
      }
    }
  },
  { timeout: 20_000 },
);

test("ok/mint-agent", TIMEOUT, async () => {
  const agent = createUser();
  const { credential } = await client.mint({
    space: SPACE,
    profile: Profile.AGENT,
    userPublicKey: agent.getPublicKey(),
    params: agentParams(),
    ttl: { seconds: 3600n },
  });
  await assertAgentCredential(credential, agent.getPublicKey());
});

/** assertAgentCredential checks an agent credential minted with a 1 h lifetime for userPublicKey:
 * its claims against signerd init's public facts and the policy's 10-minute cap. */
async function assertAgentCredential(credential: Credential | undefined, userPublicKey: string): Promise<void> {
  assert.ok(credential !== undefined, "Mint returned no credential");
  const claims = jwtPayload(credential.jwt);
  const account = dataAccount();
  assert.equal(claims.sub, userPublicKey);
  assert.equal(claims.nats?.issuer_account, account);
  assert.equal(credential.issuerAccount, account);
  assert.equal((await client.getSpace({ space: SPACE })).accountPublicKey, account);
  assert.equal(claims.jti, credential.jti);
  assert.equal(credential.userPublicKey, userPublicKey);
  assert.equal(credential.profile, Profile.AGENT);
  assert.ok(typeof claims.exp === "number" && typeof claims.iat === "number", "JWT lacks exp or iat");
  const lifetime = claims.exp - claims.iat;
  assert.ok(lifetime > 0 && lifetime <= TTL_MAX_SECONDS, `lifetime ${lifetime}s, want (0, ${TTL_MAX_SECONDS}]`);
  assert.equal(credential.ttlCapped, true);
  assert.ok(credential.expiresAt !== undefined, "credential has no expiresAt");
  assert.equal(timestampDate(credential.expiresAt).getTime(), claims.exp * 1000);
}

test("fail/denied-profile", TIMEOUT, async () => {
  const err = await rejection(
    client.mint({ space: SPACE, profile: Profile.SUPERVISOR, userPublicKey: createUser().getPublicKey(), params: { owner: "u_ts", actor: "mgr" } }),
  );
  assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
  assert.ok(err instanceof ConnectError);
  assert.equal(err.code, Code.PermissionDenied);
  assert.equal(err.reason, "PROFILE_NOT_ALLOWED");
  assert.equal(err.reasonValue, Reason.PROFILE_NOT_ALLOWED);
  assert.equal(err.reasonCode, "profile-not-allowed");
  assert.equal(reasonOf(err), Reason.PROFILE_NOT_ALLOWED);
});

test("ok/remint", TIMEOUT, async () => {
  const agent = createUser();
  const first = await mintAgent(agent.getPublicKey(), 300n);
  // A lifetime other than the first one's: a NATS jti hashes the claims, so a renewal within the
  // same second with the same lifetime would carry the same jti.
  const renewed = await remint(client, { space: SPACE, jwt: first.jwt, holder: agent, ttlMs: 3_600_000 });
  assert.notEqual(renewed.jti, first.jti);
  assert.equal(renewed.userPublicKey, agent.getPublicKey());
  assert.equal(jwtPayload(renewed.jwt).sub, agent.getPublicKey());
  assert.equal(renewed.issuerAccount, first.issuerAccount);
  assert.equal(renewed.profile, Profile.AGENT);
  assert.equal(renewed.ttlCapped, true);
});

test("fail/remint-bad-proof", TIMEOUT, async () => {
  const agent = createUser();
  const first = await mintAgent(agent.getPublicKey());
  const err = await rejection(remint(client, { space: SPACE, jwt: first.jwt, holder: createUser() }));
  assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
  assert.equal(err.code, Code.PermissionDenied);
  assert.equal(err.reason, "BAD_PROOF");
  assert.equal(err.reasonCode, "bad-proof");
});

test("fail/remint-stale-proof", TIMEOUT, async () => {
  const agent = createUser();
  const first = await mintAgent(agent.getPublicKey());
  const past = new Date(Date.now() - 10 * 60_000);
  const err = await rejection(remint(client, { space: SPACE, jwt: first.jwt, holder: agent, now: () => past }));
  assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
  assert.equal(err.reason, "STALE_PROOF");
});

test("fail/no-client-cert", TIMEOUT, async () => {
  // Built with connect-node directly: createSignerTransport refuses to go without a certificate.
  const baseUrl = `https://${address}`;
  const sessions = new Http2SessionManager(baseUrl, undefined, {
    ca: readFileSync(join(dir, "pki", "ca.pem")),
    servername: "localhost",
    minVersion: "TLSv1.3",
  });
  try {
    const bare = createClient(
      SignerService,
      createGrpcTransport({ baseUrl, sessionManager: sessions, defaultTimeoutMs: 5_000, interceptors: [signerErrors] }),
    );
    const outcome = await bare.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey: createUser().getPublicKey(), params: agentParams() }).then(
      (resp) => ({ resp }),
      (err: unknown) => ({ err }),
    );
    assert.ok(!("resp" in outcome), "a client without a certificate got a credential");
    const err = outcome.err;
    assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
    assert.ok(err.code === Code.Unavailable || err.code === Code.Unauthenticated, `code ${Code[err.code]} (${err.message}), want Unavailable or Unauthenticated`);
    assert.equal(err.reason, "UNSPECIFIED");
    // signerd's TLS 1.3 alert, so the refusal is the missing certificate and not, say, a closed port.
    assert.match(err.rawMessage, /certificate required/);
  } finally {
    sessions.abort();
  }
});

test("fail/wrong-server-id", TIMEOUT, async () => {
  const t = createSignerTransport({ ...managerd(), serverId: "spiffe://cotal.local/not-signerd" });
  opened.push(t);
  const err = await rejection(createSignerClient(t).getSpace({ space: SPACE }));
  assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
  assert.equal(err.code, Code.Unavailable);
  assert.equal(err.reason, "UNSPECIFIED");
  assert.match(err.rawMessage, /not exactly spiffe:\/\/cotal.local\/not-signerd/);
});

test("fail/transport-config", TIMEOUT, () => {
  const base = managerd();
  const loose = join(dir, "loose.key");
  copyFileSync(base.keyFile, loose);
  chmodSync(loose, 0o644);
  const cases: { name: string; opts: SignerTransportOptions; path: string }[] = [
    { name: "no cert", opts: { ...base, certFile: "" }, path: "" },
    { name: "no key", opts: { ...base, keyFile: "" }, path: "" },
    { name: "unix socket", opts: { ...base, address: "unix:/run/signerd.sock" }, path: "" },
    { name: "address and addresses", opts: { ...base, addresses: ["127.0.0.1:1"] }, path: "" },
    { name: "no address", opts: { ...base, address: undefined }, path: "" },
    { name: "empty addresses", opts: { ...base, address: undefined, addresses: [] }, path: "" },
    { name: "address twice", opts: { ...base, address: undefined, addresses: ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"] }, path: "" },
    { name: "unix replica", opts: { ...base, address: undefined, addresses: ["127.0.0.1:1", "unix:/run/signerd.sock"] }, path: "" },
    { name: "plain http", opts: { ...base, address: "http://127.0.0.1:1" }, path: "" },
    { name: "missing CA", opts: { ...base, caFile: join(dir, "nope.pem") }, path: join(dir, "nope.pem") },
    { name: "key readable by others", opts: { ...base, keyFile: loose }, path: loose },
    { name: "no concurrent calls", opts: { ...base, maxConcurrentCalls: 0 }, path: "" },
    { name: "fractional concurrent calls", opts: { ...base, maxConcurrentCalls: 1.5 }, path: "" },
  ];
  for (const c of cases) {
    assert.throws(
      () => createSignerTransport(c.opts),
      (err: unknown) => err instanceof SignerConfigError && err.path === c.path,
      c.name,
    );
  }
});

test("fail/garbage-error-details", TIMEOUT, () => {
  // The ErrorInfo decoder reads bytes from the network: random input must give no reason, and
  // never throw. A well-formed detail of another domain is ignored too.
  let seed = 0x2545f491;
  const next = () => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return seed >>> 0;
  };
  for (let i = 0; i < 2_000; i++) {
    const bytes = Uint8Array.from({ length: next() % 64 }, () => next() & 0xff);
    const ce = new ConnectError("x", Code.PermissionDenied);
    ce.details = [{ type: "google.rpc.ErrorInfo", value: bytes }];
    assert.equal(toSignerError(ce).code, Code.PermissionDenied);
    // A stream refusal's google.rpc.Status is read from the network too.
    const st = decodeStatus(bytes);
    assert.ok(st === undefined || (Number.isInteger(st.code) && typeof st.message === "string" && Array.isArray(st.details)));
  }
  const encoded = new BinaryWriter().tag(1, 0).int32(Code.PermissionDenied).tag(2, 2).string("no").tag(3, 2).fork()
    .tag(1, 2).string("type.googleapis.com/google.rpc.ErrorInfo").tag(2, 2).bytes(errorInfo("BAD_PROOF", ERROR_DOMAIN)).join().finish();
  const decoded = decodeStatus(encoded);
  assert.deepEqual(
    { code: decoded?.code, message: decoded?.message, types: decoded?.details.map((d) => d.type) },
    { code: Code.PermissionDenied, message: "no", types: ["google.rpc.ErrorInfo"] },
  );
  const foreign = new ConnectError("x", Code.PermissionDenied);
  foreign.details = [{ type: "google.rpc.ErrorInfo", value: errorInfo("BAD_PROOF", "example.com") }];
  assert.equal(toSignerError(foreign).reason, "UNSPECIFIED");
  const ours = new ConnectError("x", Code.PermissionDenied);
  ours.details = [{ type: "google.rpc.ErrorInfo", value: errorInfo("BAD_PROOF", ERROR_DOMAIN) }];
  assert.equal(toSignerError(ours).reason, "BAD_PROOF");
  const prefixed = new ConnectError("x", Code.PermissionDenied);
  prefixed.details = [{ type: "google.rpc.ErrorInfo", value: errorInfo("REASON_BAD_PROOF", ERROR_DOMAIN) }];
  assert.equal(toSignerError(prefixed).reason, "UNSPECIFIED");
});

test("ok/remint-proof-message", TIMEOUT, () => {
  const agent = createUser();
  const token = fakeJWT({ jti: "JTI1", sub: agent.getPublicKey(), nats: { type: "user" } });
  const at = new Date(1_700_000_000_500);
  const { proofUnixSeconds, proof } = remintProof(SPACE, token, agent, at);
  assert.equal(proofUnixSeconds, 1_700_000_000n);
  const message = new TextEncoder().encode("cotal-remint/v1\0alpha\0JTI1\x001700000000");
  assert.ok(agent.verify(message, proof), "proof does not verify over the documented message");
  const err = (() => {
    try {
      remintProof(SPACE, "not.a.jwt", agent);
    } catch (e) {
      return e;
    }
    return undefined;
  })();
  assert.ok(err instanceof SignerError && err.code === Code.InvalidArgument, "a non-JWT token was not refused");
});

test("ok/readme-example", TIMEOUT, async () => {
  // docs/connecting.md shows examples/mint-agent.mjs verbatim; it must run against this signerd.
  const example = join(repoRoot, "sdk", "ts", "examples", "mint-agent.mjs");
  const source = readFileSync(example, "utf8");
  assert.ok(readFileSync(join(repoRoot, "docs", "connecting.md"), "utf8").includes(source), "docs/connecting.md does not show examples/mint-agent.mjs verbatim");
  const { stdout } = await run(process.execPath, [example], {
    env: { ...process.env, SIGNERD_ADDR: address, SIGNERD_PKI: join(dir, "pki"), SIGNERD_SPACE: SPACE },
    timeout: 10_000,
  });
  assert.match(stdout, /^minted \S+ for U[A-Z0-9]+ in account A[A-Z0-9]+$/m);
  assert.match(stdout, /^reminted \S+, expires /m);
});

/** managerd returns the transport options of managerd of alpha, from the dev PKI. */
test("ok/replicas-failover", { timeout: 40_000 }, async () => {
  // Two more replicas on the same init directory (the same keys, certificate and policy), each
  // with its own replica id and audit file; the first is killed (SIGKILL) between calls.
  const replicas: { id: string; audit: string; child: ChildProcess; listen: string }[] = [];
  try {
    for (const id of ["ts-2", "ts-3"]) {
      const audit = join(dir, "audit", `${id}.audit`);
      const config = join(dir, `serve-${id}.yaml`);
      writeFileSync(config, JSON.stringify({ ...serveConfig(), audit: { path: audit, replica: id } }), { mode: 0o600 });
      const started = await startSignerd(config, 20_000);
      replicas.push({ id, audit, ...started });
    }
    const t = createSignerTransport({ ...managerd(), address: undefined, addresses: replicas.map((r) => r.listen) });
    opened.push(t);
    const c = createSignerClient(t);
    const holder = createUser();
    const { credential } = await c.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey: holder.getPublicKey(), params: agentParams() });
    assert.ok(credential !== undefined);
    for (let i = 0; i < 4; i++) {
      await c.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey: createUser().getPublicKey(), params: agentParams() });
    }
    assert.equal(t.failovers, 0, "no failover with both replicas up");
    assert.deepEqual(await auditLines(replicas.map((r) => r.audit)), [5, 0], "every call on the first replica");

    const first = replicas[0]!;
    await new Promise<void>((resolve) => {
      first.child.once("exit", () => resolve());
      first.child.kill("SIGKILL");
    });
    // The renewal of the credential minted on the killed replica lands on the other one.
    const renewed = await remint(c, { space: SPACE, jwt: credential.jwt, holder });
    assert.equal(renewed.userPublicKey, holder.getPublicKey());
    assert.equal(jwtPayload(renewed.jwt).nats?.issuer_account, dataAccount());
    for (let i = 0; i < 9; i++) {
      await c.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey: createUser().getPublicKey(), params: agentParams() });
    }
    assert.equal(t.failovers, 1, "only the first call after the kill was sent twice");
    assert.deepEqual(await auditLines(replicas.map((r) => r.audit)), [5, 10], "every call after the kill on the second replica");
  } finally {
    for (const r of replicas) {
      if (r.child.exitCode === null && r.child.signalCode === null) {
        await stopSignerd(r.child, 10_000);
      }
    }
  }
});

test("ok/unary-beyond-stream-cap", { timeout: 30_000 }, async () => {
  // signerd allows 32 concurrent HTTP/2 streams per connection (limits.max_concurrent_streams);
  // 200 unary calls at once on a new transport's one connection wait their turn, none is refused,
  // and each answer is the credential of its own request. Twice: the first burst races signerd's
  // SETTINGS on a new connection, the second runs on a connection that knows the limit.
  const t = createSignerTransport(managerd());
  opened.push(t);
  const c = createSignerClient(t);
  for (const burst of ["new connection", "open connection"]) {
    const users = Array.from({ length: 200 }, () => createUser().getPublicKey());
    const outcomes = await Promise.allSettled(
      users.map((userPublicKey) => c.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey, params: agentParams() })),
    );
    const failed = outcomes.flatMap((o) => (o.status === "rejected" ? [toSignerError(o.reason).message] : []));
    assert.deepEqual(failed.slice(0, 3), [], `${burst}: ${failed.length} of 200 calls failed`);
    const answers = outcomes.map((o) => (o.status === "fulfilled" ? o.value : assert.fail("rejected")));
    assert.deepEqual(
      answers.map((a) => jwtPayload(a.credential!.jwt).sub),
      users,
      `${burst}: an answer is another call's credential`,
    );
    assert.equal(new Set(answers.map((a) => a.credential!.jti)).size, users.length, `${burst}: a jti repeated`);
  }
});

/** held is the audit configuration of a replica that holds each call until its audit batch is
 * written, delay after the batch's first line. */
function held(delay: string) {
  return { max_delay: delay, max_batch: 1000 };
}

test("ok/unary-queue-reads-peer-limit", { timeout: 30_000 }, async () => {
  // A signerd allowing 4 streams per connection, below the transport's cap (32): once the
  // connection's settings are read, 10 calls at once run 4 at a time and the others queue.
  const r = await startReplica("ts-q4", held("500ms"), { max_concurrent_streams: 4 });
  try {
    const t = createSignerTransport({ ...managerd(), address: r.listen });
    opened.push(t);
    const c = createSignerClient(t);
    const first = agentRequest();
    assert.equal((await c.mint(first)).credential?.userPublicKey, first.userPublicKey);
    const reqs = Array.from({ length: 10 }, () => agentRequest());
    const answers = Promise.all(reqs.map((req) => c.mint(req)));
    assert.equal(t.queued, 6, "calls beyond signerd's 4 streams did not queue");
    assert.deepEqual(
      (await answers).map((a) => a.credential?.userPublicKey),
      reqs.map((req) => req.userPublicKey),
    );
    assert.equal(t.queued, 0);
    assert.deepEqual(await auditLines([r.audit]), [11]);
  } finally {
    await stopSignerd(r.child, 10_000);
  }
});

test("fail/unary-queued-timeout-and-abort", { timeout: 30_000 }, async () => {
  // Two calls held by the replica fill a transport of maxConcurrentCalls 2; a third call waits
  // in the queue, where its timeout or abort ends it, and it is never sent (the audit counts
  // only the calls that were).
  const r = await startReplica("ts-qwait", held("3s"));
  try {
    const t = createSignerTransport({ ...managerd(), address: r.listen, maxConcurrentCalls: 2 });
    opened.push(t);
    const c = createSignerClient(t);
    let settled = 0;
    const held = [agentRequest(), agentRequest()].map((req) =>
      c.mint(req).finally(() => {
        settled++;
      }),
    );
    assert.equal(t.queued, 0);
    const timedOut = rejection(c.mint(agentRequest(), { timeoutMs: 200 }));
    assert.equal(t.queued, 1);
    const err = await timedOut;
    assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
    assert.equal(err.code, Code.DeadlineExceeded);
    assert.equal(t.queued, 0);
    const ac = new AbortController();
    const aborted = rejection(c.mint(agentRequest(), { signal: ac.signal }));
    assert.equal(t.queued, 1);
    ac.abort();
    const abortErr = await aborted;
    assert.ok(abortErr instanceof SignerError, `want SignerError, got ${String(abortErr)}`);
    assert.equal(abortErr.code, Code.Canceled);
    assert.equal(t.queued, 0);
    assert.equal(settled, 0, "the held calls were answered before the queued ones ended: the queue was not tested");
    await Promise.all(held);
    // A last call, sent after the ones that gave up would have been: the audit holds the two held
    // calls and this one.
    await c.mint(agentRequest());
    assert.deepEqual(await auditLines([r.audit]), [3], "a call that gave up in the queue reached signerd");
  } finally {
    await stopSignerd(r.child, 10_000);
  }
});

test("ok/unary-queue-counts-open-stream", { timeout: 30_000 }, async () => {
  // An open SignerCalls stream holds one of the transport's turns (maxConcurrentCalls 2): with it
  // open, one unary call runs and the next queues; once it is closed, two run. Calls on the
  // stream and unary calls mixed all get their own credentials.
  const r = await startReplica("ts-qstream", held("500ms"));
  try {
    const t = createSignerTransport({ ...managerd(), address: r.listen, maxConcurrentCalls: 2 });
    opened.push(t);
    const c = createSignerClient(t);
    const calls = createSignerCalls(t);
    opened.push(calls);
    await mintOn(calls);
    const unaryReqs = Array.from({ length: 3 }, () => agentRequest());
    const streamReqs = Array.from({ length: 20 }, () => agentRequest());
    const unary = Promise.all(unaryReqs.map((req) => c.mint(req)));
    assert.equal(t.queued, 2, "the open stream does not hold a turn");
    const viaStream = Promise.all(streamReqs.map((req) => calls.mint(req)));
    assert.deepEqual(
      (await unary).map((a) => a.credential?.userPublicKey),
      unaryReqs.map((req) => req.userPublicKey),
    );
    assert.deepEqual(
      (await viaStream).map((a) => a.credential?.userPublicKey),
      streamReqs.map((req) => req.userPublicKey),
    );
    assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 });
    calls.close();
    const after = [agentRequest(), agentRequest()];
    const both = Promise.all(after.map((req) => c.mint(req)));
    assert.equal(t.queued, 0, "the closed stream still holds a turn");
    assert.deepEqual(
      (await both).map((a) => a.credential?.userPublicKey),
      after.map((req) => req.userPublicKey),
    );
  } finally {
    await stopSignerd(r.child, 10_000);
  }
});

// The Stream RPC (createSignerCalls): the same answers and refusals as the unary RPCs, over one
// stream per SignerCalls.

test("ok/stream-mint-agent", TIMEOUT, async (t) => {
  const calls = streamCalls(t);
  const agent = createUser();
  const { credential } = await calls.mint({
    space: SPACE,
    profile: Profile.AGENT,
    userPublicKey: agent.getPublicKey(),
    params: agentParams(),
    ttl: { seconds: 3600n },
  });
  await assertAgentCredential(credential, agent.getPublicKey());
  assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 }, "the call went over one stream");
});

test("fail/stream-refusal-as-unary", TIMEOUT, async (t) => {
  const calls = streamCalls(t);
  const supervisor = { space: SPACE, profile: Profile.SUPERVISOR, userPublicKey: createUser().getPublicKey(), params: { owner: "u_ts", actor: "mgr" } };
  const viaStream = await rejection(calls.mint(supervisor));
  const viaUnary = await rejection(client.mint(supervisor));
  assertSameRefusal(viaStream, viaUnary);
  assert.ok(viaStream instanceof SignerError);
  assert.equal(viaStream.code, Code.PermissionDenied);
  assert.equal(viaStream.reason, "PROFILE_NOT_ALLOWED");
  assert.equal(viaStream.reasonCode, "profile-not-allowed");
  // Another RPC over the same stream: a callout request that is no JWT, refused before policy.
  const callout = { space: SPACE, requestJwt: "x" };
  const calloutStream = await rejection(calls.openCalloutRequest(callout));
  assertSameRefusal(calloutStream, await rejection(client.openCalloutRequest(callout)));
  assert.ok(calloutStream instanceof SignerError);
  assert.equal(calloutStream.code, Code.InvalidArgument);
  assert.equal(calloutStream.reason, "INVALID_ARGUMENT");
  assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 }, "both refusals came over the stream");
});

test("ok/stream-concurrent-ids", TIMEOUT, async (t) => {
  // More calls than signerd reads ahead on a stream (64): each answer reaches its own call.
  const calls = streamCalls(t);
  const users = Array.from({ length: 150 }, () => createUser().getPublicKey());
  const answers = await Promise.all(
    users.map((userPublicKey) => calls.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey, params: agentParams() })),
  );
  assert.deepEqual(
    answers.map((a) => a.credential?.userPublicKey),
    users,
  );
  assert.deepEqual(
    answers.map((a) => jwtPayload(a.credential!.jwt).sub),
    users,
  );
  assert.equal(new Set(answers.map((a) => a.credential!.jti)).size, users.length, "a jti repeated");
  assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 });
});

test("ok/stream-max-age", TIMEOUT, async (t) => {
  let now = Date.now();
  const calls = streamCalls(t, { now: () => now });
  await mintOn(calls);
  await mintOn(calls);
  assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 }, "a young stream is reused");
  now += STREAM_MAX_AGE_MS;
  await mintOn(calls);
  assert.deepEqual(counts(calls), { opened: 2, fellBack: 0 }, "an old stream is retired for a new one");
});

test("ok/stream-fallback-unimplemented", TIMEOUT, async () => {
  // The signerd binary has no switch to serve without Stream (signerdtest.Options.NoStream is the
  // Go harness's), so the stream is opened on a method name signerd does not serve: its gRPC
  // server answers that UNIMPLEMENTED, the code an older signerd answers Stream with.
  let attempts = 0;
  const unserved: Transport = {
    unary: (...args) => transport.unary(...args),
    stream: (method, ...rest) => {
      attempts++;
      return transport.stream({ ...method, name: "StreamNotServed" }, ...rest);
    },
  };
  let now = Date.now();
  const calls = createSignerCalls(unserved, { now: () => now });
  opened.push(calls);
  const agent = createUser();
  const { credential } = await calls.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey: agent.getPublicKey(), params: agentParams(), ttl: { seconds: 3600n } });
  await assertAgentCredential(credential, agent.getPublicKey());
  await mintOn(calls);
  await mintOn(calls);
  assert.deepEqual(counts(calls), { opened: 0, fellBack: 3 }, "every call by the unary RPC");
  assert.equal(attempts, 1, "one stream attempt within the unary period");
  now += STREAM_RETRY_AFTER_MS;
  await mintOn(calls);
  assert.equal(attempts, 2, "a new attempt once the unary period is over");
  assert.deepEqual(counts(calls), { opened: 0, fellBack: 4 });
});

test("fail/stream-refused-falls-back-per-call", TIMEOUT, async (t) => {
  // managerd holds signerd's per-caller stream cap (16) open: a new stream is refused
  // RESOURCE_EXHAUSTED, that call goes by the unary RPC, and the next call tries to open again.
  const held: AbortController[] = [];
  try {
    // Streams until signerd refuses one (other tests' streams may still count).
    let refused: unknown;
    for (let i = 0; i <= 16 && refused === undefined; i++) {
      const ac = new AbortController();
      try {
        const res = await transport.stream(SignerService.method.stream, ac.signal, 0, undefined, idle(ac.signal), undefined);
        assert.equal(res.header.get("cotal-signer-stream"), "1", `held stream ${i} not accepted`);
        held.push(ac);
      } catch (err) {
        ac.abort();
        refused = err;
      }
    }
    assert.ok(refused instanceof SignerError, `want a refused stream, got ${String(refused)}`);
    assert.equal(refused.code, Code.ResourceExhausted);
    assert.equal(refused.reason, "RATE_LIMITED");
    const calls = streamCalls(t);
    await mintOn(calls);
    await mintOn(calls);
    assert.deepEqual(counts(calls), { opened: 0, fellBack: 2 }, "each call refused a stream went by the unary RPC");
    held.pop()!.abort();
    // signerd frees the slot once it sees the reset; poll with a deadline.
    await pollUntil(async () => {
      await mintOn(calls);
      return calls.opened === 1;
    }, 10_000, "no stream opened after a held one ended");
  } finally {
    for (const ac of held) {
      ac.abort();
    }
  }
});

test("fail/stream-call-abort-and-timeout", { timeout: 30_000 }, async () => {
  // A signerd whose audit writer waits 2 s for a batch holds each call in flight.
  const slow = await startReplica("ts-slow", { max_delay: "2s" });
  try {
    const t = createSignerTransport({ ...managerd(), address: slow.listen });
    opened.push(t);
    const calls = createSignerCalls(t);
    opened.push(calls);
    await mintOn(calls);
    const ac = new AbortController();
    const aborted = rejection(calls.mint(agentRequest(), { signal: ac.signal }));
    await pollUntil(() => calls.inFlight === 1, 10_000, "the call never went out on the stream");
    ac.abort();
    const err = await aborted;
    assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
    assert.equal(err.code, Code.Canceled);
    const timedOut = await rejection(calls.mint(agentRequest(), { timeoutMs: 100 }));
    assert.ok(timedOut instanceof SignerError, `want SignerError, got ${String(timedOut)}`);
    assert.equal(timedOut.code, Code.DeadlineExceeded);
    // The stream goes on: the answers that came after their calls stopped waiting were dropped.
    await mintOn(calls);
    assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 });
  } finally {
    await stopSignerd(slow.child, 10_000);
  }
});

test("fail/stream-broken-not-resent", { timeout: 40_000 }, async () => {
  // Two replicas, the first with a slow audit writer; it is killed (SIGKILL) with a call in flight
  // on its stream. The call fails Unavailable and is not sent to the second replica (its audit
  // stays empty); the next calls are answered by the second replica.
  const first = await startReplica("ts-s1", { max_delay: "2s" });
  const second = await startReplica("ts-s2", {});
  try {
    const t = createSignerTransport({ ...managerd(), address: undefined, addresses: [first.listen, second.listen] });
    opened.push(t);
    const calls = createSignerCalls(t);
    opened.push(calls);
    await mintOn(calls);
    const inFlight = rejection(calls.mint(agentRequest()));
    await pollUntil(() => calls.inFlight === 1, 10_000, "the call never went out on the stream");
    await new Promise<void>((resolve) => {
      first.child.once("exit", () => resolve());
      first.child.kill("SIGKILL");
    });
    const err = await inFlight;
    assert.ok(err instanceof SignerError, `want SignerError, got ${String(err)}`);
    assert.equal(err.code, Code.Unavailable);
    assert.match(err.rawMessage, /not resent/);
    assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 }, "the broken call was not sent again");
    assert.equal(calls.broken, 1);
    assert.deepEqual(await auditLines([second.audit]), [0], "the second replica saw no call");
    // The next call: the stream to the dead replica is refused, the unary RPC fails over; the one
    // after opens a stream on the second replica.
    await mintOn(calls);
    await mintOn(calls);
    assert.deepEqual(counts(calls), { opened: 2, fellBack: 1 });
    assert.deepEqual(await auditLines([second.audit]), [2]);
  } finally {
    for (const r of [first, second]) {
      if (r.child.exitCode === null && r.child.signalCode === null) {
        await stopSignerd(r.child, 10_000);
      }
    }
  }
});

test("ok/stream-drain-on-sigterm", { timeout: 30_000 }, async () => {
  // SIGTERM with a call in flight on the stream: signerd sends StreamDrain, the client half-closes
  // the stream, the call is answered, and signerd exits 0 without waiting out its drain grace.
  const r = await startReplica("ts-drain", { max_delay: "1s" });
  const t = createSignerTransport({ ...managerd(), address: r.listen });
  opened.push(t);
  const calls = createSignerCalls(t);
  opened.push(calls);
  await mintOn(calls);
  const agent = createUser().getPublicKey();
  const answer = calls.mint({ space: SPACE, profile: Profile.AGENT, userPublicKey: agent, params: agentParams() });
  await pollUntil(() => calls.inFlight === 1, 10_000, "the call never went out on the stream");
  const code = await stopSignerd(r.child, 10_000);
  const { credential } = await answer;
  assert.equal(credential?.userPublicKey, agent);
  assert.equal(code, 0, "signerd did not stop cleanly on SIGTERM");
  assert.deepEqual(counts(calls), { opened: 1, fellBack: 0 });
  assert.equal(calls.drained, 1, "the stream was not told to drain");
  // Half-closed in answer to the drain, the stream ends cleanly; one left open would be ended
  // by signerd with UNAVAILABLE after its drain grace.
  await pollUntil(() => calls.ended === 1, 10_000, "the drained stream never ended");
  assert.equal(calls.broken, 0, "the drained stream did not end cleanly");
  assert.deepEqual(await auditLines([r.audit]), [2], "both calls audited");
});

/** streamCalls returns SignerCalls over the suite's transport, closed after the test. */
function streamCalls(t: TestContext, opts: Parameters<typeof createSignerCalls>[1] = {}): SignerCalls {
  const calls = createSignerCalls(transport, opts);
  t.after(() => calls.close());
  return calls;
}

function counts(calls: SignerCalls): { opened: number; fellBack: number } {
  return { opened: calls.opened, fellBack: calls.fellBack };
}

function agentRequest() {
  return { space: SPACE, profile: Profile.AGENT, userPublicKey: createUser().getPublicKey(), params: agentParams() };
}

/** mintOn mints an agent credential through calls and checks it names the requested user. */
async function mintOn(calls: SignerCalls): Promise<void> {
  const req = agentRequest();
  const { credential } = await calls.mint(req);
  assert.equal(credential?.userPublicKey, req.userPublicKey);
}

/** assertSameRefusal checks that a stream refusal is the unary one: code, message, reason and
 * details. */
function assertSameRefusal(viaStream: unknown, viaUnary: unknown): void {
  assert.ok(viaStream instanceof SignerError, `stream: want SignerError, got ${String(viaStream)}`);
  assert.ok(viaUnary instanceof SignerError, `unary: want SignerError, got ${String(viaUnary)}`);
  assert.equal(viaStream.code, viaUnary.code);
  assert.equal(viaStream.rawMessage, viaUnary.rawMessage);
  assert.equal(viaStream.reason, viaUnary.reason);
  assert.equal(viaStream.reasonCode, viaUnary.reasonCode);
  const details = (e: SignerError) => e.details.map((d) => ("type" in d ? { type: d.type, value: Buffer.from(d.value).toString("hex") } : d));
  assert.deepEqual(details(viaStream), details(viaUnary));
}

/** startReplica starts one more signerd on the suite's init directory with its own audit file,
 * audit options added. */
async function startReplica(id: string, audit: Record<string, string | number>, limits: Record<string, number> = {}) {
  const file = join(dir, "audit", `${id}.audit`);
  const config = join(dir, `serve-${id}.yaml`);
  writeFileSync(config, JSON.stringify({ ...serveConfig(), audit: { path: file, replica: id, ...audit }, limits }), { mode: 0o600 });
  const started = await startSignerd(config, 20_000);
  return { id, audit: file, ...started };
}

/** idle is a request stream that sends nothing until signal aborts. */
async function* idle(signal: AbortSignal): AsyncGenerator<never> {
  await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
}

/** pollUntil polls cond every 10 ms until it holds, failing with msg after deadlineMs. */
async function pollUntil(cond: () => boolean | Promise<boolean>, deadlineMs: number, msg: string): Promise<void> {
  const end = Date.now() + deadlineMs;
  while (!(await cond())) {
    assert.ok(Date.now() < end, msg);
    await new Promise((resolve) => setTimeout(resolve, 10)); // poll interval, not synchronisation
  }
}

/** auditLines runs `signerd audit verify` on each file alone and returns its line count; it also
 * checks that the file holds one chain, named by the replica id in the file name. */
async function auditLines(files: string[]): Promise<number[]> {
  const out: number[] = [];
  for (const f of files) {
    if (!existsSync(f) || readFileSync(f).length === 0) {
      out.push(0);
      continue;
    }
    const { stdout } = await run(signerdBin, ["audit", "verify", f]);
    const m = /: ok, (\d+) lines/.exec(stdout);
    assert.ok(m !== null, `audit verify ${f}: ${stdout}`);
    const id = /([^/]+)\.audit$/.exec(f)![1]!;
    const heads = [...stdout.matchAll(/chain head \{"Replica":"([^"]*)"/g)].map((h) => h[1]);
    assert.deepEqual(heads, [id], `chains in ${f}`);
    out.push(Number(m[1]));
  }
  return out;
}

/** serveConfig is the serve configuration of the suite's signerd without its audit block. */
function serveConfig() {
  return {
    listen: "127.0.0.1:0",
    tls: { cert: join(dir, "pki", "signerd.pem"), key: join(dir, "pki", "signerd.key"), client_ca: join(dir, "pki", "ca.pem") },
    key_dir: join(dir, "signer"),
    public_dir: join(dir, "public"),
    policy: join(dir, "policy.yaml"),
    shutdown_timeout: "5s",
  };
}

function managerd(): SignerTransportOptions {
  return {
    address,
    caFile: join(dir, "pki", "ca.pem"),
    certFile: join(dir, "pki", "clients", `managerd-${SPACE}.pem`),
    keyFile: join(dir, "pki", "clients", `managerd-${SPACE}.key`),
    serverName: "localhost",
    serverId: SERVER_ID,
  };
}

function agentParams() {
  return create(ProfileParamsSchema, {
    owner: "u_ts",
    actor: "worker",
    lifecycleUid: "01hzyx0000000000000000000a",
    subscribe: ["general"],
    allowSubscribe: ["general"],
    allowPublish: ["general"],
  });
}

async function mintAgent(userPublicKey: string, ttlSeconds?: bigint) {
  const { credential } = await client.mint({
    space: SPACE,
    profile: Profile.AGENT,
    userPublicKey,
    params: agentParams(),
    ...(ttlSeconds !== undefined ? { ttl: { seconds: ttlSeconds } } : {}),
  });
  assert.ok(credential !== undefined, "Mint returned no credential");
  return credential;
}

/** dataAccount reads the data account public key from signerd init's public facts, not from
 * signerd, so the claim is checked against an independent source. */
function dataAccount(): string {
  const hex = Buffer.from(SPACE).toString("hex");
  const facts = JSON.parse(readFileSync(join(dir, "public", `space.${hex}.json`), "utf8")) as { data_account_public_key: string };
  return facts.data_account_public_key;
}

interface Claims {
  jti?: string;
  sub?: string;
  iat?: number;
  exp?: number;
  nats?: { issuer_account?: string; type?: string };
}

function jwtPayload(token: string): Claims {
  const part = token.split(".")[1];
  assert.ok(part !== undefined, "not a JWT");
  return JSON.parse(Buffer.from(part, "base64url").toString("utf8")) as Claims;
}

function fakeJWT(payload: object): string {
  const enc = (v: object) => Buffer.from(JSON.stringify(v)).toString("base64url");
  return `${enc({ typ: "JWT", alg: "ed25519-nkey" })}.${enc(payload)}.sig`;
}

/** errorInfo encodes a google.rpc.ErrorInfo the way signerd does. */
function errorInfo(reason: string, domain: string): Uint8Array {
  const w = new BinaryWriter();
  w.tag(1, 2).string(reason);
  w.tag(2, 2).string(domain);
  w.tag(3, 2).fork().tag(1, 2).string("code").tag(2, 2).string("x").join();
  return w.finish();
}

/** rejection awaits p and returns what it rejected with; it fails if p resolves. */
async function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => assert.fail("call succeeded; want a refusal"),
    (err: unknown) => err,
  );
}

/** startSignerd spawns `signerd serve` and resolves once it logs "signerd serving", with the
 * address it listens on. It rejects if signerd exits first or the deadline passes. */
function startSignerd(config: string, deadlineMs: number): Promise<{ child: ChildProcess; listen: string }> {
  const child = spawn(signerdBin, ["serve", "--config", config], { stdio: ["ignore", "ignore", "pipe"] });
  const stderr: string[] = [];
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`signerd did not log "signerd serving" within ${deadlineMs} ms:\n${stderr.join("\n")}`));
    }, deadlineMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`signerd exited with ${code} before serving:\n${stderr.join("\n")}`));
    });
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    // Keep reading after start-up, so signerd never blocks on a full pipe.
    createInterface({ input: child.stderr! }).on("line", (line) => {
      if (stderr.length < 200) {
        stderr.push(line);
      }
      let entry: { msg?: unknown; listen?: unknown };
      try {
        entry = JSON.parse(line) as typeof entry;
      } catch {
        return;
      }
      if (entry.msg === "signerd serving" && typeof entry.listen === "string") {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        resolve({ child, listen: entry.listen });
      }
    });
  });
}

/** stopSignerd sends SIGTERM and resolves with the exit code; SIGKILL after the deadline. */
function stopSignerd(child: ChildProcess, deadlineMs: number): Promise<number | null> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), deadlineMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve(code);
    });
    child.kill("SIGTERM");
  });
}
