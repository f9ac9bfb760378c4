// Calls over signerd's Stream RPC: Mint, OpenCalloutRequest and SignCalloutResponse sent as
// requests on one long-lived bidirectional stream instead of one HTTP/2 stream per call. signerd
// answers each exactly as the unary RPC would (same policy, rate limit, request_id idempotency and
// audit line). This is the Go client's Calls (pkg/signerclient/stream.go) in Connect's streaming
// model: transport.stream() with a request iterable the calls push into.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type CallOptions, type Transport } from "@connectrpc/connect";

import {
  Reason,
  SignerService,
  StreamRequestSchema,
  type MintRequestSchema,
  type MintResponse,
  type OpenCalloutRequestRequestSchema,
  type OpenCalloutRequestResponse,
  type SignCalloutResponseRequestSchema,
  type SignCalloutResponseResponse,
  type StreamRequest,
  type StreamResponse,
} from "./gen/cotal/signer/v1/signer_pb.js";
import { SignerError, statusError, toSignerError } from "./errors.js";
import { Deadline } from "./deadline.js";
import { DEFAULT_TIMEOUT_MS } from "./transport.js";

/** STREAM_HEADER is the response header signerd sends once it has accepted a Stream. */
export const STREAM_HEADER = "cotal-signer-stream";

/** STREAM_MAX_AGE_MS is how long a stream takes new calls before it is retired (the Go client's
 * StreamMaxAge; under signerd's max_connection_age_grace default, so a connection's age limit
 * never cuts a stream with calls in it). */
export const STREAM_MAX_AGE_MS = 20_000;

/** STREAM_RETRY_AFTER_MS is how long the calls use the unary RPCs after signerd answered that it
 * serves no Stream (Code.Unimplemented). */
export const STREAM_RETRY_AFTER_MS = 60_000;

/** SignerCallOptions are the options of one call: its timeout (the calls' timeoutMs when unset; 0
 * or less for none, as for a Connect call) and an AbortSignal that cancels it. */
export type SignerCallOptions = Pick<CallOptions, "timeoutMs" | "signal">;

/** SignerCallsOptions configure createSignerCalls. */
export interface SignerCallsOptions {
  /** Timeout of each call that sets none; the transport's timeoutMs for a SignerTransport,
   * DEFAULT_TIMEOUT_MS otherwise. Must be positive. It also bounds the wait for signerd to accept
   * a new stream. */
  timeoutMs?: number;
  /** How long a stream takes new calls; STREAM_MAX_AGE_MS when unset. */
  maxAgeMs?: number;
  /** How long the unary RPCs are used after signerd answered Unimplemented;
   * STREAM_RETRY_AFTER_MS when unset. */
  retryAfterMs?: number;
  /** The clock the stream's age and the unary period are measured with, in milliseconds;
   * Date.now when unset (tests move it). */
  now?: () => number;
}

/**
 * SignerCalls sends Mint, OpenCalloutRequest and SignCalloutResponse over signerd's Stream when
 * signerd serves it, and by the unary RPCs otherwise. Each method takes the unary method's request
 * and resolves with its response; a refusal is the SignerError the unary call gives (the same
 * code, message, reason, reasonCode and details).
 */
export interface SignerCalls {
  mint(request: MessageInitShape<typeof MintRequestSchema>, options?: SignerCallOptions): Promise<MintResponse>;
  openCalloutRequest(
    request: MessageInitShape<typeof OpenCalloutRequestRequestSchema>,
    options?: SignerCallOptions,
  ): Promise<OpenCalloutRequestResponse>;
  signCalloutResponse(
    request: MessageInitShape<typeof SignCalloutResponseRequestSchema>,
    options?: SignerCallOptions,
  ): Promise<SignCalloutResponseResponse>;
  /** close ends the streams (the current one and any still retiring): calls in flight on them
   * and calls made afterwards fail Code.Unavailable. It does not close the transport. */
  close(): void;
  /** opened counts the streams signerd has accepted. */
  readonly opened: number;
  /** fellBack counts the calls sent by the unary RPCs because no stream was usable. */
  readonly fellBack: number;
  /** drained counts the streams signerd told to drain (StreamDrain). */
  readonly drained: number;
  /** ended counts the streams that have ended, cleanly or not. */
  readonly ended: number;
  /** broken counts the ended streams that did not end cleanly (signerd or the connection broke
   * them, or signerd ended one that was not half-closed in time); close() breaks none. */
  readonly broken: number;
  /** inFlight counts the calls written to a stream (the current one or a retiring one) and not
   * yet answered. */
  readonly inFlight: number;
}

