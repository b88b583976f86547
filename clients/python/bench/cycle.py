"""`cycle` from Python: take a free key, release it, again and again.

    python3 clients/python/bench/cycle.py --endpoint http://127.0.0.1:7419 --seconds 5
    python3 clients/python/bench/cycle.py --clients 50 --json

Alone (x1, the blocking client) it prints cycles/s and the latency of one
cycle (p50, p90, p99), comparable with `leasehold bench --workload cycle
--clients 1`; with --clients N, N asyncio tasks share one AsyncClient
(bench/clients.py reads the process's CPU time beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import leasehold


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", default="http://127.0.0.1:7419")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--ttl", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--clients", type=int, default=1)
    a = p.parse_args()
    if a.clients > 1:
        asyncio.run(concurrent(a))
        return
    client = leasehold.Client(a.endpoint, holder="bench-py")
    # Warm the connection.
    client.try_lock("bench/py/warm", ttl=a.ttl).release()
    latencies = []
    until = time.monotonic() + a.seconds
    started = time.monotonic()
    while time.monotonic() < until:
        key = f"bench/py/{random.randrange(a.keys)}"
        t = time.perf_counter()
        client.try_lock(key, ttl=a.ttl).release()
        latencies.append(time.perf_counter() - t)
    elapsed = time.monotonic() - started
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e6
    out = {
        "client": "python",
        "cycles": len(latencies),
        "per_second": len(latencies) / elapsed,
        "p50_us": pct(0.50),
        "p90_us": pct(0.90),
        "p99_us": pct(0.99),
    }
    if a.json:
        print(json.dumps(out))
    else:
        print(
            f"python cycle x1: {out['per_second']:.0f}/s, p50 {out['p50_us']:.0f} µs, "
            f"p90 {out['p90_us']:.0f} µs, p99 {out['p99_us']:.0f} µs"
        )


async def concurrent(a: argparse.Namespace) -> None:
    client = leasehold.AsyncClient(a.endpoint, holder="bench-py")
    cycles = failures = 0
    until = time.monotonic() + a.seconds

    async def user() -> None:
        nonlocal cycles, failures
        while time.monotonic() < until:
            try:
                lease = await client.try_lock(f"bench/py/{random.randrange(a.keys)}", ttl=a.ttl)
                await lease.release()
                cycles += 1
            except leasehold.LeaseholdError:
                failures += 1

    started = time.monotonic()
    await asyncio.gather(*(user() for _ in range(a.clients)))
    elapsed = time.monotonic() - started
    await client.aclose()
    out = {"client": "python", "clients": a.clients, "cycles": cycles, "failures": failures, "per_second": cycles / elapsed}
    print(json.dumps(out) if a.json else f"python cycle x{a.clients}: {out['per_second']:.0f}/s")


if __name__ == "__main__":
    main()
