// The mTLS transport to signerd: gRPC over HTTP/2, TLS 1.3, the client certificate and key read
// from PEM files, signerd's certificate verified against a CA bundle for a fixed server name (and
// optionally its SPIFFE ID). Generation cannot produce this part: it is configuration, not API.

import { closeSync, constants, fstatSync, openSync, readFileSync } from "node:fs";
import { isIP } from "node:net";
import { checkServerIdentity, type PeerCertificate } from "node:tls";
import type { ClientHttp2Stream, ClientSessionRequestOptions, OutgoingHttpHeaders, SecureClientSessionOptions, Settings } from "node:http2";

import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { SignerService } from "./gen/cotal/signer/v1/signer_pb.js";
import { Deadline } from "./deadline.js";
import { signerErrors } from "./errors.js";

/** DEFAULT_SERVER_NAME is the name signerd's certificate is verified for unless serverName says
 * otherwise (`signerd pki init` issues signerd's certificate for localhost and 127.0.0.1). */
export const DEFAULT_SERVER_NAME = "localhost";

/** DEFAULT_TIMEOUT_MS bounds every call that sets no timeout of its own. */
export const DEFAULT_TIMEOUT_MS = 10_000;

/** DEFAULT_MAX_CONCURRENT_CALLS is how many calls go to one replica at once unless
 * SignerTransportOptions.maxConcurrentCalls says otherwise: signerd's default
 * limits.max_concurrent_streams, the HTTP/2 streams it allows on one connection. */
export const DEFAULT_MAX_CONCURRENT_CALLS = 32;

/** maxPEMBytes bounds each certificate, key and CA file read. */
const maxPEMBytes = 1 << 20;

/** SignerTransportOptions configure createSignerTransport. caFile, certFile, keyFile and exactly
 * one of address and addresses are required: signerd serves only callers with a verified client
 * certificate. */
export interface SignerTransportOptions {
  /** signerd's TCP address as in its `listen` ("127.0.0.1:7443", "[::1]:7443", "signer.example:7443")
   * or an https:// URL. Unix sockets and plain http:// are refused. */
  address?: string;
  /** Several signerd replicas instead of address, each written as address is, no duplicates. Calls
   * go to one replica at a time and move to the next on Code.Unavailable (see
   * createSignerTransport). Every replica must present a certificate valid for serverName (and
   * serverId, when set). */
  addresses?: string[];
  /** PEM bundle of the CA(s) signerd's certificate must chain to. */
  caFile: string;
  /** PEM client certificate; its only URI SAN is the caller's identity
   * (spiffe://cotal.local/managerd/<space>). */
  certFile: string;
  /** PEM private key of certFile. Refused when it is a symlink, not a regular file, readable by
   * group or others, or owned by another user. */
  keyFile: string;
  /** The name signerd's certificate is verified for; DEFAULT_SERVER_NAME when unset. */
  serverName?: string;
  /** When set, signerd's certificate must carry exactly this URI SAN
   * (e.g. "spiffe://cotal.local/signerd"); any other server fails the handshake. */
  serverId?: string;
  /** Timeout of each call that sets none; DEFAULT_TIMEOUT_MS when unset. Must be positive. */
  timeoutMs?: number;
  /** Further interceptors, run inside the one that turns failures into SignerErrors. */
  interceptors?: Interceptor[];
  /** How many calls (unary calls and open streams, such as createSignerCalls' Stream) go to one
   * replica at once; the others wait their turn in order. DEFAULT_MAX_CONCURRENT_CALLS when unset.
   * A signerd that advertises a lower limit (its limits.max_concurrent_streams) lowers it once its
   * HTTP/2 settings have been read; a higher one does not raise it, so set this to signerd's limit
   * when that is raised, and when it is lowered (until the first connection's settings are read,
   * this is the only bound). A positive integer. */
  maxConcurrentCalls?: number;
}

/** SignerTransport is a Connect transport to signerd that can be closed. */
export interface SignerTransport extends Transport {
  /** close ends the HTTP/2 connections; calls made after it fail. */
  close(): void;
  /** failovers counts the calls sent again to another replica after one answered
   * Code.Unavailable (always 0 with a single address). */
  readonly failovers: number;
  /** The timeout of each call that sets none (SignerTransportOptions.timeoutMs). */
  readonly timeoutMs: number;
  /** queued counts the calls waiting for a replica's turn (see maxConcurrentCalls). */
  readonly queued: number;
}

