import { test } from "node:test";
import assert from "node:assert/strict";

import {
  Client,
  CODES,
  HeldError,
  LeaseholdError,
  LeaseLostError,
  StaleFenceError,
  errorOf,
  fromBody,
} from "../dist/index.js";
import { requestId } from "../dist/transport.js";
import { aborted, raw, sleep, startNode, waitFor, within } from "./helpers.mjs";

function client(t, url, holder) {
  const c = new Client(url, { holder });
  t.after(() => c.close());
  return c;
}

test("a contended key names its holder, and tokens grow", async (t) => {
  const n = await startNode(t);
  const a = client(t, n.url, "a");
  const b = client(t, n.url, "b");
  const la = await a.acquire("report", { ttlMs: 5000 });
  const refused = await b.acquire("report", { ttlMs: 5000 }).catch((e) => e);
  assert.ok(refused instanceof HeldError, `want held, got ${refused}`);
  assert.equal(refused.details.holder, "a");
  assert.equal(refused.details.fence, la.fence);
  const waiting = b.acquire("report", { ttlMs: 5000, waitMs: 10000 });
  await sleep(200);
  await la.release();
  const lb = await waiting;
  assert.ok(lb.fence > la.fence, `the waiter's token ${lb.fence} is not above ${la.fence}`);
  assert.throws(() => la.token(), LeaseLostError);
  assert.ok(la.signal.aborted, "the signal is not aborted after release");
  await lb.release();
});

test("a lease renews itself past its TTL", async (t) => {
  const n = await startNode(t);
  const c = client(t, n.url, "renewer");
  const l = await c.acquire("renewed", { ttlMs: 300 });
  await sleep(1500);
  assert.equal(l.token(), l.fence);
  const lock = await c.describe("renewed");
  assert.equal(lock.holder?.fence, l.fence);
  await l.release();
});

test("locks.request runs the callback with the lock and releases it after", async (t) => {
  const n = await startNode(t);
  const c = client(t, n.url, "web");
  const answer = await c.locks.request("job", { ttlMs: 5000 }, async (lock) => {
    assert.equal(lock.name, "job");
    assert.equal(lock.mode, "exclusive");
    assert.equal(lock.token(), lock.fence);
    const held = await c.describe("job");
    assert.equal(held.holder?.fence, lock.fence);
    // Held: ifAvailable answers null at once.
    const other = await c.locks.request("job", { ifAvailable: true }, (l) => l);
    assert.equal(other, null);
    return 42;
  });
  assert.equal(answer, 42);
  await waitFor("the release", 5000, async () => (await c.describe("job")).holder === null);
  // Readers share a key.
  await c.locks.request("catalog", { mode: "shared" }, async (r1) =>
    c.locks.request("catalog", { mode: "shared", ifAvailable: true }, async (r2) => {
      assert.ok(r2 && r2.fence !== r1.fence, "a second reader was refused");
    }),
  );
  // The callback's error is the request's; the lock is released all the same.
  await assert.rejects(c.locks.request("job", () => { throw new Error("boom") }), /boom/);
  await waitFor("the release after a throw", 5000, async () => (await c.describe("job")).holder === null);
});

test("an aborted wait leaves the queue and ends its lease", async (t) => {
  const n = await startNode(t);
  const a = client(t, n.url, "a");
  const b = client(t, n.url, "b");
  const held = await a.acquire("q", { ttlMs: 10000 });
  const abort = new AbortController();
  const waiting = b.locks.request("q", { ttlMs: 10000, waitMs: 60000, signal: abort.signal }, () => "ran");
  await waitFor("the waiter in the queue", 10000, async () => (await a.describe("q")).waiters.length === 1);
  abort.abort(new Error("given up"));
  await assert.rejects(waiting, /given up/);
  await waitFor("the wait withdrawn", 5000, async () => (await a.describe("q")).waiters.length === 0);
  await waitFor("the waiter's lease ended", 5000, async () => (await raw("GET", n.url + "/v1/leases")).body.leases.length === 1);
  await held.release();
});

// etcd-io/etcd#22082: a retried unlock deleted a newer lock of the key.
test("a release after the loss never touches the new holder", async (t) => {
  const n = await startNode(t);
  const a = client(t, n.url, "a");
  const b = client(t, n.url, "b");
  const la = await a.acquire("k", { ttlMs: 10000 });
  await raw("DELETE", `${n.url}/v1/leases/${la.id}`);
  const reason = await within(10000, "the revoked lease reported lost", aborted(la.signal));
  assert.ok(reason instanceof LeaseLostError);
  const lb = await b.acquire("k", { ttlMs: 10000 });
  await assert.rejects(la.release(), LeaseLostError);
  await la.release();
  assert.equal((await b.describe("k")).holder?.fence, lb.fence);
  await assert.rejects(a.releaseByFence("k", la.fence), StaleFenceError);
  await lb.release();
});

