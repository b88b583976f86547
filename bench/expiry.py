#!/usr/bin/env python3
"""One command that releases many locks: does the group keep its leader?

Starts a 3-node release cluster on free ports (temporary data dirs), holds
LOCKS locks on one lease (`leasehold bench --workload hold`), then ends that
lease in one command: left to expire (`--end expire`, the default) or
revoked (`--end revoke`). Every node applies that command at once. While it
does, a probe acquires and releases a key of its own through the cluster,
one call after the other, and every node's /health is polled. Reports the
time the command took to free every key, the longest stretch the probe went
without a successful call, and how far the term rose (each rise is an
election). Stops exactly the processes it started.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/expiry.py [--locks 1000000] [--end expire|revoke]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import failover as fo  # noqa: E402  (the cluster helpers)
from snapshot import health, metric  # noqa: E402


class Probe(threading.Thread):
    """Acquires and releases its own key through any node, back to back;
    keeps the longest time between two successful calls."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.stop = threading.Event()
        self.longest = 0.0
        self.calls = 0

    def run(self):
        last_ok = time.monotonic()
        i = 0
        while not self.stop.is_set():
            addr = self.cluster.addrs[i % len(self.cluster.addrs)]
            try:
                status, body = fo.call(addr, "POST", "/v1/acquire",
                                       {"key": "probe", "ttl_ms": 5000}, timeout=2)
                if status == 200:
                    fo.call(addr, "POST", "/v1/release",
                            {"key": "probe", "fence": body["fence"]}, timeout=2)
                    now = time.monotonic()
                    self.longest = max(self.longest, now - last_ok)
                    last_ok = now
                    self.calls += 1
                    continue
                if (body or {}).get("error", {}).get("code") == "not_leader":
                    i += 1
                    continue
            except OSError:
                pass
            i += 1
            time.sleep(0.01)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--locks", type=int, default=1_000_000)
    ap.add_argument("--end", choices=["expire", "revoke"], default="expire")
    ap.add_argument("--ttl", default="3s", help="the lease's TTL while the locks are taken")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="leasehold-expiry-")
    cluster = fo.Cluster(3, workdir)
    try:
        cluster.wait_leader(20)
        endpoint = "http://" + ",".join(cluster.addrs)
        t = time.monotonic()
        r = subprocess.run([fo.CLI, "--endpoint", endpoint, "bench", "--workload", "hold", "--clients", "50",
                            "--keys", str(args.locks), "--ttl", args.ttl, "--json"],
                           capture_output=True, text=True)
        held = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"held {held['ops']:,} locks on lease {held['lease']} in {time.monotonic() - t:.1f} s",
              flush=True)
        leader = cluster.wait_leader()
        laddr = cluster.addrs[leader]
        term = max(health(a).get("term", 0) for a in cluster.addrs)
        probe = Probe(cluster)
        probe.start()
        time.sleep(0.5)
        t = time.monotonic()
        if args.end == "revoke":
            status, _ = fo.call(laddr, "DELETE", f"/v1/leases/{held['lease']}", timeout=60)
            print(f"revoke answered {status} after {time.monotonic() - t:.2f} s", flush=True)
        # Freed everywhere: every node's table is empty of them. (Looked at
        # once a second: /metrics counts the held locks, a walk over all of them.)
        while any(metric(a, "leasehold_locks_held") > 1 for a in cluster.addrs):
            if time.monotonic() - t > 120:
                raise SystemExit("the locks were not freed within 120 s")
            time.sleep(1)
        time.sleep(2)
        probe.stop.set()
        probe.join()
        elections = max(health(a).get("term", 0) for a in cluster.addrs) - term
        for i in range(3):
            with open(os.path.join(workdir, f"node-{i + 1}.log"), errors="replace") as log:
                plain = (re.sub(r"\x1b\[[0-9;]*m", "", line) for line in log)
                took = [m.group(1) for m in (re.search(r"took=(\S+)", p) for p in plain
                                             if "applied a large entry" in p) if m]
            print(f"node {i + 1} applied it off its runtime thread in {', '.join(took) or '(not seen)'}")
        print(f"{args.end}: every node freed them; the probe's longest gap {probe.longest * 1000:.0f} ms over {probe.calls} calls; "
              f"the term rose by {elections}", flush=True)
        print(json.dumps({"locks": held["ops"], "end": args.end,
                          "probe_longest_gap_ms": probe.longest * 1000, "new_terms": elections}))
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
