// The ManagerService client against the real Go API layer: managerd/internal/api served on a
// Unix socket by managerd/internal/api/apitest (a scripted Backend, built here with go build),
// called from Node over gRPC on that socket. managerd-live.test.ts runs the client against a live managerd.

import assert from "node:assert/strict";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Code } from "@connectrpc/connect";

import { manager as managerNS } from "@cotalgo/signer";
import {
  LeaseState,
  MANAGER_ERROR_DOMAIN,
  ManagerError,
  Reason,
  createManagerClient,
  createManagerTransport,
  managerReasonOf,
  type AttachRequestSchema,
  type AttachResponse,
  type ManagerClient,
  type ManagerTransport,
} from "@cotalgo/signer/manager";
import type { MessageInitShape } from "@bufbuild/protobuf";

const run = promisify(execFile);
const TIMEOUT = { timeout: 15_000 };

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

let dir = "";
let server: ChildProcess | undefined;
let transport: ManagerTransport;
let client: ManagerClient;
/** What apitest logged (its stderr). */
let serverLog = "";

before(
  async () => {
    dir = mkdtempSync(join(tmpdir(), "manager-ts-"));
    const bin = join(dir, "apitest");
    await run("go", ["build", "-o", bin, "./managerd/internal/api/apitest"], {
      cwd: repoRoot,
      env: { ...process.env, GOTOOLCHAIN: "auto" },
    });
    const socketPath = join(dir, "run", "manager.sock");
    server = spawn(bin, ["--socket", socketPath], { stdio: ["pipe", "pipe", "pipe"] });
    server.stderr!.setEncoding("utf8").on("data", (chunk: string) => (serverLog += chunk));
    const lines = createInterface({ input: server.stdout! });
    await new Promise<void>((resolve, reject) => {
      server!.once("exit", (code) => reject(new Error(`apitest exited with ${code} before it was ready`)));
      lines.once("line", (line) => (line === "ready" ? resolve() : reject(new Error(`apitest said ${line}`))));
    });
    transport = createManagerTransport({ socketPath });
    client = createManagerClient(transport);
  },
  { timeout: 180_000 },
);

