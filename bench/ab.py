#!/usr/bin/env python3
"""Two builds of leaseholdd side by side: `cycle` on one node and on a
3-node cluster, in interleaved rounds, so a change can show it is no slower.

BEFORE and AFTER are directories holding a release `leaseholdd` each (for
example a copy of target/release taken before the change, and
target/release). Every run uses AFTER's `leasehold bench` as the load, so
only the server differs. Prints each run, then per cell the median of each
build and AFTER/BEFORE. Stops exactly the processes it started; data dirs
are temporary.

    python3 bench/ab.py BEFORE AFTER [--rounds 3] [--seconds 5] [--clients 50,200] [--nodes 1,3]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

import failover


def cycle(bin_dir, nodes, clients, seconds, workdir):
    failover.BIN = os.path.join(bin_dir, "leaseholdd")
    cluster = failover.Cluster(nodes, workdir)
    try:
        leader = cluster.wait_leader()
        endpoint = ",".join(f"http://{a}" for a in cluster.addrs) if nodes > 1 else \
            f"http://{cluster.addrs[leader]}"
        out = subprocess.run(
            [failover.CLI, "--endpoint", endpoint, "bench", "--workload", "cycle",
             "--clients", str(clients), "--duration", f"{seconds}s", "--json"],
            check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        return r["ops_per_sec"], r["latency_ms"]["p99"]
    finally:
        cluster.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--clients", default="50,200")
    ap.add_argument("--nodes", default="1,3", type=lambda s: [int(n) for n in s.split(",")])
    args = ap.parse_args()
    builds = {"before": args.before, "after": args.after}
    cells = [(n, int(c)) for n in args.nodes for c in args.clients.split(",")]
    runs = {(b, n, c): [] for b in builds for n, c in cells}
    for r in range(args.rounds):
        for n, c in cells:
            for b, d in builds.items():
                workdir = tempfile.mkdtemp(prefix="lh-ab-")
                try:
                    ops, p99 = cycle(d, n, c, args.seconds, workdir)
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
                runs[(b, n, c)].append((ops, p99))
                print(f"round {r + 1}: {b:6} {n} node(s) cycle x{c}: {ops:,.0f}/s p99 {p99:.1f} ms",
                      flush=True)
    print()
    print("| nodes | clients | before cycles/s (p99) | after cycles/s (p99) | after/before |")
    print("|---|---|---|---|---|")
    for n, c in cells:
        med = {}
        for b in builds:
            ops = statistics.median(o for o, _ in runs[(b, n, c)])
            p99 = statistics.median(p for _, p in runs[(b, n, c)])
            med[b] = (ops, p99)
        (bo, bp), (ao, ap_) = med["before"], med["after"]
        print(f"| {n} | {c} | {bo:,.0f} ({bp:.1f} ms) | {ao:,.0f} ({ap_:.1f} ms) | {ao / bo:.2f}x |")


if __name__ == "__main__":
    main()