/**
 * createSignerCalls returns SignerCalls over transport, normally a SignerTransport
 * (createSignerTransport). It holds one stream at a time and makes no connection until the first
 * call. Choices made here, as in the Go client:
 *
 * - The stream is opened by the first call that needs it and used only once signerd has accepted
 *   it (its response header cotal-signer-stream). Calls made while it opens wait for it. Each call
 *   carries its own id; answers may come in any order.
 * - A signerd without Stream (Code.Unimplemented) sends the calls to the unary RPCs for
 *   retryAfterMs, then the next call tries again. Any other refusal to open (signerd stopping,
 *   the caller at signerd's stream cap, signerd down) sends the calls that waited for that stream
 *   to the unary RPCs, and the next call tries to open again.
 * - Never a silent resend: a call whose request was written to a stream that then broke fails
 *   Code.Unavailable, and the next call opens a new stream. Only a request that never left (still
 *   queued when its stream ended or began to drain) is sent again, on a new stream or by the
 *   unary RPC.
 * - signerd's StreamDrain (it is stopping or draining) and the stream's age (maxAgeMs) retire a
 *   stream: it takes no new call, is half-closed, and its calls in flight are still answered.
 * - A call's timeout or AbortSignal stops its wait (Code.DeadlineExceeded or Code.Canceled, as the
 *   unary call gives); a request still queued is then never sent, and an answer that comes later
 *   is dropped.
 * - With several replicas (createSignerTransport's addresses) the stream goes to the transport's
 *   current replica, without failover: a stream on a replica that dies fails its calls in flight
 *   Unavailable, the next call's open to the dead replica is refused and that call goes by the
 *   unary RPC, whose failover moves the transport to the next replica, where the next stream opens.
 * - The transport's interceptors (signerErrors and SignerTransportOptions.interceptors) run around
 *   the opening of each stream, not around each call on it; the unary fallback runs them per call.
 *
 * An open stream keeps Node's event loop alive until it is retired (at most maxAgeMs after it
 * opened); call close() when done.
 */
export function createSignerCalls(transport: Transport, opts: SignerCallsOptions = {}): SignerCalls {
  const fromTransport = (transport as { timeoutMs?: unknown }).timeoutMs;
  const timeoutMs = opts.timeoutMs ?? (typeof fromTransport === "number" ? fromTransport : DEFAULT_TIMEOUT_MS);
  for (const [name, v] of [
    ["timeoutMs", timeoutMs],
    ["maxAgeMs", opts.maxAgeMs ?? STREAM_MAX_AGE_MS],
    ["retryAfterMs", opts.retryAfterMs ?? STREAM_RETRY_AFTER_MS],
  ] as const) {
    if (!Number.isFinite(v) || v <= 0) {
      throw new RangeError(`signer: ${name} ${v} is not a positive number`);
    }
  }
  return new Calls(transport, {
    timeoutMs,
    maxAgeMs: opts.maxAgeMs ?? STREAM_MAX_AGE_MS,
    retryAfterMs: opts.retryAfterMs ?? STREAM_RETRY_AFTER_MS,
    now: opts.now ?? Date.now,
  });
}

/** Kind is the StreamRequest.call case of a call, which its answer's result case must match. */
type Kind = "mint" | "openCallout" | "signCallout";

/** notSent rejects a stream call whose request never left: it may be sent again. */
const notSent = Symbol("signer stream request not sent");

