// Typed errors for signerd calls. signerd refuses with a gRPC status carrying a
// google.rpc.ErrorInfo detail: reason = a Reason value name without "REASON_", domain
// "signer.cotal.dev", metadata.code = the kebab-case code signerd audits ("profile-not-allowed").
// This module turns any failed call into a SignerError that names that reason as the generated
// Reason enum, so callers switch on a type instead of parsing strings.

import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";

import { Reason } from "./gen/cotal/signer/v1/signer_pb.js";

/** ERROR_DOMAIN is the google.rpc.ErrorInfo domain of signerd's refusals. A detail from any other
 * domain is not read as a signerd reason. */
export const ERROR_DOMAIN = "signer.cotal.dev";

/** ReasonName is a Reason value name as signerd sends it ("PROFILE_NOT_ALLOWED"), or
 * "UNSPECIFIED" when the failure carried no signerd reason. */
export type ReasonName = keyof typeof Reason;

/** errorInfoType is the type name of google.rpc.ErrorInfo in grpc-status-details-bin. */
export const errorInfoType = "google.rpc.ErrorInfo";

/** maxDetail bounds the message a SignerError keeps, so a hostile or broken server cannot flood
 * logs. */
const maxDetail = 512;

/** jwtShape matches a compact JWS (three base64url segments, the first a JSON object), the shape
 * of every NATS and bearer JWT. */
const jwtShape = /eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*/g;

/** signerErrorBrand marks SignerError instances. */
const signerErrorBrand = Symbol.for("@cotalgo/signer/SignerError");

/** SignerErrorInit is what a SignerError is made from besides its message and code; toSignerError
 * fills it from a failed call. */
export interface SignerErrorInit {
  /** signerd's reason; Reason.UNSPECIFIED when there is none. */
  reason: Reason;
  /** ErrorInfo.metadata.code ("profile-not-allowed"); empty when there is none. */
  reasonCode: string;
  /** The error this one was made from, if any. */
  cause: unknown;
}

/**
 * SignerError is a failed call to signerd: the gRPC code, signerd's stable reason
 * (Reason.UNSPECIFIED when the failure carried none, for example a refused handshake or an
 * unreachable signerd) and a short message. It is a ConnectError, so `ConnectError.from`,
 * `instanceof ConnectError` and `.code` work as for any Connect call.
 *
 * Its message never contains a JWT: anything shaped like one is replaced by "[REDACTED]", and it
 * is cut to 512 characters.
 */
export class SignerError extends ConnectError {
  // name stays "ConnectError": Connect recognises its errors by name (ConnectError's
  // Symbol.hasInstance), and a SignerError must pass through Connect's call stack and
  // ConnectError.from unchanged.

  /** The reason as the generated enum, e.g. Reason.PROFILE_NOT_ALLOWED. */
  readonly reasonValue: Reason;
  /** The reason name, e.g. "PROFILE_NOT_ALLOWED"; "UNSPECIFIED" when there is none. */
  readonly reason: ReasonName;
  /** signerd's audited code from ErrorInfo.metadata.code, e.g. "profile-not-allowed"; empty when
   * there is none. */
  readonly reasonCode: string;

  constructor(message: string, code: Code, init: SignerErrorInit, metadata?: HeadersInit) {
    super(scrub(message), code, metadata, undefined, init.cause);
    this.reasonValue = init.reason;
    this.reason = Reason[init.reason] as ReasonName;
    this.reasonCode = init.reasonCode;
    Object.defineProperty(this, signerErrorBrand, { value: true });
  }

  /** instanceof SignerError holds for SignerErrors only (ConnectError's own check, which this
   * class would inherit, accepts every ConnectError), including ones from another copy of this
   * package. */
  static override [Symbol.hasInstance](v: unknown): boolean {
    return typeof v === "object" && v !== null && (v as Record<symbol, unknown>)[signerErrorBrand] === true;
  }
}

/**
 * toSignerError converts anything a signerd call threw into a SignerError: a ConnectError keeps
 * its code and metadata and, when it carries an ErrorInfo of signerd's domain naming a known
 * Reason, that reason; an abort becomes Canceled; anything else becomes Unknown. The original
 * error stays reachable as `cause`. A SignerError is returned as it is.
 */
