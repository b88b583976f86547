import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { Client, TlsRequiredError } from "../dist/index.js";
import { freePort, Node, tempDir, waitFor } from "./helpers.mjs";

const openssl = (dir, ...args) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
const KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-noenc", "-days", "30"];

function newCA(dir, name) {
  openssl(dir, "req", "-x509", ...KEY, "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    "-subj", "/CN=" + name, "-keyout", name + "-key.pem", "-out", name + ".pem");
}

function newLeaf(dir, ca, name, ...ext) {
  openssl(dir, "req", "-x509", ...KEY, "-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=critical,digitalSignature", ...ext,
    "-CA", ca + ".pem", "-CAkey", ca + "-key.pem", "-subj", "/CN=" + name, "-keyout", name + "-key.pem", "-out", name + ".pem");
}

// A node that requires client certificates is reached with one, and each
// TLS mistake is refused at once with what to do, never retried for
// seconds as if the node were down.
test("client certificates, and every TLS mistake said at once", async (t) => {
  const dir = tempDir(t);
  newCA(dir, "ca");
  newCA(dir, "strangers");
  newLeaf(dir, "ca", "server", "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "extendedKeyUsage=serverAuth");
  newLeaf(dir, "ca", "me", "-addext", "extendedKeyUsage=clientAuth");
  newLeaf(dir, "strangers", "stranger", "-addext", "extendedKeyUsage=clientAuth");
  const f = (name) => join(dir, name);
  const pem = (name) => readFileSync(f(name));
  const addr = `127.0.0.1:${await freePort()}`;
  const n = new Node(addr, dir, ["--listen", addr, "--data-dir", f("data"), "--tls-cert", f("server.pem"), "--tls-key", f("server-key.pem"), "--tls-client-ca", f("ca.pem")]);
  n.start();
  t.after(() => n.kill());
  const https = "https://" + addr;
  const good = { ca: pem("ca.pem"), cert: pem("me.pem"), key: pem("me-key.pem") };
  await waitFor("leaseholdd over TLS", 20000, async () => {
    const c = new Client(https, good);
    try {
      await (await c.acquire("tls/ready", { ttlMs: 5000 })).release();
      return true;
    } catch {
      return false;
    } finally {
      c.close();
    }
  });
  const mistakes = [
    [https, { ca: pem("ca.pem") }, "requires a client certificate"],
    [https, { ca: pem("ca.pem"), cert: pem("stranger.pem"), key: pem("stranger-key.pem") }, "does not accept this client certificate"],
    [https, { cert: pem("me.pem"), key: pem("me-key.pem") }, "not signed by a CA this client trusts"],
    ["http://" + addr, {}, "TLS"],
  ];
  for (const [url, options, says] of mistakes) {
    const c = new Client(url, options);
    const started = Date.now();
    const e = await c.acquire("tls/mistake").then(() => undefined, (e) => e);
    c.close();
    assert.ok(e && e.message.includes(says), `${url} ${Object.keys(options)}: want ${JSON.stringify(says)}, got ${e}`);
    assert.ok(Date.now() - started < 3000, `${url} ${Object.keys(options)}: refused only after ${Date.now() - started} ms`);
    if (says === "TLS") assert.ok(e instanceof TlsRequiredError, `plain HTTP to a TLS port: ${e}`);
  }
});
