// The ManagerService client against a live managerd: the Go binaries (bin/signerd, bin/managerd and
// bin/nats-server, or $SIGNERD_BIN, $MANAGERD_BIN, $NATS_SERVER_BIN) run as they would on a machine:
// `signerd init` and `signerd pki init` into a temporary directory, `signerd serve` on 127.0.0.1,
// nats-server on the broker configuration init rendered, `managerd provision`, then `managerd serve`
// with its ManagerService socket, called from Node. No launcher runs, so a Spawn that passes
// admission fails at the launch, which proves the admission and the clean-up of a failed spawn.

import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Code } from "@connectrpc/connect";

import {
  LeaseState,
  ManagerError,
  Reason,
  createManagerClient,
  createManagerTransport,
  managerReasonOf,
  type ManagerClient,
  type ManagerTransport,
} from "@cotalgo/signer/manager";

const run = promisify(execFile);
const TIMEOUT = { timeout: 30_000 };
const SPACE = "alpha";
const INSTANCE = "tsliveaaaaaaaaaaaaaaaaaaaa";

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));
const bins = {
  signerd: process.env.SIGNERD_BIN ?? join(repoRoot, "bin", "signerd"),
  managerd: process.env.MANAGERD_BIN ?? join(repoRoot, "bin", "managerd"),
  natsServer: process.env.NATS_SERVER_BIN ?? join(repoRoot, "bin", "nats-server"),
};

/** managerd of alpha may mint what it needs: its supervisor, the one-shot provisioner and
 * deprovisioner, and agents on general. */
const POLICY = `version: 1
callers:
  - id: spiffe://cotal.local/managerd/{space}
    rpcs: [Mint, Remint, GetSpace]
    spaces: ["{space}"]
    rate: {per_second: 1000, burst: 1000}
    profiles:
      agent: {ttl_max: 1h, any_owner: true, channels: ["general"]}
      supervisor: {ttl_max: 24h, any_owner: true}
      provisioner: {ttl_max: 5m, any_owner: true, remint: none}
      deprovisioner: {ttl_max: 5m, any_owner: true, remint: none}
`;

let dir = "";
const children: ChildProcess[] = [];
let managerd: ChildProcess | undefined;
let managerdLog = "";
let transport: ManagerTransport;
let client: ManagerClient;

/** A free TCP port on 127.0.0.1. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr !== null ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

/** startUntil spawns bin and resolves once a line of its stderr satisfies match (with match's
 * value); it rejects if the process exits first or the deadline passes. The output is kept
 * (bounded) for failure messages and keeps being drained. */
function startUntil<T>(bin: string, args: string[], match: (line: string) => T | undefined, deadlineMs: number): Promise<{ child: ChildProcess; value: T; log: () => string }> {
  const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] });
  children.push(child);
  const lines: string[] = [];
  const log = () => lines.join("\n");
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${bin} ${args[0]}: not ready within ${deadlineMs} ms:\n${log()}`)), deadlineMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${bin} ${args[0]} exited with ${code} before it was ready:\n${log()}`));
    });
    createInterface({ input: child.stderr! }).on("line", (line) => {
      if (lines.length < 400) {
        lines.push(line);
      }
      const value = match(line);
      if (value !== undefined) {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        resolve({ child, value, log });
      }
    });
  });
}

/** jsonMsg matches a JSON log line whose msg is msg. */
function jsonMsg(msg: string): (line: string) => true | undefined {
  return (line) => {
    try {
      return (JSON.parse(line) as { msg?: unknown }).msg === msg ? true : undefined;
    } catch {
      return undefined;
    }
  };
}

/** stop sends SIGTERM and resolves with the exit code; SIGKILL after the deadline. */
function stop(child: ChildProcess, deadlineMs: number): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve(child.exitCode);
  }
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), deadlineMs);
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve(code);
    });
    child.kill("SIGTERM");
  });
}