export function toSignerError(err: unknown): SignerError {
  if (err instanceof SignerError) {
    return err;
  }
  const ce = ConnectError.from(err);
  let reason = Reason.UNSPECIFIED;
  let reasonCode = "";
  for (const d of ce.details) {
    if (!("type" in d) || d.type !== errorInfoType) {
      continue;
    }
    const info = decodeErrorInfo(d.value);
    if (info === undefined || info.domain !== ERROR_DOMAIN) {
      continue;
    }
    const v = reasonByName(info.reason);
    if (v !== Reason.UNSPECIFIED) {
      reason = v;
      reasonCode = scrub(info.code ?? "");
      break;
    }
  }
  // A refused or failed TLS handshake is a connection failure: UNAVAILABLE, as gRPC defines it
  // and as the Go client reports it. connect-node leaves it INTERNAL, like a server fault.
  const code = ce.code === Code.Internal && isTLSFailure(ce.cause) ? Code.Unavailable : ce.code;
  const out = new SignerError(ce.rawMessage, code, { reason, reasonCode, cause: err }, ce.metadata);
  out.details = ce.details;
  return out;
}

/** tlsCode matches the Node error codes of a TLS failure: an alert from the peer (ERR_SSL_...,
 * e.g. signerd's "certificate required"), a certificate the client refused (ERR_TLS_...,
 * CERT_HAS_EXPIRED, SELF_SIGNED_CERT_IN_CHAIN, UNABLE_TO_VERIFY_LEAF_SIGNATURE, ...). */
const tlsCode = /^ERR_(SSL|TLS)_|CERT|ISSUER|SELF_SIGNED|VERIFY/;

/** isTLSFailure reports whether a cause chain holds a Node TLS error. A status signerd sent has no
 * cause, so it never matches. */
function isTLSFailure(cause: unknown): boolean {
  for (let e = cause, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && tlsCode.test(code)) {
      return true;
    }
  }
  return false;
}

/** reasonOf returns signerd's reason for a failed call, from a SignerError or a raw ConnectError;
 * Reason.UNSPECIFIED for anything else. */
export function reasonOf(err: unknown): Reason {
  if (err instanceof SignerError) {
    return err.reasonValue;
  }
  if (err instanceof ConnectError) {
    return toSignerError(err).reasonValue;
  }
  return Reason.UNSPECIFIED;
}

/**
 * signerErrors is a Connect interceptor that rethrows every failure of a call as a SignerError.
 * createSignerTransport installs it, so every client built on that transport throws SignerErrors.
 */
export const signerErrors: Interceptor = (next) => async (req) => {
  try {
    return await next(req);
  } catch (err) {
    throw toSignerError(err);
  }
};

/** reasonByName maps an ErrorInfo reason ("PROFILE_NOT_ALLOWED") to the generated enum. Unknown
 * names, prefixed names and UNSPECIFIED give Reason.UNSPECIFIED rather than a guess. */
function reasonByName(name: string): Reason {
  if (name === "" || name.startsWith("REASON_") || !Object.hasOwn(Reason, name)) {
    return Reason.UNSPECIFIED;
  }
  const v: unknown = (Reason as Record<string, unknown>)[name];
  return typeof v === "number" ? (v as Reason) : Reason.UNSPECIFIED;
}

/** ErrorInfo holds the fields of google.rpc.ErrorInfo this package reads. */
export interface ErrorInfo {
  reason: string;
  domain: string;
  code?: string;
}

/**
 * decodeErrorInfo reads google.rpc.ErrorInfo (reason = 1, domain = 2, map<string,string>
 * metadata = 3) from the wire. It is written out here because the message lives in googleapis,
 * not in signer.proto, so the generator has no schema for it. Malformed bytes give undefined,
 * never an exception.
 */
