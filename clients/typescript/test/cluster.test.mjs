import { test } from "node:test";
import assert from "node:assert/strict";

import { Client } from "../dist/index.js";
import { sleep, startCluster, within } from "./helpers.mjs";

function client(t, url, holder) {
  const c = new Client(url, { holder });
  t.after(() => c.close());
  return c;
}

const order = (a, b) => a.index - b.index || a.seq - b.seq;

// A watch given every endpoint outlives the follower it streams from: every
// event arrives once, in order, the same list as the history on a node
// never killed. An observer given the same endpoints sees every leader.
test("a watch and an observer go on across a kill of their node", async (t) => {
  const c = await startCluster(t);
  const leader = await c.waitLeader();
  const follower = (leader + 1) % 3;
  const abort = new AbortController();
  t.after(() => abort.abort());
  const events = client(t, c.endpoints(follower), "watcher").watch("w/", { signal: abort.signal });
  const leaders = client(t, c.endpoints(follower), "observer").election("boss").observe({ signal: abort.signal });
  assert.equal((await within(10000, "the first observation", leaders.next())).value, null);
  const writer = client(t, c.endpoints(leader), "writer");
  let writing = true;
  const wrote = (async () => {
    for (let i = 0; writing; i++) {
      try {
        await (await writer.acquire(`w/${i}`, { ttlMs: 5000 })).release();
      } catch {
        // A write refused during the kill is no event.
      }
      await sleep(5);
    }
  })();
  const seen = [];
  const read = async (n) => {
    for (const want = seen.length + n; seen.length < want; ) {
      const r = await within(20000, "the watch", events.next());
      seen.push(r.value);
    }
  };
  const lead = await client(t, c.endpoints(leader), "a").election("boss").campaign("a", { ttlMs: 5000 });
  await read(20);
  await c.nodes[follower].kill();
  await lead.resign();
  const leadB = await client(t, c.endpoints(leader), "b").election("boss").campaign("b", { ttlMs: 5000 });
  await read(40);
  writing = false;
  await wrote;
  const values = [];
  while (values.length < 3) {
    const r = await within(20000, `leaders after ${JSON.stringify(values)}`, leaders.next());
    values.push(r.value === null ? "" : r.value.value.toString());
  }
  assert.deepEqual(values, ["a", "", "b"]);
  await leadB.resign();
  for (let i = 1; i < seen.length; i++) assert.ok(order(seen[i - 1], seen[i]) < 0, `out of order or twice at ${i}`);
  const reference = client(t, c.nodes[(leader + 2) % 3].url, "reference");
  const all = reference.watch("w/", { after: { index: 0, seq: 0xffffffff }, signal: abort.signal });
  const last = seen[seen.length - 1];
  const whole = [];
  while (whole.length === 0 || order(whole[whole.length - 1], last) < 0) {
    whole.push((await within(10000, "the history", all.next())).value);
  }
  const start = whole.findIndex((e) => e.index === seen[0].index && e.seq === seen[0].seq);
  assert.ok(start >= 0, "the watch's first event is not in the history");
  const shape = (e) => [e.index, e.seq, e.kind, e.key, e.fence];
  assert.deepEqual(seen.map(shape), whole.slice(start).map(shape));
  abort.abort();
});

// A holder with TTL 2 s keeps its lock through a kill -9 of the leader,
// and the client finds the new leader by itself.
test("a holder keeps its lock through a leader kill", async (t) => {
  const c = await startCluster(t);
  const leader = await c.waitLeader();
  const cl = client(t, c.endpoints(0), "holder");
  const l = await cl.acquire("kept", { ttlMs: 2000 });
  await c.nodes[leader].kill();
  await sleep(3000);
  assert.equal(l.token(), l.fence, "lost through the failover");
  const other = await cl.acquire("after", { ttlMs: 2000 });
  assert.ok(other.fence > l.fence);
  await assert.rejects(cl.acquire("kept"), { code: "held" });
  await l.release();
  await other.release();
});