interface Settings {
  timeoutMs: number;
  maxAgeMs: number;
  retryAfterMs: number;
  now: () => number;
}

class Calls implements SignerCalls {
  opened = 0;
  fellBack = 0;
  drained = 0;
  ended = 0;
  broken = 0;
  private readonly unary;
  private cur: Stream | undefined;
  /** Every stream not yet ended: the current one and those retiring. */
  readonly live = new Set<Stream>();
  private opening: Promise<Stream | undefined> | undefined;
  private unaryUntil = 0;
  private closed = false;

  constructor(
    readonly transport: Transport,
    readonly cfg: Settings,
  ) {
    this.unary = createClient(SignerService, transport);
  }

  get inFlight(): number {
    let n = 0;
    for (const cs of this.live) {
      n += cs.sentCount();
    }
    return n;
  }

  mint(request: MessageInitShape<typeof MintRequestSchema>, options?: SignerCallOptions): Promise<MintResponse> {
    return this.call("mint", request, options, (o) => this.unary.mint(request, o)) as Promise<MintResponse>;
  }

  openCalloutRequest(
    request: MessageInitShape<typeof OpenCalloutRequestRequestSchema>,
    options?: SignerCallOptions,
  ): Promise<OpenCalloutRequestResponse> {
    return this.call("openCallout", request, options, (o) => this.unary.openCalloutRequest(request, o)) as Promise<OpenCalloutRequestResponse>;
  }

  signCalloutResponse(
    request: MessageInitShape<typeof SignCalloutResponseRequestSchema>,
    options?: SignerCallOptions,
  ): Promise<SignCalloutResponseResponse> {
    return this.call("signCallout", request, options, (o) => this.unary.signCalloutResponse(request, o)) as Promise<SignCalloutResponseResponse>;
  }

  close(): void {
    this.closed = true;
    this.cur = undefined;
    for (const cs of [...this.live]) {
      cs.abort("signer calls closed");
    }
  }

  /** detach forgets cs if it is the current stream. */
  detach(cs: Stream): void {
    if (this.cur === cs) {
      this.cur = undefined;
    }
  }

  /** call sends a request on the stream, or by the unary RPC when no stream is usable. Every
   * failure is a SignerError. */
  private async call(
    kind: Kind,
    request: object,
    options: SignerCallOptions | undefined,
    unary: (o: CallOptions) => Promise<unknown>,
  ): Promise<unknown> {
    const deadline = new Deadline(options?.timeoutMs ?? this.cfg.timeoutMs, options?.signal);
    try {
      if (this.closed) {
        throw closedError();
      }
      // Two tries on a stream: a request that never left its first stream (gone or draining)
      // goes on a new one; then the unary RPC.
      for (let i = 0; i < 2; i++) {
        const got = this.acquire();
        const cs = got instanceof Promise ? await deadline.race(got) : got;
        if (cs === undefined) {
          break;
        }
        try {
          return await cs.send(kind, request, deadline);
        } catch (err) {
          if (err !== notSent) {
            throw err;
          }
        }
      }
      if (this.closed) {
        throw closedError();
      }
      this.fellBack++;
      const remaining = deadline.remainingMs();
      if (remaining <= 0) {
        throw deadline.error();
      }
      // Infinity (no timeout) is 0 for Connect.
      return await unary({ timeoutMs: Number.isFinite(remaining) ? remaining : 0, ...(options?.signal !== undefined ? { signal: options.signal } : {}) });
    } catch (err) {
      throw toSignerError(err);
    } finally {
      deadline.dispose();
    }
  }

  /** acquire returns the open stream (at once, so calls made in one tick queue in that order),
   * a promise of the one being opened, or undefined to use the unary RPCs. */
  private acquire(): Stream | Promise<Stream | undefined> | undefined {
    const now = this.cfg.now();
    const cs = this.cur;
    if (cs !== undefined) {
      if (cs.usable() && now - cs.openedAt < this.cfg.maxAgeMs) {
        return cs;
      }
      this.cur = undefined;
      cs.retire();
    }
    if (this.closed || now < this.unaryUntil) {
      return undefined;
    }
    this.opening ??= this.open().finally(() => {
      this.opening = undefined;
    });
    return this.opening;
  }

