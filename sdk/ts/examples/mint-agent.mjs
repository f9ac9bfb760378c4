// Mint an agent credential from signerd, then renew it with a Remint proof.
//   SIGNERD_ADDR=127.0.0.1:PORT node sdk/ts/examples/mint-agent.mjs
// SIGNERD_PKI defaults to .cotal-dev/pki and SIGNERD_SPACE to demo, as `make run` lays them out.
import { randomInt } from "node:crypto";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { createUser } from "nkeys.js";
import { Profile, SignerError, createSignerClient, createSignerTransport, remint } from "@cotalgo/signer";

const space = process.env.SIGNERD_SPACE ?? "demo";
const pki = process.env.SIGNERD_PKI ?? ".cotal-dev/pki";
const transport = createSignerTransport({
  address: process.env.SIGNERD_ADDR ?? "127.0.0.1:7443",
  caFile: `${pki}/ca.pem`,
  certFile: `${pki}/clients/managerd-${space}.pem`, // identity spiffe://cotal.local/managerd/<space>
  keyFile: `${pki}/clients/managerd-${space}.key`,
  serverId: "spiffe://cotal.local/signerd",
});
const signer = createSignerClient(transport);
const agent = createUser(); // the agent's user nkey: its seed never leaves this process
const lifecycleUid = Array.from({ length: 26 }, () => "abcdefghijklmnopqrstuvwxyz0123456789"[randomInt(36)]).join("");

try {
  const { credential } = await signer.mint({
    space,
    profile: Profile.AGENT,
    userPublicKey: agent.getPublicKey(),
    params: {
      owner: "demo",
      actor: "ts_example",
      lifecycleUid,
      subscribe: ["general"],
      allowSubscribe: ["general"],
      allowPublish: ["general"],
    },
    ttl: { seconds: 3600n }, // advisory: signerd grants min(ttl, profile maximum, policy cap)
  });
  console.log(`minted ${credential.jti} for ${credential.userPublicKey} in account ${credential.issuerAccount}`);
  console.log(`expires ${timestampDate(credential.expiresAt).toISOString()} (capped: ${credential.ttlCapped})`);

  const renewed = await remint(signer, { space, jwt: credential.jwt, holder: agent });
  console.log(`reminted ${renewed.jti}, expires ${timestampDate(renewed.expiresAt).toISOString()}`);
} catch (err) {
  if (!(err instanceof SignerError)) throw err;
  // A refusal names its reason (PROFILE_NOT_ALLOWED, BAD_PROOF, ...); a failed handshake has none.
  console.error(`signerd refused: ${Code[err.code]} ${err.reason}: ${err.rawMessage}`);
  process.exitCode = 1;
} finally {
  transport.close();
}
