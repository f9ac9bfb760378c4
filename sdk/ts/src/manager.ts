// A typed client for managerd's ManagerService: gRPC over HTTP/2 on managerd's Unix socket.
//
// The messages, enums and the ManagerService descriptor come from ./gen (protoc-gen-es, from
// proto/cotal/manager/v1/manager.proto, the file the Go client is generated from). This module
// adds what generation cannot: the Unix-socket transport and refusals as typed errors. It is
// published as the "@cotalgo/signer/manager" subpath (and as the `manager` namespace of the
// package root), because its Reason enum is not signerd's.
//
// There is no TLS: the socket's modes (0660 in a 0750 directory) and managerd's SO_PEERCRED uid
// gate are the trust boundary, and no credential crosses the socket.

import { connect, type Socket } from "node:net";

import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";

import { ManagerService, Reason } from "./gen/cotal/manager/v1/manager_pb.js";
import { decodeErrorInfo, errorInfoType, scrub } from "./errors.js";

export * from "./gen/cotal/manager/v1/manager_pb.js";

/** MANAGER_ERROR_DOMAIN is the google.rpc.ErrorInfo domain of managerd's refusals. */
export const MANAGER_ERROR_DOMAIN = "manager.cotal";

/** DEFAULT_MANAGER_TIMEOUT_MS bounds every unary call that sets no timeout of its own. Attach
 * streams have no default timeout; one passed with the call applies. */
export const DEFAULT_MANAGER_TIMEOUT_MS = 30_000;

/** ManagerReasonName is a Reason value name as managerd sends it ("AGENT_UNKNOWN"), or
 * "UNSPECIFIED" when the failure carried no managerd reason. */
export type ManagerReasonName = keyof typeof Reason;

/** ManagerTransportOptions configure createManagerTransport. */
export interface ManagerTransportOptions {
  /** Path of managerd's API socket. Required. */
  socketPath: string;
  /** Timeout of each unary call that sets none; DEFAULT_MANAGER_TIMEOUT_MS when unset. Attach
   * streams get none by default. */
  timeoutMs?: number;
  /** Further interceptors, run inside the one that turns failures into ManagerErrors. */
  interceptors?: Interceptor[];
}

/** ManagerTransport is a Connect transport to managerd that can be closed. */
export interface ManagerTransport extends Transport {
  /** close ends the HTTP/2 connection; calls made after it fail. */
  close(): void;
}

/**
 * createManagerTransport returns a gRPC (HTTP/2, cleartext) transport over managerd's Unix
 * socket. Every call through it fails with a ManagerError. The connection is made by the first
 * call: a missing socket or a stopped managerd fails calls with Code.Unavailable, a socket this
 * uid may not open with Code.Unavailable too (EACCES), and a uid managerd does not admit with
 * Code.PermissionDenied, reason PEER_NOT_ALLOWED.
 */
export function createManagerTransport(opts: ManagerTransportOptions): ManagerTransport {
  if (typeof opts.socketPath !== "string" || opts.socketPath === "") {
    throw new Error("manager: option socketPath is required");
  }
  const timeoutMs = opts.timeoutMs ?? DEFAULT_MANAGER_TIMEOUT_MS;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new Error(`manager: timeoutMs ${timeoutMs} is not a positive number`);
  }
  const socketPath = opts.socketPath;
  // The authority is only the :authority header; the bytes go to the socket.
  const baseUrl = "http://localhost";
  const sessionManager = new Http2SessionManager(baseUrl, undefined, {
    createConnection: (): Socket => connect(socketPath),
  });
  const inner = createGrpcTransport({
    baseUrl,
    sessionManager,
    defaultTimeoutMs: timeoutMs,
    interceptors: [managerErrors, ...(opts.interceptors ?? [])],
  });
  return {
    unary: (method, signal, callTimeoutMs, header, input, contextValues) =>
      inner.unary(method, signal, callTimeoutMs, header, input, contextValues),
    // An Attach session lasts as long as the user stays: no default timeout (0 means none to
    // Connect); a timeoutMs passed with the call still applies.
    stream: (method, signal, callTimeoutMs, header, input, contextValues) =>
      inner.stream(method, signal, callTimeoutMs ?? 0, header, input, contextValues),
    close: () => sessionManager.abort(),
  };
}