after(() => {
  transport?.close();
  server?.stdin?.end();
  server?.kill("SIGTERM");
  if (dir !== "") {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("Status round trip over the Unix socket", TIMEOUT, async () => {
  const st = await client.status({});
  assert.equal(st.space, "alpha");
  assert.equal(st.instanceId, "apitest");
  assert.equal(st.lease, LeaseState.HELD);
  assert.deepEqual(st.connectors, ["echo"]);
  assert.equal(st.capacity, 4);
  const ls = await client.list({});
  assert.deepEqual(
    ls.agents.map((a) => [a.name, a.pid]),
    [["echo", 4242]],
  );
});

test("a refusal carries its code and reason (ErrorInfo, domain manager.cotal)", TIMEOUT, async () => {
  await assert.rejects(client.stop({ name: "ghost" }), (err: unknown) => {
    assert.ok(err instanceof ManagerError, `got ${String(err)}`);
    assert.equal(err.code, Code.NotFound);
    assert.equal(err.reason, "AGENT_UNKNOWN");
    assert.equal(err.reasonValue, Reason.AGENT_UNKNOWN);
    assert.equal(managerReasonOf(err), Reason.AGENT_UNKNOWN);
    assert.equal(err.rawMessage, 'no agent "ghost"');
    return true;
  });
  await assert.rejects(client.spawn({ name: "echo", connector: "echo" }), (err: unknown) => {
    assert.ok(err instanceof ManagerError);
    assert.equal(err.code, Code.AlreadyExists);
    assert.equal(err.reason, "NAME_IN_USE");
    return true;
  });
  // Refused at the API before the Backend: an empty name.
  await assert.rejects(client.inspect({ name: "" }), (err: unknown) => {
    assert.ok(err instanceof ManagerError);
    assert.equal(err.code, Code.InvalidArgument);
    assert.equal(err.reason, "INVALID_ARGUMENT");
    return true;
  });
  // A failure with no reason: the scripted Shutdown fails internally, its text withheld.
  await assert.rejects(client.shutdown({}), (err: unknown) => {
    assert.ok(err instanceof ManagerError);
    assert.equal(err.code, Code.Internal);
    assert.equal(err.reason, "UNSPECIFIED");
    assert.equal(err.rawMessage, "internal error");
    return true;
  });
  // The cause went to managerd's log instead.
  const deadline = Date.now() + 10_000;
  while (!serverLog.includes("shutdown is not scripted")) {
    assert.ok(Date.now() < deadline, `the server log never named the cause: ${serverLog}`);
    await new Promise((r) => setTimeout(r, 10));
  }
  assert.equal(MANAGER_ERROR_DOMAIN, "manager.cotal");
});

test("the package root exposes the same ManagerService as a namespace", () => {
  assert.equal(managerNS.Reason.PEER_NOT_ALLOWED, Reason.PEER_NOT_ALLOWED);
  assert.equal(managerNS.createManagerClient, createManagerClient);
});

test("unary calls get the default timeout, Attach streams none", TIMEOUT, async () => {
  const seen = new Map<string, string | null>();
  const t = createManagerTransport({
    socketPath: join(dir, "run", "manager.sock"),
    timeoutMs: 5_000,
    interceptors: [
      (next) => async (req) => {
        seen.set(req.method.name, req.header.get("grpc-timeout"));
        return await next(req);
      },
    ],
  });
  try {
    const c = createManagerClient(t);
    await c.status({});
    const reqs = requests();
    reqs.push({ frame: { case: "open", value: { name: "nobody" } } });
    reqs.end();
    await assert.rejects(
      (async () => {
        for await (const _ of c.attach(reqs)) {
          // refused: no such agent
        }
      })(),
      (err: unknown) => err instanceof ManagerError && err.reason === "AGENT_UNKNOWN",
    );
    assert.equal(seen.get("Status"), "5000m");
    assert.equal(seen.get("Attach"), null);
    assert.equal(seen.size, 2);
  } finally {
    t.close();
  }
});

/** requests is an async iterable the test pushes Attach frames into. */
function requests() {
  const queue: MessageInitShape<typeof AttachRequestSchema>[] = [];
  let wake: (() => void) | undefined;
  let ended = false;
  return {
    push(r: MessageInitShape<typeof AttachRequestSchema>) {
      queue.push(r);
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
    async *[Symbol.asyncIterator](): AsyncGenerator<MessageInitShape<typeof AttachRequestSchema>> {
      for (;;) {
        while (queue.length > 0) {
          yield queue.shift()!;
        }
        if (ended) {
          return;
        }
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    },
  };
}

test("Attach: snapshot first, then output; keystrokes echo; exit ends the stream", TIMEOUT, async () => {
  const enc = new TextEncoder();
  const dec = new TextDecoder();
  const reqs = requests();
  reqs.push({ frame: { case: "open", value: { name: "echo" } } });
  const stream: AsyncIterator<AttachResponse> = client.attach(reqs)[Symbol.asyncIterator]();
  const next = async (): Promise<AttachResponse> => {
    const r = await stream.next();
    assert.ok(!r.done, "the stream ended early");
    return r.value;
  };
  /** readData reads data frames until their text ends with want. */
  const readData = async (want: string): Promise<string> => {
    let got = "";
    while (!got.endsWith(want)) {
      const r = await next();
      assert.equal(r.frame.case, "data", `frame ${r.frame.case} while waiting for ${JSON.stringify(want)}`);
      got += dec.decode(r.frame.value as Uint8Array);
    }
    return got;
  };

  const first = await next();
  assert.equal(first.frame.case, "snapshot");
  assert.equal(dec.decode(first.frame.value as Uint8Array), "SNAPSHOT\r\n");
  assert.equal(await readData("ready\r\n"), "ready\r\n");
  reqs.push({ frame: { case: "resize", value: { rows: 40, cols: 120 } } });
  reqs.push({ frame: { case: "data", value: enc.encode("hi there") } });
  assert.equal(await readData("hi there"), "hi there");
  reqs.push({ frame: { case: "data", value: enc.encode("q") } });
  assert.equal(await readData("q"), "q");
  const last = await next();
  assert.equal(last.frame.case, "exited");
  assert.equal(last.frame.value?.exitCode, 7);
  const end = await stream.next();
  assert.ok(end.done, "the stream did not end after exited");
  reqs.end();

  // A stream whose first frame is not open is refused.
  const bad = requests();
  bad.push({ frame: { case: "data", value: enc.encode("x") } });
  bad.end();
  await assert.rejects(
    (async () => {
      for await (const _ of client.attach(bad)) {
        // nothing is expected
      }
    })(),
    (err: unknown) => {
      assert.ok(err instanceof ManagerError, `got ${String(err)}`);
      assert.equal(err.code, Code.InvalidArgument);
      assert.equal(err.reason, "INVALID_ARGUMENT");
      return true;
    },
  );
});
