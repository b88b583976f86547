"""`cycle` x1 from Python: take a free key, release it, one at a time.

    python3 clients/python/bench/cycle.py --endpoint http://127.0.0.1:7419 --seconds 5

Prints cycles/s and the latency of one cycle (p50, p90, p99), comparable with
`leasehold bench --workload cycle --clients 1`.
"""

from __future__ import annotations

import argparse
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
    a = p.parse_args()
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


if __name__ == "__main__":
    main()
