// Real leaseholdd processes for the tests: $LEASEHOLDD, or the workspace's
// target/debug/leaseholdd (cargo build --bin leaseholdd).

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, closeSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

export function serverBinary() {
  if (process.env.LEASEHOLDD) return process.env.LEASEHOLDD;
  const b = resolve(here, "../../../target/debug/leaseholdd");
  if (!existsSync(b)) throw new Error(`${b} not found: cargo build --bin leaseholdd, or set LEASEHOLDD`);
  return b;
}

export function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const port = s.address().port;
      s.close(() => ok(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function tempDir(t) {
  const dir = mkdtempSync(join(tmpdir(), "leasehold-ts-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** One leaseholdd process. */
export class Node {
  constructor(addr, dir, args) {
    this.addr = addr;
    this.dir = dir;
    this.args = args;
    this.child = undefined;
  }
  get url() {
    return "http://" + this.addr;
  }
  start() {
    const log = openSync(join(this.dir, "node.log"), "a");
    this.child = spawn(serverBinary(), this.args, { stdio: ["ignore", log, log] });
    closeSync(log);
    this.exited = new Promise((r) => this.child.once("exit", r));
  }
  /** kill -9, and its exit waited for. */
  async kill() {
    if (!this.child) return;
    const child = this.child;
    this.child = undefined;
    child.kill("SIGKILL");
    await this.exited;
  }
  signal(name) {
    this.child?.kill(name);
  }
  async health() {
    try {
      const r = await fetch(this.url + "/health", { signal: AbortSignal.timeout(1000) });
      return await r.json();
    } catch {
      return undefined;
    }
  }
  async leads() {
    return (await this.health())?.leader === true;
  }
}

export async function waitFor(what, limitMs, ok) {
  const until = Date.now() + limitMs;
  while (!(await ok())) {
    if (Date.now() > until) throw new Error(`timed out after ${limitMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

/** A single node, led, stopped after the test. */
export async function startNode(t, ...extra) {
  const dir = tempDir(t);
  const addr = `127.0.0.1:${await freePort()}`;
  const n = new Node(addr, dir, ["--listen", addr, "--data-dir", join(dir, "data"), ...extra]);
  n.start();
  t.after(() => n.kill());
  await waitFor("leaseholdd to lead", 20000, () => n.leads());
  return n;
}

/** Three nodes forming one group. */
export async function startCluster(t) {
  const nodes = [];
  const peers = [];
  for (let i = 1; i <= 3; i++) {
    const addr = `127.0.0.1:${await freePort()}`;
    nodes.push(new Node(addr, tempDir(t), []));
    peers.push(`${i}=${addr}`);
  }
  nodes.forEach((n, i) => {
    n.args = ["--node-id", String(i + 1), "--listen", n.addr, "--peers", peers.join(","), "--data-dir", join(n.dir, "data")];
    n.start();
    t.after(() => n.kill());
  });
  const c = {
    nodes,
    async leader() {
      for (let i = 0; i < nodes.length; i++) if (nodes[i].child && (await nodes[i].leads())) return i;
      return -1;
    },
    async waitLeader() {
      let l = -1;
      await waitFor("a leader", 20000, async () => (l = await c.leader()) >= 0);
      return l;
    },
    /** Every node, node `first` first. */
    endpoints(first) {
      return "http://" + nodes.map((_, i) => nodes[(first + i) % nodes.length].addr).join(",");
    },
  };
  await c.waitLeader();
  return c;
}

/** A call to the API without the client. */
export async function raw(method, url, body) {
  const r = await fetch(url, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : undefined };
}

/** Resolves when `signal` aborts, with its reason. */
export function aborted(signal) {
  return new Promise((r) => (signal.aborted ? r(signal.reason) : signal.addEventListener("abort", () => r(signal.reason), { once: true })));
}

/** Rejects with `what` unless `promise` settles within `ms`. */
export function within(ms, what, promise) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, fail) => (timer = setTimeout(() => fail(new Error(`${what}: nothing within ${ms} ms`)), ms))),
  ]);
}