/** SignerConfigError is a refused transport configuration; path names the offending file, if any. */
export class SignerConfigError extends Error {
  override name = "SignerConfigError";
  /** The file that was refused, or "" when the problem is not a file. */
  readonly path: string;

  constructor(message: string, path = "", options?: ErrorOptions) {
    super(path === "" ? `signer: ${message}` : `signer: ${path}: ${message}`, options);
    this.path = path;
  }
}

/**
 * createSignerTransport reads the PEM files and returns a gRPC (HTTP/2) transport to signerd over
 * TLS 1.3 with this caller's client certificate. Every call through it fails with a SignerError.
 * The connection is made by the first call, so it does not fail when signerd is down; calls do,
 * with Code.Unavailable.
 *
 * With several addresses it keeps one HTTP/2 session per replica and sends each unary call to the
 * current replica (the first address at start). A call that fails with Code.Unavailable (the
 * replica is down, its handshake failed, or it refused the call because its audit log broke) is
 * sent again, unchanged, to the next address, and so on: each address at most once per call. The
 * address that answers becomes the current one, so after a replica dies only the calls in flight
 * at that moment pay one extra attempt. Any other failure (a refusal, Code.DeadlineExceeded, an
 * abort) is returned at once: a replica that does not answer within the timeout is not skipped
 * for a call already waiting on it. Nothing checks health in the background and nothing moves
 * calls back to a replica that recovers; it is used again only when the current one fails.
 * Resending is safe for every SignerService call: signerd keeps no state but its keys, so a call
 * repeated on another replica at worst mints or signs a second time for the same key
 * (docs/signerd.md, "Replicas"). Interceptors run once per attempt.
 *
 * A replica takes at most maxConcurrentCalls calls at once (unary calls and open streams alike,
 * each holds one HTTP/2 stream): signerd refuses HTTP/2 streams beyond its per-connection limit
 * and Node's HTTP/2 client sends a new connection's first requests before it has read that limit.
 * Calls beyond it wait, first come first served, and their timeout and AbortSignal count while
 * they wait: one that times out or is aborted in the queue fails Code.DeadlineExceeded or
 * Code.Canceled and is never sent; the time waited comes out of its timeout. A failover moves a
 * call to the next replica's queue.
 *
 * It throws SignerConfigError for a missing option, both or neither of address and addresses, an
 * unsupported or repeated address, an invalid maxConcurrentCalls, or a file it cannot read or will
 * not trust (a client key looser than 0600, a symlink, another owner's file).
 */