  /** open opens a stream and waits, within timeoutMs, for signerd to accept it; undefined when it
   * did not. */
  private async open(): Promise<Stream | undefined> {
    const cs = new Stream(this);
    try {
      await cs.start();
    } catch (err) {
      cs.abort("signer stream not accepted");
      if (err instanceof ConnectError && err.code === Code.Unimplemented) {
        this.unaryUntil = this.cfg.now() + this.cfg.retryAfterMs;
      }
      return undefined;
    }
    if (this.closed) {
      cs.abort("signer calls closed");
      return undefined;
    }
    this.opened++;
    this.cur = cs;
    this.live.add(cs);
    return cs;
  }
}

/** Waiter is one call on a stream. */
interface Waiter {
  resolve(v: unknown): void;
  reject(err: unknown): void;
  kind: Kind;
  /** Set once the request has been handed to the HTTP/2 stream: it may have reached signerd. */
  sent: boolean;
}

/** Stream is one open stream and the calls waiting on it. */
class Stream {
  readonly openedAt: number;
  private readonly ac = new AbortController();
  private readonly queue = new RequestQueue((id) => {
    const w = this.pending.get(id);
    if (w !== undefined) {
      w.sent = true;
    }
  });
  private readonly pending = new Map<bigint, Waiter>();
  private nextId = 0n;
  private retiring = false;
  private ended = false;
  private ageTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly owner: Calls) {
    this.openedAt = owner.cfg.now();
  }

  /** start opens the stream and resolves once signerd has accepted it; the answers are then read
   * in the background. */
  async start(): Promise<void> {
    const timer = setTimeout(
      () => this.ac.abort(new ConnectError("signerd did not accept the stream in time", Code.DeadlineExceeded)),
      this.owner.cfg.timeoutMs,
    );
    try {
      // Timeout 0: the stream itself has no deadline; each call has its own.
      const res = await this.owner.transport.stream(SignerService.method.stream, this.ac.signal, 0, undefined, this.queue, undefined);
      if (res.header.get(STREAM_HEADER) === null) {
        throw new ConnectError("signerd did not accept the stream", Code.Unavailable);
      }
      void this.read(res.message);
    } finally {
      clearTimeout(timer);
    }
    // The age limit also retires an idle stream, so it does not hold the connection for ever.
    this.ageTimer = setTimeout(() => this.retire(), this.owner.cfg.maxAgeMs);
    this.ageTimer.unref?.();
  }

  usable(): boolean {
    return !this.ended && !this.retiring;
  }

  sentCount(): number {
    let n = 0;
    for (const w of this.pending.values()) {
      if (w.sent) {
        n++;
      }
    }
    return n;
  }

  /** send queues the request with a fresh id and resolves with its answer. It rejects with
   * notSent, at once, when the stream takes no new call. */
  send(kind: Kind, request: object, deadline: Deadline): Promise<unknown> {
    if (!this.usable()) {
      return Promise.reject(notSent);
    }
    const id = ++this.nextId;
    // A new message with its id: the caller's request may be in flight on another stream.
    const req = create(StreamRequestSchema, { id, call: { case: kind, value: request } as StreamRequest["call"] });
    return new Promise((resolve, reject) => {
      const w: Waiter = { resolve, reject, kind, sent: false };
      this.pending.set(id, w);
      this.queue.push(id, req);
      deadline.onEnd((err) => {
        if (this.pending.get(id) === w) {
          this.pending.delete(id);
          this.queue.remove(id);
          reject(err);
        }
      });
    });
  }

  /** read delivers answers until the stream ends, then fails every call still waiting. */
  private async read(messages: AsyncIterable<StreamResponse>): Promise<void> {
    let why = "stream ended";
    let broken = false;
    try {
      for await (const r of messages) {
        if (r.result.case === "drain") {
          this.owner.drained++;
          this.retire();
          continue;
        }
        const w = this.pending.get(r.id);
        if (w === undefined) {
          continue; // its call stopped waiting
        }
        this.pending.delete(r.id);
        try {
          w.resolve(answerOf(w.kind, r));
        } catch (err) {
          w.reject(err);
        }
      }
    } catch (err) {
      why = toSignerError(err).rawMessage;
      broken = true;
    }
    this.end(why, broken);
  }

  /** end marks the stream gone; a call whose request was sent fails Unavailable (never resent),
   * one whose request never left may be sent again. */
  private end(why: string, broken: boolean): void {
    if (this.ended) {
      return;
    }
    this.ended = true;
    this.owner.live.delete(this);
    this.owner.ended++;
    if (broken) {
      this.owner.broken++;
    }
    clearTimeout(this.ageTimer);
    this.owner.detach(this);
    this.queue.close();
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const w of pending) {
      w.reject(w.sent ? new SignerError(`signer stream broken with the call in flight (not resent): ${why}`, Code.Unavailable, noReason) : notSent);
    }
    this.ac.abort(new ConnectError(why, Code.Canceled));
  }

  /** retire takes no new call and half-closes the stream once the requests already queued have
   * been written; signerd answers them and ends the stream, which ends read. */
  retire(): void {
    if (this.retiring || this.ended) {
      return;
    }
    this.retiring = true;
    clearTimeout(this.ageTimer);
    this.owner.detach(this);
    this.queue.close();
  }

  /** abort ends the stream at once; its calls fail as on a broken stream. */
  abort(why: string): void {
    this.end(why, false);
  }
}