// etcd-io/etcd#18082: Lock hung because its clean-up used the caller's
// context. Here giving up a wait returns at once, the server frozen.
test("a given-up wait returns even with the server frozen", async (t) => {
  const n = await startNode(t);
  const a = client(t, n.url, "a");
  const b = client(t, n.url, "b");
  const held = await a.acquire("frozen", { ttlMs: 30000 });
  const abort = new AbortController();
  const waiting = b.acquire("frozen", { ttlMs: 30000, waitMs: 60000, signal: abort.signal });
  await waitFor("the waiter in the queue", 10000, async () => (await a.describe("frozen")).waiters.length === 1);
  n.signal("SIGSTOP");
  try {
    abort.abort(new Error("given up"));
    await within(15000, "acquire's clean-up", assert.rejects(waiting, /given up/));
  } finally {
    n.signal("SIGCONT");
  }
  await held.release();
});

test("a revoked lease is lost at once, inside a request's callback too, and never an unhandled rejection", async (t) => {
  const n = await startNode(t);
  const c = client(t, n.url, "h");
  const unhandled = [];
  const onUnhandled = (e) => unhandled.push(e);
  process.on("unhandledRejection", onUnhandled);
  t.after(() => process.off("unhandledRejection", onUnhandled));
  const result = await c.locks.request("revoked", { ttlMs: 600 }, async (lock) => {
    await raw("DELETE", `${n.url}/v1/leases/${lock.lease.id}`);
    const reason = await within(5000, "the loss", aborted(lock.signal));
    assert.ok(reason instanceof LeaseLostError);
    assert.throws(() => lock.token(), LeaseLostError);
    await assert.rejects(lock.saveCheckpoint("late"), LeaseLostError);
    return "stopped";
  });
  assert.equal(result, "stopped");
  await sleep(1000);
  assert.deepEqual(unhandled, []);
  // Never taken again behind the callback's back.
  assert.equal((await c.describe("revoked")).holder, null);
});

// `leasehold release KEY --fence F` elsewhere: the holder learns it at its
// next renewal, though its lease lives on; a lone key, and one of a set.
test("a hold released by its token elsewhere is lost at the next renewal", async (t) => {
  const n = await startNode(t);
  const holder = client(t, n.url, "holder");
  const operator = client(t, n.url, "operator");
  const lone = await holder.acquire("elsewhere/lone", { ttlMs: 600 });
  const set = await holder.acquireSet(["elsewhere/a", "elsewhere/b"], { ttlMs: 600 });
  await operator.releaseByFence("elsewhere/lone", lone.fence);
  await operator.releaseByFence("elsewhere/b", set.fence);
  for (const l of [lone, set]) {
    const reason = await within(5000, `${l.key} said lost`, aborted(l.signal));
    assert.ok(reason instanceof LeaseLostError);
    assert.match(reason.message, /released by its token elsewhere/);
  }
  await assert.rejects(lone.release(), LeaseLostError);
});

test("with the server frozen, the client gives up before the server could", async (t) => {
  const n = await startNode(t);
  const c = client(t, n.url, "h");
  const sent = Date.now();
  const l = await c.acquire("paused", { ttlMs: 1000 });
  n.signal("SIGSTOP");
  try {
    await within(5000, "the loss while the server was frozen", aborted(l.signal));
    assert.ok(Date.now() - sent < 1500, `lost only after ${Date.now() - sent} ms: a TTL's end had come`);
    assert.ok(l.deadline < sent + 1000, "the deadline is not before the TTL's end");
  } finally {
    n.signal("SIGCONT");
  }
});

