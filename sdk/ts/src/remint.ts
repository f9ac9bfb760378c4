// Remint: renewing a credential signerd issued, proven by the holder's user nkey. The proof is an
// Ed25519 signature over "cotal-remint/v1" NUL space NUL jti NUL decimal unix seconds; signerd
// accepts it within 60 seconds of its own clock.

import { Code, type CallOptions } from "@connectrpc/connect";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { KeyPair } from "nkeys.js";

import { Reason, type Credential } from "./gen/cotal/signer/v1/signer_pb.js";
import { SignerError } from "./errors.js";
import type { SignerClient } from "./transport.js";

/** REMINT_CONTEXT is the domain separator of the Remint proof; it must match signerd's. */
export const REMINT_CONTEXT = "cotal-remint/v1";

/** maxJWTBytes is the largest token signerd accepts (64 KiB). */
const maxJWTBytes = 64 << 10;

/** RemintHolder is what signs a proof: an nkeys.js user KeyPair (from `createUser()` or
 * `fromSeed()`), or anything with the same sign method, e.g. a key kept in an HSM. */
export type RemintHolder = Pick<KeyPair, "sign">;

/** RemintProof is the proof part of a RemintRequest. */
export interface RemintProof {
  /** Unix seconds at which the proof was made. */
  proofUnixSeconds: bigint;
  /** The holder's Ed25519 signature over remintProofMessage. */
  proof: Uint8Array;
}

/** RemintOptions are remint's arguments. space, jwt and holder are required. */
export interface RemintOptions {
  /** The space the credential belongs to. */
  space: string;
  /** The current, unexpired user JWT. */
  jwt: string;
  /** The user nkey the JWT was issued to. */
  holder: RemintHolder;
  /** Requested lifetime in milliseconds; unset or <= 0 asks for the profile's default. signerd
   * grants min(requested, profile maximum, policy cap). */
  ttlMs?: number;
  /** The clock the proof is dated with; the system clock when unset. */
  now?: () => Date;
  /** Per-call options (timeout, abort signal, headers). */
  callOptions?: CallOptions;
}

/** remintProofMessage returns the bytes a Remint proof signs:
 * "cotal-remint/v1" NUL space NUL jti NUL decimal(unixSeconds). */
export function remintProofMessage(space: string, jti: string, unixSeconds: bigint): Uint8Array {
  return new TextEncoder().encode(`${REMINT_CONTEXT}\0${space}\0${jti}\0${unixSeconds.toString()}`);
}

/** remintProof signs the proof for jwt in space with holder, dated now. It throws SignerError
 * (Code.InvalidArgument) when jwt is not a user JWT, without quoting the token. */
export function remintProof(space: string, jwt: string, holder: RemintHolder, now: Date = new Date()): RemintProof {
  const { jti } = userClaims(jwt);
  const proofUnixSeconds = BigInt(Math.floor(now.getTime() / 1000));
  return { proofUnixSeconds, proof: holder.sign(remintProofMessage(space, jti, proofUnixSeconds)) };
}

/**
 * remint renews jwt, a credential signerd issued for holder's public key: it signs the proof and
 * calls Remint. It refuses locally (SignerError, Code.InvalidArgument) a token that is not a user
 * JWT, and refuses (SignerResponseError) an answer whose credential is missing or names another
 * subject or jti than its JWT. signerd's refusals arrive as SignerError with their reason
 * (BAD_PROOF, STALE_PROOF, CREDENTIAL_EXPIRED, REMINT_FOREIGN_MINTER, ...).
 */
export async function remint(client: SignerClient, opts: RemintOptions): Promise<Credential> {
  const { sub } = userClaims(opts.jwt);
  const { proofUnixSeconds, proof } = remintProof(opts.space, opts.jwt, opts.holder, opts.now?.() ?? new Date());
  const ttlMs = opts.ttlMs ?? 0;
  const resp = await client.remint(
    {
      space: opts.space,
      jwt: opts.jwt,
      proofUnixSeconds,
      proof,
      ...(ttlMs > 0 ? { ttl: durationFromMs(ttlMs) } : {}),
    },
    opts.callOptions,
  );
  const cred = resp.credential;
  checkCredential(cred, sub);
  return cred;
}

/** SignerResponseError says which field of a signerd answer disagrees with the request. want and
 * got are public keys or ids, never a JWT. It is never expected from a correct signerd; the
 * credential in that answer must not be used. */
export class SignerResponseError extends Error {
  override name = "SignerResponseError";

  constructor(
    readonly field: string,
    readonly want: string,
    readonly got: string,
  ) {
    super(`signer: signerd response ${field} is ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
  }
}

/** checkCredential ties a returned credential to the subject asked for: the response field and
 * the JWT's own subject must both be it, and the jti must be the JWT's. */
function checkCredential(cred: Credential | undefined, subject: string): asserts cred is Credential {
  if (cred === undefined || cred.jwt === "") {
    throw new SignerResponseError("credential", "present", "missing");
  }
  if (cred.userPublicKey !== subject) {
    throw new SignerResponseError("user_public_key", subject, cred.userPublicKey);
  }
  let claims: UserClaims;
  try {
    claims = userClaims(cred.jwt);
  } catch {
    throw new SignerResponseError("jwt", "a user JWT", "undecodable");
  }
  if (claims.sub !== subject) {
    throw new SignerResponseError("jwt subject", subject, claims.sub);
  }
  if (claims.jti !== cred.jti) {
    throw new SignerResponseError("jti", claims.jti, cred.jti);
  }
}

/** UserClaims are the claims remint reads from a user JWT. */
interface UserClaims {
  jti: string;
  sub: string;
}

/** userClaims reads jti and sub from a NATS user JWT's payload. It does not verify the signature:
 * signerd does, and refuses a credential it did not issue. */
function userClaims(token: string): UserClaims {
  const invalid = () =>
    new SignerError("token is not a valid user JWT", Code.InvalidArgument, {
      reason: Reason.UNSPECIFIED,
      reasonCode: "",
      cause: undefined,
    });
  if (typeof token !== "string" || token.length === 0 || token.length > maxJWTBytes) {
    throw invalid();
  }
  const parts = token.split(".");
  if (parts.length !== 3 || parts[1] === undefined) {
    throw invalid();
  }
  let payload: unknown;
  try {
    payload = JSON.parse(Buffer.from(parts[1], "base64url").toString("utf8"));
  } catch {
    throw invalid();
  }
  const p = payload as { jti?: unknown; sub?: unknown; nats?: { type?: unknown } } | null;
  if (
    p === null ||
    typeof p !== "object" ||
    typeof p.jti !== "string" ||
    p.jti === "" ||
    typeof p.sub !== "string" ||
    !p.sub.startsWith("U") ||
    p.nats?.type !== "user"
  ) {
    throw invalid();
  }
  return { jti: p.jti, sub: p.sub };
}
