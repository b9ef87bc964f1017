// The backend of backend.py again, in Node.js (no dependencies): a service in another language
// with no idempotency at all, behind `retrysafe proxy`. Same routes, knobs and effects file (one
// JSON line per effect, written before the answer). Run: node backend.js --port P --effects FILE
"use strict";

const crypto = require("node:crypto");
const fs = require("node:fs");
const http = require("node:http");

const args = process.argv.slice(2);
const option = (name) => args[args.indexOf(name) + 1];
const port = Number(option("--port"));
const effectsPath = option("--effects");

function record(effect) {
  let count = 0;
  try {
    count = fs.readFileSync(effectsPath, "utf8").split("\n").filter((l) => l.trim()).length;
  } catch (err) {
    if (err.code !== "ENOENT") throw err;
  }
  effect.id = count + 1;
  effect.pid = process.pid;
  const fd = fs.openSync(effectsPath, "a");
  fs.writeSync(fd, JSON.stringify(effect) + "\n");
  fs.fsyncSync(fd);
  fs.closeSync(fd);
  return effect.id;
}

function send(res, status, body, headers = {}) {
  const data = Buffer.from(body);
  res.writeHead(status, {
    "Content-Type": "application/json",
    "Content-Length": data.length,
    ...headers,
  });
  res.end(data);
}

function header(req, name) {
  const value = req.headers[name];
  return value === undefined ? null : value;
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    const url = new URL(req.url, "http://backend");
    const path = url.pathname;
    const query = url.searchParams;
    if (path === "/health") return send(res, 200, '{"ok":true}');
    if (path === "/echo") {
      const headers = [];
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        headers.push([req.rawHeaders[i].toLowerCase(), req.rawHeaders[i + 1]]);
      }
      const seen = { method: req.method, path: req.url, headers, body_bytes: body.length };
      return send(res, 200, JSON.stringify(seen), {
        Connection: "keep-alive, X-Hop-Secret",
        "X-Hop-Secret": "must not pass",
        "Keep-Alive": "timeout=5",
        "Proxy-Authenticate": "Basic",
        "X-End-To-End": "kept",
      });
    }
    if (req.method !== "POST" && req.method !== "PATCH") {
      return send(res, 404, '{"error":"not found"}');
    }
    if (path === "/upload") {
      const id = record({ path, bytes: body.length, key: header(req, "idempotency-key") });
      const sha256 = crypto.createHash("sha256").update(body).digest("hex");
      return send(res, 201, JSON.stringify({ id, bytes: body.length, sha256 }));
    }
    if (!(path === "/orders" || path === "/payments" || path.startsWith("/orders/"))) {
      return send(res, 404, '{"error":"not found"}');
    }
    const text = body.toString("utf8");
    const id = record({
      path,
      method: req.method,
      key: header(req, "idempotency-key"),
      authorization: header(req, "authorization"),
      body: text,
    });
    if (query.get("die")) process.exit(3); // the effect happened; the answer never leaves
    const status = Number(query.get("status") || 201);
    setTimeout(() => {
      if (query.has("size")) {
        res.writeHead(status, {
          "Content-Type": "application/octet-stream",
          Location: `/orders/${id}`,
        });
        const block = Buffer.from(String(id).padStart(8, "0").repeat(8192));
        let left = Number(query.get("size"));
        while (left > 0) {
          const piece = block.subarray(0, Math.min(left, block.length));
          res.write(piece);
          left -= piece.length;
        }
        return res.end();
      }
      const answer = JSON.stringify({ id, request: text });
      send(res, status, answer, { Location: `${path}/${id}` });
    }, Number(query.get("delay_ms") || 0));
  });
});

server.listen(port, "127.0.0.1", () => console.log(`backend on ${port}`));