export function createSignerTransport(opts: SignerTransportOptions): SignerTransport {
  for (const k of ["caFile", "certFile", "keyFile"] as const) {
    if (typeof opts[k] !== "string" || opts[k] === "") {
      throw new SignerConfigError(`option ${k} is required`);
    }
  }
  const baseUrls = baseUrlsOf(opts);
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new SignerConfigError(`timeoutMs ${timeoutMs} is not a positive number`);
  }
  const maxCalls = opts.maxConcurrentCalls ?? DEFAULT_MAX_CONCURRENT_CALLS;
  if (!Number.isSafeInteger(maxCalls) || maxCalls <= 0) {
    throw new SignerConfigError(`maxConcurrentCalls ${maxCalls} is not a positive integer`);
  }
  const serverName = opts.serverName ?? DEFAULT_SERVER_NAME;
  const serverId = opts.serverId ?? "";
  const tlsOptions: SecureClientSessionOptions = {
    ca: readPublicFile(opts.caFile),
    cert: readPublicFile(opts.certFile),
    key: readSecretFile(opts.keyFile),
    minVersion: "TLSv1.3",
    // Explicit, so NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment cannot switch it off.
    rejectUnauthorized: true,
    // SNI cannot carry an IP address; the name is verified below either way.
    ...(isIP(serverName) === 0 ? { servername: serverName } : {}),
    checkServerIdentity: (_host: string, cert: PeerCertificate) => {
      const err = checkServerIdentity(serverName, cert);
      if (err !== undefined) {
        return err;
      }
      if (serverId !== "") {
        const uris = uriSANs(cert.subjectaltname ?? "");
        if (uris.length !== 1 || uris[0] !== serverId) {
          // The code Node uses for a certificate that does not name the expected server.
          return Object.assign(new Error(`signer: server certificate URI SANs [${uris.join(", ")}] are not exactly ${serverId}`), {
            code: "ERR_TLS_CERT_ALTNAME_INVALID",
          });
        }
      }
      return undefined;
    },
  };
  const replicas = baseUrls.map((baseUrl) => {
    const turns = new Turns(maxCalls);
    const sessionManager = new SettingsReader(baseUrl, tlsOptions, (n) => turns.peerLimit(n));
    const transport = queued(
      createGrpcTransport({
        baseUrl,
        sessionManager,
        defaultTimeoutMs: timeoutMs,
        interceptors: [signerErrors, ...(opts.interceptors ?? [])],
      }),
      turns,
      timeoutMs,
    );
    return { transport, sessionManager, turns };
  });
  const queuedCalls = () => replicas.reduce((n, r) => n + r.turns.waiting, 0);
  if (replicas.length === 1) {
    const { transport, sessionManager } = replicas[0]!;
    return {
      timeoutMs,
      failovers: 0,
      get queued() {
        return queuedCalls();
      },
      close: () => sessionManager.abort(),
      unary: transport.unary,
      stream: transport.stream,
    };
  }
  let current = 0;
  let failovers = 0;
  return {
    timeoutMs,
    get failovers() {
      return failovers;
    },
    get queued() {
      return queuedCalls();
    },
    close() {
      for (const r of replicas) {
        r.sessionManager.abort();
      }
    },
    async unary(method, signal, timeout, header, input, contextValues) {
      const first = current;
      for (let attempt = 0; ; attempt++) {
        const i = (first + attempt) % replicas.length;
        try {
          const res = await replicas[i]!.transport.unary(method, signal, timeout, header, input, contextValues);
          current = i;
          return res;
        } catch (err) {
          const last = attempt === replicas.length - 1;
          if (last || signal?.aborted === true || !(err instanceof ConnectError) || !connectionLost(err)) {
            throw err;
          }
          failovers++;
        }
      }
    },
    stream(method, signal, timeout, header, input, contextValues) {
      // A stream (SignerService's Stream, see createSignerCalls) goes to the current replica,
      // without failover: a call sent on it may not be sent again.
      return replicas[current]!.transport.stream(method, signal, timeout, header, input, contextValues);
    },
  };
}

/** noPeerLimit is HTTP/2's initial SETTINGS_MAX_CONCURRENT_STREAMS (no limit), which Node reports
 * until the peer's SETTINGS have been read. */
const noPeerLimit = 2 ** 32 - 1;

/** SettingsReader is connect-node's session manager, telling onLimit the peer's
 * SETTINGS_MAX_CONCURRENT_STREAMS of each HTTP/2 session it opens a stream on (connect-node does
 * not expose the session itself; each stream names it). */
class SettingsReader extends Http2SessionManager {
  private readonly seen = new WeakSet<object>();

  constructor(
    baseUrl: string,
    tlsOptions: SecureClientSessionOptions,
    private readonly onLimit: (n: number) => void,
  ) {
    super(baseUrl, undefined, tlsOptions);
  }

  override async request(
    method: string,
    path: string,
    headers: OutgoingHttpHeaders,
    options: Omit<ClientSessionRequestOptions, "signal">,
  ): Promise<ClientHttp2Stream> {
    const stream = await super.request(method, path, headers, options);
    const session = stream.session;
    if (session !== undefined && !this.seen.has(session)) {
      this.seen.add(session);
      const read = (s: Settings) => {
        if (s.maxConcurrentStreams !== undefined && s.maxConcurrentStreams < noPeerLimit) {
          this.onLimit(s.maxConcurrentStreams);
        }
      };
      read(session.remoteSettings);
      session.on("remoteSettings", read);
    }
    return stream;
  }
}

/** Turns lets at most limit() calls to one replica run at once and queues the others, first come
 * first served. */
class Turns {
  private running = 0;
  private peer = Infinity;
  private readonly queue: { grant: () => void }[] = [];

  constructor(private readonly cap: number) {}

  get waiting(): number {
    return this.queue.length;
  }