/** ManagerClient is the generated ManagerService client. */
export type ManagerClient = Client<typeof ManagerService>;

/** createManagerClient returns the generated ManagerService client over transport (see
 * createManagerTransport). */
export function createManagerClient(transport: Transport): ManagerClient {
  return createClient(ManagerService, transport);
}

/** managerErrorBrand marks ManagerError instances. */
const managerErrorBrand = Symbol.for("@cotalgo/signer/ManagerError");

/**
 * ManagerError is a failed call to managerd: the gRPC code, managerd's stable reason
 * (Reason.UNSPECIFIED when the failure carried none, for example an unreachable managerd or an
 * Attach stream dropped for falling behind, which is Code.DataLoss) and a short message. It is a
 * ConnectError. Its message is scrubbed of anything shaped like a JWT and bounded.
 */
export class ManagerError extends ConnectError {
  /** The reason as the generated enum, e.g. Reason.AGENT_UNKNOWN. */
  readonly reasonValue: Reason;
  /** The reason name, e.g. "AGENT_UNKNOWN"; "UNSPECIFIED" when there is none. */
  readonly reason: ManagerReasonName;

  constructor(message: string, code: Code, reason: Reason, metadata?: HeadersInit, cause?: unknown) {
    super(scrub(message), code, metadata, undefined, cause);
    this.reasonValue = reason;
    this.reason = Reason[reason] as ManagerReasonName;
    Object.defineProperty(this, managerErrorBrand, { value: true });
  }

  /** instanceof ManagerError holds for ManagerErrors only. */
  static override [Symbol.hasInstance](v: unknown): boolean {
    return typeof v === "object" && v !== null && (v as Record<symbol, unknown>)[managerErrorBrand] === true;
  }
}

/** toManagerError converts anything a managerd call threw into a ManagerError, reading the
 * reason from an ErrorInfo detail of MANAGER_ERROR_DOMAIN naming a known Reason. */
export function toManagerError(err: unknown): ManagerError {
  if (err instanceof ManagerError) {
    return err;
  }
  const ce = ConnectError.from(err);
  let reason = Reason.UNSPECIFIED;
  for (const d of ce.details) {
    if (!("type" in d) || d.type !== errorInfoType) {
      continue;
    }
    const info = decodeErrorInfo(d.value);
    if (info === undefined || info.domain !== MANAGER_ERROR_DOMAIN) {
      continue;
    }
    const v = managerReasonByName(info.reason);
    if (v !== Reason.UNSPECIFIED) {
      reason = v;
      break;
    }
  }
  const out = new ManagerError(ce.rawMessage, ce.code, reason, ce.metadata, err);
  out.details = ce.details;
  return out;
}

/** managerReasonOf returns managerd's reason for a failed call; Reason.UNSPECIFIED for anything
 * that carries none. */
export function managerReasonOf(err: unknown): Reason {
  if (err instanceof ManagerError) {
    return err.reasonValue;
  }
  if (err instanceof ConnectError) {
    return toManagerError(err).reasonValue;
  }
  return Reason.UNSPECIFIED;
}

/** managerErrors is a Connect interceptor that rethrows every failure as a ManagerError;
 * createManagerTransport installs it. Streams fail with ManagerError when they are opened and
 * when they are read. */
export const managerErrors: Interceptor = (next) => async (req) => {
  try {
    const res = await next(req);
    if (!res.stream) {
      return res;
    }
    const inner = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* inner;
        } catch (err) {
          throw toManagerError(err);
        }
      })(),
    };
  } catch (err) {
    throw toManagerError(err);
  }
};

/** managerReasonByName maps an ErrorInfo reason ("AGENT_UNKNOWN") to the generated enum; unknown
 * or prefixed names give Reason.UNSPECIFIED. */
function managerReasonByName(name: string): Reason {
  if (name === "" || name.startsWith("REASON_") || !Object.hasOwn(Reason, name)) {
    return Reason.UNSPECIFIED;
  }
  const v: unknown = (Reason as Record<string, unknown>)[name];
  return typeof v === "number" ? (v as Reason) : Reason.UNSPECIFIED;
}
