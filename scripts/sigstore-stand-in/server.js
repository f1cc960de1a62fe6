// The Sigstore stand-in for the tests: @sigstore/mock's Fulcio and Rekor (v1) handlers, served on
// 127.0.0.1:PORT, and the trusted_root.json and signing_config.json that name them, written to DIR.
// What it cannot show: its log holds one leaf per entry (every inclusion proof is of a tree of one),
// and Fulcio does not check the OIDC token's signature (it takes the claims as they come).
// Usage: node server.js PORT DIR
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const path = require("path");
const mock = require("@sigstore/mock");

const [port, dir] = [Number(process.argv[2]), process.argv[3]];
const base = `http://127.0.0.1:${port}`;
const since = { start: "2020-01-01T00:00:00Z" };
const GITHUB_ISSUER = "https://token.actions.githubusercontent.com";
const p256 = () => crypto.generateKeyPairSync("ec", { namedCurve: "prime256v1" });
const b64 = (bytes) => Buffer.from(bytes).toString("base64");
const der = (key) => key.export({ format: "der", type: "spki" });

// The certificate's subject as Fulcio derives it for GitHub Actions: the URI of the workflow that
// ran the job (job_workflow_ref), the Build Signer URI; for another issuer, the token's sub. Put
// into the claims as "fulcio_subject", which the mock is told to read (it never checks signatures).
function withSubject(token) {
  const [header, payload] = token.split(".");
  const claims = JSON.parse(Buffer.from(payload, "base64url").toString());
  claims.fulcio_subject = claims.iss === GITHUB_ISSUER && claims.job_workflow_ref
    ? `https://github.com/${claims.job_workflow_ref}` : claims.sub;
  return [header, Buffer.from(JSON.stringify(claims)).toString("base64url"), ""].join(".");
}

// Fulcio's v2 API as clients send it (sigstore-python: the token as a bearer header, the CSR as
// base64 of its PEM) into the shape the mock reads (the token in the body, the CSR as PEM).
function asFulcioTakesIt(body, authorization) {
  try {
    const request = JSON.parse(body);
    const token = (authorization || "").replace(/^Bearer /, "") || (request.credentials || {}).oidcIdentityToken;
    request.credentials = { oidcIdentityToken: withSubject(token) };
    const csr = request.certificateSigningRequest;
    if (csr && !csr.startsWith("-----")) request.certificateSigningRequest = Buffer.from(csr, "base64").toString();
    return JSON.stringify(request);
  } catch (e) {
    return body;
  }
}

// A proposed dsse entry as Rekor stores it: the hashes of the envelope and payload, and each
// signature with its verifier (the mock logs the proposal as it came; verifiers check the stored form).
function asRekorStoresIt(body) {
  try {
    const entry = JSON.parse(body);
    if (entry.kind !== "dsse" || !entry.spec.proposedContent) return body;
    const { envelope, verifiers } = entry.spec.proposedContent;
    const parsed = JSON.parse(envelope);
    const sha256 = (bytes) => ({ algorithm: "sha256", value: crypto.createHash("sha256").update(bytes).digest("hex") });
    return JSON.stringify({
      apiVersion: "0.0.1", kind: "dsse",
      spec: {
        envelopeHash: sha256(envelope), payloadHash: sha256(Buffer.from(parsed.payload, "base64")),
        signatures: parsed.signatures.map((s) => ({ signature: s.sig, verifier: verifiers[0] })),
      },
    });
  } catch (e) {
    return body;
  }
}

async function main() {
  const ctKeys = p256(), caKeys = p256(), logKeys = p256();
  const ctlog = await mock.initializeCTLog(ctKeys);
  const ca = await mock.initializeCA(caKeys, ctlog);
  const tlog = await mock.initializeTLog(base, logKeys);
  const handlers = [mock.fulcioHandler(ca, { strict: true, subjectClaim: "fulcio_subject" }), mock.rekorHandler(tlog, { strict: true })];
  const log = (keys) => ({
    baseUrl: base, hashAlgorithm: "SHA2_256",
    publicKey: { rawBytes: b64(der(keys.publicKey)), keyDetails: "PKIX_ECDSA_P256_SHA_256", validFor: since },
    logId: { keyId: b64(crypto.createHash("sha256").update(der(keys.publicKey)).digest()) },
  });
  const root = {
    mediaType: "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
    tlogs: [log(logKeys)],
    certificateAuthorities: [{
      subject: { organization: "bakery", commonName: "sigstore stand-in" }, uri: base,
      certChain: { certificates: [{ rawBytes: b64(ca.rootCertificate) }] }, validFor: since,
    }],
    ctlogs: [log(ctKeys)],
    timestampAuthorities: [],
  };
  const service = { url: base, majorApiVersion: 1, validFor: since, operator: "bakery stand-in" };
  const signing = {
    mediaType: "application/vnd.dev.sigstore.signingconfig.v0.2+json",
    caUrls: [service], oidcUrls: [], rekorTlogUrls: [service], tsaUrls: [],
    rekorTlogConfig: { selector: "ANY" }, tsaConfig: { selector: "ANY" },
  };
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "trusted_root.json"), JSON.stringify(root, null, 1));
  fs.writeFileSync(path.join(dir, "signing_config.json"), JSON.stringify(signing, null, 1));
  fs.writeFileSync(path.join(dir, "trust_config.json"), JSON.stringify({
    mediaType: "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json", trustedRoot: root, signingConfig: signing,
  }, null, 1));
  http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", async () => {
      const handler = handlers.find((h) => h.path === req.url.split("?")[0]);
      if (req.method !== "POST" || !handler) {
        res.writeHead(404).end("not found");
        return;
      }
      let body = Buffer.concat(chunks).toString();
      if (handler.path === "/api/v2/signingCert") body = asFulcioTakesIt(body, req.headers.authorization);
      if (handler.path === "/api/v1/log/entries") body = asRekorStoresIt(body);
      const { statusCode, response, contentType } = await handler.fn(body);
      res.writeHead(statusCode, { "Content-Type": contentType || "text/plain" }).end(response);
    });
  }).listen(port, "127.0.0.1", () => console.log(`sigstore stand-in on ${base}`));
}
main();