  private limit(): number {
    return Math.min(this.cap, this.peer);
  }

  /** peerLimit records the replica's advertised stream limit (0 is taken as 1: a call then waits
   * for the one before it rather than for ever). */
  peerLimit(n: number): void {
    this.peer = Math.max(1, n);
    this.pump();
  }

  /** take resolves with the function that ends the call's turn once it may run; it rejects, and
   * leaves the queue, when the call's deadline (its timeout or AbortSignal) ends the wait first. */
  take(deadline: Deadline): Promise<() => void> {
    return new Promise((resolve, reject) => {
      let done = false;
      const end = () => {
        if (!done) {
          done = true;
          this.running--;
          this.pump();
        }
      };
      let waiting = true;
      const entry = {
        grant: () => {
          waiting = false;
          this.running++;
          resolve(end);
        },
      };
      if (deadline.ended()) {
        reject(deadline.error());
        return;
      }
      if (this.queue.length === 0 && this.running < this.limit()) {
        entry.grant();
        return;
      }
      this.queue.push(entry);
      deadline.onEnd((err) => {
        if (!waiting) {
          return; // granted first: the call itself sees its timeout or abort
        }
        waiting = false;
        this.queue.splice(this.queue.indexOf(entry), 1);
        reject(err);
      });
    });
  }

  private pump(): void {
    while (this.queue.length > 0 && this.running < this.limit()) {
      this.queue.shift()!.grant();
    }
  }
}

/** queued wraps one replica's transport so each call waits for its turn (turns) before it is sent.
 * A unary call's turn ends when it settles; a stream's when its response ends, fails, or its
 * signal aborts. A call's timeout (defaultTimeoutMs when it sets none; 0 or less for none) runs
 * from the moment it is made: the transport is given what is left of it. */
