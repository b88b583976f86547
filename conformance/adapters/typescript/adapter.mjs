// The TypeScript client's conformance adapter: commands as JSON lines on
// stdin, answers as JSON lines on stdout (conformance/README.md), each
// command run at once, so a waiting acquire never holds up the next
// command. Uses the client built in clients/typescript/dist. Connects to
// LEASEHOLD_ENDPOINT as LEASEHOLD_HOLDER; LEASEHOLD_PLANTED_BUG plants a
// bug in the client.

import { createInterface } from "node:readline";

import { Client, LeaseholdError } from "../../../clients/typescript/dist/index.js";

const client = new Client();
const leases = new Map();
const leaderships = new Map();
const waits = new Map();
const streams = new Map();

class Failure extends Error {
  constructor(code, message, details = {}) {
    super(message);
    this.code = code;
    this.details = details;
  }
}

const coded = (e) =>
  e instanceof LeaseholdError || e instanceof Failure
    ? { code: e.code, message: e.message, details: e.details ?? {} }
    : { code: "other", message: String(e?.message ?? e), details: {} };

const get = (map, h, what) => {
  if (!map.has(h)) throw new Failure("adapter", `no ${what} ${JSON.stringify(h)}`);
  return map.get(h);
};

/** A queue an async iterator feeds, read one item at a time. */
function feed(iterator) {
  const items = [];
  let wake;
  (async () => {
    try {
      for await (const item of iterator) {
        items.push({ item });
        wake?.();
      }
    } catch (e) {
      items.push({ error: coded(e) });
      wake?.();
    }
  })();
  return async (withinMs) => {
    const until = Date.now() + withinMs;
    while (items.length === 0) {
      const left = until - Date.now();
      if (left <= 0) throw new Failure("no_change", `nothing within ${withinMs} ms`);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, left);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      wake = undefined;
    }
    const next = items.shift();
    if (next.error) throw new Failure(next.error.code, next.error.message, next.error.details);
    return next.item;
  };
}

async function acquire(args, handle) {
  const abort = new AbortController();
  waits.set(handle, abort);
  const options = {
    ttlMs: args.ttl_ms,
    waitMs: args.wait_ms ?? 0,
    lockDelayMs: args.lock_delay_ms,
    mode: args.mode,
    permits: args.permits,
    signal: abort.signal,
  };
  let lease;
  try {
    lease = args.keys ? await client.acquireSet(args.keys, options) : await client.acquire(args.key, options);
  } catch (e) {
    if (abort.signal.aborted) throw new Failure("cancelled", "the wait was given up");
    throw e;
  } finally {
    waits.delete(handle);
  }
  leases.set(handle, lease);
  const answer = { fence: lease.fence, lease: lease.id };
  if (lease.checkpoint !== undefined) {
    answer.checkpoint = lease.checkpoint.toString("utf8");
    answer.checkpoint_base64 = lease.checkpoint.toString("base64");
  }
  return answer;
}

async function command(op, args, handle) {
  switch (op) {
    case "acquire":
      return acquire(args, handle);
    case "cancel":
      waits.get(args.handle)?.abort(new Failure("cancelled", "the wait was given up"));
      return {};
    case "token": {
      const lease = get(leases, args.handle, "lease");
      const at_ms = Date.now();
      try {
        return { live: true, fence: lease.token(), at_ms };
      } catch (e) {
        return { live: false, reason: e.message, at_ms };
      }
    }
    case "wait_lost": {
      const lease = get(leases, args.handle, "lease");
      if (lease.signal.aborted) return { lost: true, reason: lease.signal.reason?.message };
      const lost = await new Promise((resolve) => {
        const timer = setTimeout(() => resolve(false), args.within_ms ?? 10000);
        lease.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          resolve(true);
        }, { once: true });
      });
      return lost ? { lost, reason: lease.signal.reason?.message } : { lost };
    }
    case "release":
      await get(leases, args.handle, "lease").release();
      return {};
    case "save_checkpoint":
      await get(leases, args.handle, "lease").saveCheckpoint(args.data);
      return {};
    case "release_by_fence":
      await client.releaseByFence(args.key, args.fence);
      return {};
    case "campaign": {
      const lead = await client.election(args.election).campaign(args.value, { ttlMs: args.ttl_ms });
      leaderships.set(handle, lead);
      return { fence: lead.token() };
    }
    case "proclaim":
      await get(leaderships, args.handle, "leadership").proclaim(args.value);
      return {};
    case "resign":
      await get(leaderships, args.handle, "leadership").resign();
      return {};
    case "observe": {
      const changes = client.election(args.election).observe();
      const shown = (async function* () {
        for await (const l of changes) yield l === null ? null : { value: l.value.toString("utf8"), fence: l.fence, holder: l.holder };
      })();
      streams.set(handle, feed(shown));
      return {};
    }
    case "next_leader":
      return { leader: await get(streams, args.handle, "stream")(args.within_ms ?? 10000) };
    case "watch": {
      const events = client.watch(args.prefix);
      const shown = (async function* () {
        for await (const e of events) yield { kind: e.kind, key: e.key, fence: e.fence, index: e.index, seq: e.seq };
      })();
      streams.set(handle, feed(shown));
      return {};
    }
    case "next_events": {
      const next = get(streams, args.handle, "stream");
      const events = [];
      for (let i = 0; i < (args.count ?? 1); i++) events.push(await next(args.within_ms ?? 10000));
      return { events };
    }
    case "churn":
      for (let i = 0; i < (args.count ?? 1); i++) await (await client.acquire(`${args.prefix}${i}`, { ttlMs: args.ttl_ms ?? 5000 })).release();
      return {};
    default:
      throw new Failure("adapter", `no op ${JSON.stringify(op)}`);
  }
}

process.on("unhandledRejection", (e) => {
  // A loss must never surface here: the suite fails the client that lets it.
  process.stderr.write(`unhandled rejection: ${e?.stack ?? e}\n`);
  process.exit(70);
});

const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch {
    process.stderr.write(`not JSON: ${line}\n`);
    return;
  }
  command(cmd.op, cmd.args ?? {}, cmd.as ?? "").then(
    (ok) => process.stdout.write(JSON.stringify({ id: cmd.id, ok }) + "\n"),
    (e) => process.stdout.write(JSON.stringify({ id: cmd.id, error: coded(e) }) + "\n"),
  );
});
lines.on("close", () => process.exit(0));