test("semaphores, readers, lock sets and checkpoints", async (t) => {
  const n = await startNode(t);
  const c = client(t, n.url, "h");
  const permits = [await c.acquire("api", { permits: 2, ttlMs: 5000 }), await c.acquire("api", { permits: 2, ttlMs: 5000 })];
  await assert.rejects(c.acquire("api", { permits: 2 }), HeldError);
  const r1 = await c.acquire("catalog", { mode: "shared" });
  const r2 = await c.acquire("catalog", { mode: "shared" });
  assert.notEqual(r1.fence, r2.fence);
  await assert.rejects(c.acquire("catalog"), HeldError);
  const set = await c.acquireSet(["acct/42", "acct/17"], { ttlMs: 5000 });
  assert.deepEqual(set.keys, ["acct/17", "acct/42"]);
  for (const k of set.keys) assert.equal((await c.describe(k)).holder?.fence, set.fence);
  await set.saveCheckpoint("step 3");
  await set.release();
  for (const k of set.keys) assert.equal((await c.describe(k)).holder, null);
  const next = await c.acquire("acct/17");
  assert.equal(next.checkpoint?.toString(), "step 3");
  const listed = [];
  for await (const lock of c.list("", { held: true })) listed.push(lock.key);
  assert.deepEqual(listed, ["acct/17", "api", "catalog"]);
  for (const l of [...permits, r1, r2, next]) await l.release();
});

test("an election is observed through every change", async (t) => {
  const n = await startNode(t);
  const abort = new AbortController();
  t.after(() => abort.abort());
  const observer = client(t, n.url, "watcher").election("scheduler");
  const changes = observer.observe({ signal: abort.signal });
  const next = async () => {
    const r = await within(10000, "a change", changes.next());
    assert.equal(r.done, false);
    return r.value;
  };
  assert.equal(await next(), null);
  const lead = await client(t, n.url, "a").election("scheduler").campaign("a:1", { ttlMs: 5000 });
  let l = await next();
  assert.equal(l?.value.toString(), "a:1");
  assert.equal(l.fence, lead.token());
  await lead.proclaim("a:2");
  assert.equal((await next())?.value.toString(), "a:2");
  const campaigning = client(t, n.url, "b").election("scheduler").campaign("b:1", { ttlMs: 5000 });
  await sleep(200);
  const aFence = lead.token();
  await lead.resign();
  const leadB = await campaigning;
  assert.equal(await next(), null);
  l = await next();
  assert.equal(l?.value.toString(), "b:1");
  assert.ok(l.fence > aFence);
  assert.equal((await observer.leader())?.value.toString(), "b:1");
  await leadB.resign();
  abort.abort();
  assert.equal((await changes.next()).done, true);
});

test("a watch yields events, and resumes after a position with nothing lost or repeated", async (t) => {
  const n = await startNode(t);
  const c = client(t, n.url, "w");
  const abort = new AbortController();
  t.after(() => abort.abort());
  const events = c.watch("w/", { signal: abort.signal });
  const first = events.next();
  await sleep(300);
  for (let i = 0; i < 3; i++) await (await c.acquire(`w/${i}`)).release();
  const seen = [(await within(5000, "an event", first)).value];
  while (seen.length < 6) seen.push((await within(5000, "an event", events.next())).value);
  assert.deepEqual(seen.map((e) => `${e.kind} ${e.key}`), ["acquired w/0", "released w/0", "acquired w/1", "released w/1", "acquired w/2", "released w/2"]);
  const again = c.watch("w/", { after: { index: seen[1].index, seq: seen[1].seq }, signal: abort.signal });
  const rest = [];
  while (rest.length < 4) rest.push((await within(5000, "a resumed event", again.next())).value);
  assert.deepEqual(rest.map((e) => [e.index, e.seq, e.kind, e.key]), seen.slice(2).map((e) => [e.index, e.seq, e.kind, e.key]));
  abort.abort();
});

test("every code has its class, and request ids fit a number exactly", () => {
  for (const code of CODES) {
    const e = fromBody(400, { error: { code, message: "m", holder: "x" } });
    assert.ok(e instanceof LeaseholdError);
    assert.equal(e.code, code);
    assert.equal(e.details.holder, "x");
    const classes = CODES.filter((other) => e instanceof errorOf(other, "m").constructor);
    assert.deepEqual(classes, [code], `${code} is an instance of ${classes}`);
  }
  for (let i = 0; i < 10000; i++) {
    const id = requestId();
    assert.ok(Number.isSafeInteger(id) && id > 0, `request id ${id}`);
  }
});

test("a bad endpoint or a node that is not there is a clear error at once", async () => {
  assert.throws(() => new Client("http://a:1,https://b:2"), /same scheme/);
  const c = new Client("http://127.0.0.1:1");
  const started = Date.now();
  await assert.rejects(c.acquire("x"), /is leaseholdd running there\?/);
  assert.ok(Date.now() - started < 3000);
  c.close();
});