const noReason = { reason: Reason.UNSPECIFIED, reasonCode: "", cause: undefined };

function closedError(): SignerError {
  return new SignerError("signer calls closed", Code.Unavailable, noReason);
}

/** answerOf returns the response r carries for a call of kind, or throws its refusal. */
function answerOf(kind: Kind, r: StreamResponse): unknown {
  if (r.result.case === "status") {
    throw statusError(r.result.value);
  }
  if (r.result.case !== kind) {
    throw new SignerError("signerd answered a stream request with another call's result", Code.Internal, noReason);
  }
  return r.result.value;
}

/**
 * RequestQueue is the request side of a stream: an async iterable that connect-node reads one
 * message at a time as the HTTP/2 stream takes it (so flow control holds requests here), that
 * calls push into, and whose end half-closes the stream. onTaken is told each id as it is read.
 */
class RequestQueue implements AsyncIterable<StreamRequest> {
  private items: { id: bigint; req: StreamRequest }[] = [];
  private closed = false;
  private waiting: ((r: IteratorResult<StreamRequest>) => void) | undefined;

  constructor(private readonly onTaken: (id: bigint) => void) {}

  push(id: bigint, req: StreamRequest): void {
    if (this.waiting !== undefined) {
      const w = this.waiting;
      this.waiting = undefined;
      this.onTaken(id);
      w({ value: req, done: false });
      return;
    }
    this.items.push({ id, req });
  }

  remove(id: bigint): void {
    this.items = this.items.filter((it) => it.id !== id);
  }

  /** close ends the iterable once the queued requests are read. */
  close(): void {
    this.closed = true;
    if (this.waiting !== undefined && this.items.length === 0) {
      const w = this.waiting;
      this.waiting = undefined;
      w({ value: undefined, done: true });
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamRequest> {
    const done = (): Promise<IteratorResult<StreamRequest>> => {
      this.items = [];
      this.close();
      return Promise.resolve({ value: undefined, done: true });
    };
    return {
      next: () => {
        const it = this.items.shift();
        if (it !== undefined) {
          this.onTaken(it.id);
          return Promise.resolve({ value: it.req, done: false });
        }
        if (this.closed) {
          return Promise.resolve({ value: undefined, done: true });
        }
        return new Promise((resolve) => {
          this.waiting = resolve;
        });
      },
      // Connect calls these when the stream is aborted; nothing more is read.
      return: done,
      throw: done,
    };
  }
}