function queued(inner: Transport, turns: Turns, defaultTimeoutMs: number): Transport {
  // turn waits for the call's turn and returns its end and the timeout left for the transport: at
  // least 1 ms (0 would be none for Connect; the turn was granted before the deadline), or the
  // call's own when it has none.
  const turn = async (signal: AbortSignal | undefined, timeout: number | undefined) => {
    const deadline = new Deadline(timeout ?? defaultTimeoutMs, signal);
    try {
      const end = await turns.take(deadline);
      const rest = deadline.remainingMs();
      return { end, timeout: Number.isFinite(rest) ? Math.max(1, rest) : timeout };
    } finally {
      deadline.dispose();
    }
  };
  return {
    async unary(method, signal, timeout, header, input, contextValues) {
      const { end, timeout: left } = await turn(signal, timeout);
      try {
        return await inner.unary(method, signal, left, header, input, contextValues);
      } finally {
        end();
      }
    },
    async stream(method, signal, timeout, header, input, contextValues) {
      const { end, timeout: left } = await turn(signal, timeout);
      const onAbort = () => finish();
      const finish = () => {
        signal?.removeEventListener("abort", onAbort);
        end();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      let res;
      try {
        res = await inner.stream(method, signal, left, header, input, contextValues);
      } catch (err) {
        finish();
        throw err;
      }
      const messages = res.message;
      return {
        ...res,
        message: (async function* () {
          try {
            yield* messages;
          } finally {
            finish();
          }
        })(),
      };
    },
  };
}

/** connectionLost reports whether err says the replica was not reached or its connection broke:
 * Unavailable, or Canceled when the caller did not cancel (checked before this is called). A
 * replica killed while its HTTP/2 session is open shows up either way: a new stream on the dead
 * session is reset with CANCEL (connect-node reports Canceled) or the connect fails
 * (Unavailable). Either way the call may be sent to the next replica, as gRPC-Go does on a broken
 * connection. */
function connectionLost(err: ConnectError): boolean {
  return err.code === Code.Unavailable || err.code === Code.Canceled;
}

/** SignerClient is the generated SignerService client. */
export type SignerClient = Client<typeof SignerService>;

/** createSignerClient returns the generated SignerService client over transport (see
 * createSignerTransport); its calls fail with SignerError when transport is a SignerTransport. */
export function createSignerClient(transport: Transport): SignerClient {
  return createClient(SignerService, transport);
}

/** baseUrlsOf returns the base URL of each configured address: address alone or addresses, never
 * both or neither, no address twice. */
function baseUrlsOf(opts: SignerTransportOptions): string[] {
  const hasOne = typeof opts.address === "string" && opts.address !== "";
  const hasList = Array.isArray(opts.addresses) && opts.addresses.length > 0;
  if (hasOne && hasList) {
    throw new SignerConfigError("options address and addresses are both set; keep one");
  }
  if (!hasOne && !hasList) {
    throw new SignerConfigError("option address (or addresses) is required");
  }
  const list = hasOne ? [opts.address!] : opts.addresses!;
  const seen = new Set<string>();
  return list.map((a) => {
    if (typeof a !== "string" || a === "") {
      throw new SignerConfigError("addresses holds an empty address");
    }
    const u = baseUrlOf(a);
    if (seen.has(u)) {
      throw new SignerConfigError(`address ${a} is listed twice`);
    }
    seen.add(u);
    return u;
  });
}

/** baseUrlOf turns signerd's address into the https base URL of its gRPC service. */
function baseUrlOf(address: string): string {
  if (address.startsWith("unix:")) {
    throw new SignerConfigError(`address ${address}: unix sockets are not supported; use a TCP listener`);
  }
  if (address.includes("://")) {
    let u: URL;
    try {
      u = new URL(address);
    } catch (err) {
      throw new SignerConfigError(`address ${address} is not a URL`, "", { cause: err });
    }
    if (u.protocol !== "https:") {
      throw new SignerConfigError(`address ${address}: only https:// is supported (signerd requires TLS)`);
    }
    return u.origin;
  }
  let u: URL;
  try {
    u = new URL(`https://${address}`);
  } catch (err) {
    throw new SignerConfigError(`address ${address} is not host:port`, "", { cause: err });
  }
  if (u.port === "" || u.pathname !== "/" || u.username !== "" || u.search !== "") {
    throw new SignerConfigError(`address ${address} is not host:port`);
  }
  return u.origin;
}

/** uriSANs lists the URI entries of a Node subjectaltname string. Node quotes entries holding
 * separators; such an entry never equals a plain SPIFFE ID, so it is refused, not parsed. */
function uriSANs(subjectAltName: string): string[] {
  return subjectAltName
    .split(", ")
    .filter((e) => e.startsWith("URI:"))
    .map((e) => e.slice("URI:".length));
}

/** readPublicFile reads a certificate or CA bundle. */
function readPublicFile(path: string): Buffer {
  let data: Buffer;
  try {
    data = readFileSync(path);
  } catch (err) {
    throw new SignerConfigError(errorText(err), path, { cause: err });
  }
  if (data.length > maxPEMBytes) {
    throw new SignerConfigError(`larger than ${maxPEMBytes} bytes`, path);
  }
  return data;
}

/** readSecretFile reads the client key the way the Go side reads secret files: not through a
 * symlink, a regular file, no group or other permission bit, owned by this process's user,
 * checked on the open descriptor. */
function readSecretFile(path: string): Buffer {
  let fd: number;
  try {
    fd = openSync(path, constants.O_RDONLY | (constants.O_NOFOLLOW ?? 0));
  } catch (err) {
    const text = (err as NodeJS.ErrnoException).code === "ELOOP" ? "is a symlink; want a regular file" : errorText(err);
    throw new SignerConfigError(text, path, { cause: err });
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) {
      throw new SignerConfigError("is not a regular file", path);
    }
    if ((st.mode & 0o077) !== 0) {
      throw new SignerConfigError(`mode ${(st.mode & 0o777).toString(8).padStart(4, "0")} is looser than 0600`, path);
    }
    const euid = process.geteuid?.();
    if (euid !== undefined && st.uid !== euid) {
      throw new SignerConfigError(`owned by uid ${st.uid}, not ${euid}`, path);
    }
    if (st.size > maxPEMBytes) {
      throw new SignerConfigError(`larger than ${maxPEMBytes} bytes`, path);
    }
    return readFileSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** errorText describes a failed open or read without repeating the path. */
function errorText(err: unknown): string {
  switch ((err as NodeJS.ErrnoException).code) {
    case "ENOENT":
      return "does not exist";
    case "EACCES":
      return "permission denied";
    case "EISDIR":
      return "is a directory";
    default:
      return err instanceof Error ? err.message : String(err);
  }
}
