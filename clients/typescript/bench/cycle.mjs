// `leasehold bench --workload cycle` from TypeScript: each of --clients
// concurrent users takes a free key and releases it, again and again, for
// --seconds, over one Client. Prints one JSON object: the cycles, their
// rate, and the longest a user went between two cycles done (its pause
// through a failover, for bench/failover.py); bench/clients.py reads the
// process's CPU time beside it.
//
//   node clients/typescript/bench/cycle.mjs --endpoint http://127.0.0.1:7419 --clients 50 --seconds 5

import { parseArgs } from "node:util";

import { Client } from "../dist/index.js";

const { values } = parseArgs({
  options: {
    endpoint: { type: "string", default: "http://127.0.0.1:7419" },
    clients: { type: "string", default: "50" },
    seconds: { type: "string", default: "5" },
    keys: { type: "string", default: "100000" },
  },
});
const client = new Client(values.endpoint, { holder: "bench-ts" });
const until = Date.now() + Number(values.seconds) * 1000;
const keys = Number(values.keys);
let cycles = 0;
let failures = 0;
let longestGapMs = 0;
const started = performance.now();
await Promise.all(
  Array.from({ length: Number(values.clients) }, async () => {
    let last = performance.now();
    while (Date.now() < until) {
      try {
        const lease = await client.acquire(`bench/ts/${Math.floor(Math.random() * keys)}`, { ttlMs: 30000 });
        await lease.release();
        cycles++;
        longestGapMs = Math.max(longestGapMs, performance.now() - last);
        last = performance.now();
      } catch {
        failures++;
      }
    }
  }),
);
const elapsed = (performance.now() - started) / 1000;
client.close();
console.log(
  JSON.stringify({ client: "typescript", clients: Number(values.clients), cycles, failures, per_second: cycles / elapsed, longest_gap_ms: longestGapMs }),
);