export function decodeErrorInfo(bytes: Uint8Array): ErrorInfo | undefined {
  try {
    const r = new BinaryReader(bytes);
    const info: ErrorInfo = { reason: "", domain: "" };
    while (r.pos < r.len) {
      const [field, wireType] = r.tag();
      if (field === 1 && wireType === WireType.LengthDelimited) {
        info.reason = r.string();
      } else if (field === 2 && wireType === WireType.LengthDelimited) {
        info.domain = r.string();
      } else if (field === 3 && wireType === WireType.LengthDelimited) {
        const [key, value] = decodeStringEntry(r.bytes());
        if (key === "code") {
          info.code = value;
        }
      } else {
        r.skip(wireType, field);
      }
    }
    return info;
  } catch {
    return undefined;
  }
}

/** RpcStatus holds the fields of google.rpc.Status: the code, the message and each detail as its
 * type name (the type URL after its last "/") and bytes, as ConnectError.details holds them. */
export interface RpcStatus {
  code: number;
  message: string;
  details: { type: string; value: Uint8Array }[];
}

/**
 * decodeStatus reads google.rpc.Status (code = 1, message = 2, repeated google.protobuf.Any
 * details = 3, each type_url = 1 and value = 2) from the wire: the refusal signerd's Stream
 * carries in StreamResponse.status. Like decodeErrorInfo it is written out because the message
 * is not in signer.proto. Malformed bytes give undefined, never an exception.
 */
export function decodeStatus(bytes: Uint8Array): RpcStatus | undefined {
  try {
    const r = new BinaryReader(bytes);
    const st: RpcStatus = { code: 0, message: "", details: [] };
    while (r.pos < r.len) {
      const [field, wireType] = r.tag();
      if (field === 1 && wireType === WireType.Varint) {
        st.code = r.int32();
      } else if (field === 2 && wireType === WireType.LengthDelimited) {
        st.message = r.string();
      } else if (field === 3 && wireType === WireType.LengthDelimited) {
        const any = new BinaryReader(r.bytes());
        let typeUrl = "";
        let value: Uint8Array = new Uint8Array(0);
        while (any.pos < any.len) {
          const [f, wt] = any.tag();
          if (f === 1 && wt === WireType.LengthDelimited) {
            typeUrl = any.string();
          } else if (f === 2 && wt === WireType.LengthDelimited) {
            value = any.bytes();
          } else {
            any.skip(wt, f);
          }
        }
        st.details.push({ type: typeUrl.slice(typeUrl.lastIndexOf("/") + 1), value });
      } else {
        r.skip(wireType, field);
      }
    }
    return st;
  } catch {
    return undefined;
  }
}

/**
 * statusError turns the bytes of a google.rpc.Status a Stream answer carries into the SignerError
 * the unary RPC gives for the same refusal: its code, message and details (so its reason and
 * reasonCode). Bytes that do not decode, or that say OK or a code gRPC does not define, give
 * Code.Internal.
 */
export function statusError(bytes: Uint8Array): SignerError {
  const st = decodeStatus(bytes);
  if (st === undefined || st.code <= 0 || st.code > 16) {
    return toSignerError(new ConnectError("signerd sent an unreadable stream refusal", Code.Internal));
  }
  const ce = new ConnectError(st.message, st.code as Code);
  ce.details = st.details;
  return toSignerError(ce);
}

/** decodeStringEntry reads one map<string,string> entry (key = 1, value = 2). */
function decodeStringEntry(bytes: Uint8Array): [string, string] {
  const r = new BinaryReader(bytes);
  let key = "";
  let value = "";
  while (r.pos < r.len) {
    const [field, wireType] = r.tag();
    if (field === 1 && wireType === WireType.LengthDelimited) {
      key = r.string();
    } else if (field === 2 && wireType === WireType.LengthDelimited) {
      value = r.string();
    } else {
      r.skip(wireType, field);
    }
  }
  return [key, value];
}

/** scrub removes anything shaped like a JWT from a message and bounds its length. signerd never
 * echoes a JWT; this keeps a proxy or a future bug from putting one into a log. */
export function scrub(s: string): string {
  const out = s.replace(jwtShape, "[REDACTED]");
  return out.length > maxDetail ? out.slice(0, maxDetail) + "..." : out;
}
