// A loopback-only HTTP proxy for the MCP conformance suite (tests/conformance/run.sh).
//
// The suite sends no credential and cannot be told to, while /mcp refuses any
// request without a bearer. This proxy forwards every request unchanged to the
// server — method, path, body and every header, Host and Origin included, so the
// server's own Host/Origin checks are what the suite exercises — and adds one
// thing: `Authorization: Bearer $CONFORMANCE_TOKEN` (an opaque token minted for
// the run; any Authorization the client sent is replaced). Responses stream back
// as they arrive (SSE included); a client that hangs up closes the upstream
// request. Hop-by-hop headers are not forwarded; each request gets its own
// upstream connection.
//
//   node proxy.mjs <upstream-port> <port-file>
//
// Listens on 127.0.0.1, on a port of the kernel's choosing, written to
// <port-file> once listening. The token comes from the environment, never argv.
import http from "node:http";
import fs from "node:fs";

const [upstreamPort, portFile] = process.argv.slice(2);
const token = process.env.CONFORMANCE_TOKEN;
if (!/^\d+$/.test(upstreamPort ?? "") || !portFile || !token) {
  console.error("usage: CONFORMANCE_TOKEN=... node proxy.mjs <upstream-port> <port-file>");
  process.exit(2);
}

const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

// rawHeaders keeps the client's names, case and repeats: forward them as sent.
function forwardable(raw, drop) {
  const out = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    if (HOP_BY_HOP.has(name) || drop.has(name)) continue;
    out.push(raw[i], raw[i + 1]);
  }
  return out;
}

const server = http.createServer((req, res) => {
  const headers = forwardable(req.rawHeaders, new Set(["authorization"]));
  headers.push("Authorization", `Bearer ${token}`);
  const upstream = http.request({
    host: "127.0.0.1",
    port: Number(upstreamPort),
    method: req.method,
    path: req.url,
    headers,
    setHost: false, // the client's Host goes through (or none, if it sent none)
    agent: false,
  });
  upstream.on("response", (up) => {
    res.writeHead(up.statusCode ?? 502, up.statusMessage, forwardable(up.rawHeaders, new Set()));
    res.flushHeaders();
    up.pipe(res);
    up.on("error", () => res.destroy());
  });
  upstream.on("error", (e) => {
    if (!res.headersSent) {
      res.writeHead(502, { "content-type": "text/plain" });
      res.end(`conformance proxy: upstream error: ${e.message}\n`);
    } else {
      res.destroy();
    }
  });
  // The client went away (a cancelled SSE reader, a timeout): so does upstream.
  res.on("close", () => {
    if (!res.writableFinished) upstream.destroy();
  });
  req.pipe(upstream);
});
server.keepAliveTimeout = 5_000;
server.headersTimeout = 10_000;
server.requestTimeout = 0; // SSE streams are long-lived; the suite bounds them
server.listen(0, "127.0.0.1", () => {
  fs.writeFileSync(`${portFile}.tmp`, `${server.address().port}\n`);
  fs.renameSync(`${portFile}.tmp`, portFile);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => process.exit(0));
}