before(
  async () => {
    for (const [name, bin] of Object.entries(bins)) {
      assert.ok(existsSync(bin), `${name} binary ${bin} is missing: build it with 'make test-ts'`);
    }
    dir = mkdtempSync(join(tmpdir(), "managerd-ts-"));
    const natsPort = await freePort();
    await run(bins.signerd, ["init", "--dir", dir, "--space", SPACE, "--port", String(natsPort)]);
    await run(bins.signerd, ["pki", "init", "--dir", join(dir, "pki"), "--space", SPACE]);
    const policy = join(dir, "policy.yaml");
    writeFileSync(policy, POLICY, { mode: 0o600 });
    const signerCfg = join(dir, "signerd.yaml");
    // JSON is YAML: every path is quoted whatever the temporary directory is called.
    writeFileSync(
      signerCfg,
      JSON.stringify({
        listen: "127.0.0.1:0",
        tls: { cert: join(dir, "pki", "signerd.pem"), key: join(dir, "pki", "signerd.key"), client_ca: join(dir, "pki", "ca.pem") },
        key_dir: join(dir, "signer"),
        public_dir: join(dir, "public"),
        policy,
        audit: { path: join(dir, "audit", "signerd.audit"), replica: "ts-live" },
        shutdown_timeout: "5s",
      }),
      { mode: 0o600 },
    );
    const signerd = await startUntil(
      bins.signerd,
      ["serve", "--config", signerCfg],
      (line) => {
        try {
          const e = JSON.parse(line) as { msg?: unknown; listen?: unknown };
          return e.msg === "signerd serving" && typeof e.listen === "string" ? e.listen : undefined;
        } catch {
          return undefined;
        }
      },
      20_000,
    );
    await startUntil(bins.natsServer, ["-c", join(dir, "broker", "nats.conf")], (line) => (line.includes("Server is ready") ? true : undefined), 20_000);

    const broker = `nats://127.0.0.1:${natsPort}`;
    const signer = {
      address: signerd.value,
      ca: join(dir, "pki", "ca.pem"),
      cert: join(dir, "pki", "clients", `managerd-${SPACE}.pem`),
      key: join(dir, "pki", "clients", `managerd-${SPACE}.key`),
    };
    const provisionCfg = join(dir, "provision.yaml");
    writeFileSync(provisionCfg, JSON.stringify({ brokers: [broker], signer }), { mode: 0o600 });
    await run(bins.managerd, ["provision", "--space", SPACE, "--config", provisionCfg]);

    const socketPath = join(dir, "api", "manager.sock");
    mkdirSync(join(dir, "root"));
    const managerCfg = join(dir, "managerd.yaml");
    writeFileSync(
      managerCfg,
      JSON.stringify({
        space: SPACE,
        brokers: [broker],
        signer,
        state_dir: join(dir, "managerd-state"),
        instance_id: INSTANCE,
        root: join(dir, "root"),
        owner: "local",
        actor: "manager",
        launcher: { socket: join(dir, "no-launcher", "launcher.sock"), token_file: join(dir, "no-launcher-token", "token") },
        api: { socket: socketPath, allow_uids: [process.getuid!()] },
        connectors: ["testagent"],
        signer_seed_paths: [join(dir, "signer"), join(dir, "operator")],
      }),
      { mode: 0o600 },
    );
    // One uid runs everything here, so the signer's keys are readable by managerd: the
    // development flag, and its loud warning, are the single-uid stack's way past that refusal.
    const started = await startUntil(bins.managerd, ["serve", "--config", managerCfg, "--dev-allow-readable-seeds"], jsonMsg("ManagerService serving"), 30_000);
    managerd = started.child;
    managerdLog = started.log();
    assert.match(managerdLog, /DEVELOPMENT MODE/);
    transport = createManagerTransport({ socketPath });
    client = createManagerClient(transport);
  },
  { timeout: 120_000 },
);

after(
  async () => {
    transport?.close();
    try {
      for (const child of children.reverse()) {
        await stop(child, 10_000);
      }
    } finally {
      if (dir !== "") {
        rmSync(dir, { recursive: true, force: true });
      }
    }
  },
  { timeout: 60_000 },
);

async function refusal(p: Promise<unknown>): Promise<ManagerError> {
  const err = await p.then(
    () => assert.fail("call succeeded; want a refusal"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ManagerError, `want ManagerError, got ${String(err)}`);
  return err;
}

test("ok/status of a live managerd", TIMEOUT, async () => {
  const st = await client.status({});
  assert.equal(st.space, SPACE);
  assert.equal(st.instanceId, INSTANCE);
  assert.equal(st.lease, LeaseState.HELD);
  assert.equal(st.signer?.reachable, true);
  assert.deepEqual(st.connectors, ["testagent"]);
  assert.equal(st.agents, 0);
  assert.ok(st.supervisor?.expiresAt !== undefined, "no supervisor credential expiry");
  assert.deepEqual((await client.list({})).agents, []);
});

test("fail/admission refusals carry their reason", TIMEOUT, async () => {
  const cases: [object, Code, Reason][] = [
    [{ name: "a1", connector: "bash" }, Code.InvalidArgument, Reason.CONNECTOR_UNKNOWN],
    [{ name: "../a1", connector: "testagent" }, Code.InvalidArgument, Reason.NAME_INVALID],
    [{ name: "a1", connector: "testagent", subscribe: ["ops"], allowSubscribe: ["general"] }, Code.InvalidArgument, Reason.SUBSCRIBE_NOT_ALLOWED],
    [{ name: "a1", connector: "testagent", env: { LD_PRELOAD: "/x.so" } }, Code.InvalidArgument, Reason.ENV_NOT_ALLOWED],
  ];
  for (const [req, code, reason] of cases) {
    const err = await refusal(client.spawn(req));
    assert.equal(err.code, code, `${JSON.stringify(req)}: code`);
    assert.equal(managerReasonOf(err), reason, `${JSON.stringify(req)}: reason`);
  }
  const unknown = await refusal(client.stop({ name: "nobody" }));
  assert.equal(unknown.code, Code.NotFound);
  assert.equal(managerReasonOf(unknown), Reason.AGENT_UNKNOWN);
});

test("fail/a spawn the launcher cannot take leaves nothing behind", TIMEOUT, async () => {
  // Admission passes, the durables are provisioned and the credential minted, then the launch
  // fails (no launcher runs): everything is undone.
  const err = await refusal(client.spawn({ name: "a2", connector: "testagent" }));
  assert.equal(managerReasonOf(err), Reason.LAUNCH_FAILED);
  assert.deepEqual((await client.list({})).agents, []);
  assert.equal((await client.status({})).agents, 0);
});

test("ok/shutdown runs once and managerd exits 0", TIMEOUT, async () => {
  const resp = await client.shutdown({ withAgents: false });
  assert.deepEqual(resp.stopped, []);
  assert.deepEqual(resp.spared, []);
  const code = await new Promise<number | null>((resolve) => {
    if (managerd!.exitCode !== null) {
      resolve(managerd!.exitCode);
      return;
    }
    managerd!.once("exit", (c) => resolve(c));
  });
  assert.equal(code, 0);
});
