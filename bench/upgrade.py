#!/usr/bin/env python3
"""A rolling upgrade of a 3-node leaseholdd cluster under load.

Starts three nodes of the OLD build on free ports (temporary data dirs),
runs the `cycle` workload against them (`leasehold bench`, the NEW build's
CLI, all three endpoints), keeps HOLDERS locks of TTL 2 s renewing every
TTL/3, and acquires short locks without a break, noting every fencing token
it is given. Then it upgrades one node at a time, followers first and the
leader last: SIGTERM (a leader hands leadership to a caught-up follower
first), start the NEW build on the same data dir, and wait until it has
caught up before the next. It checks that

- every holder kept its lock through all three restarts (no lock lost);
- no fencing token was handed out twice, and each client acquiring without
  a break got tokens that rise across every upgrade (no token reused);
- the cluster served throughout: for each node, the longest pause between
  two successful acquires of a client acquiring without a break.

Exits 1 if a check fails. Stops exactly the processes it started.

    python3 bench/upgrade.py --from OLD_LEASEHOLDD --to NEW_LEASEHOLDD --cli NEW_LEASEHOLD [--json]

`scripts/upgrade-test` builds the previous release and runs this.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import failover  # noqa: E402  (its cluster, holder and client)
from failover import Holder, acquire_anywhere, call  # noqa: E402


class MixedCluster(failover.Cluster):
    """A cluster whose nodes each run their own binary."""

    def __init__(self, n, workdir, binary):
        self.bins = [binary] * n
        super().__init__(n, workdir)

    def start(self, i):
        log = open(os.path.join(self.workdir, f"node-{i + 1}.log"), "ab")
        self.procs[i] = subprocess.Popen(
            [self.bins[i], "--node-id", str(i + 1), "--listen", self.addrs[i], "--peers", self.peers,
             "--data-dir", self.data_dirs[i]],
            stdout=log, stderr=log)

    def caught_up(self, i, limit=30.0):
        """Waits until node i knows the leader and has applied what it committed."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            try:
                _, h = call(self.addrs[i], "GET", "/health", timeout=0.3)
                leader = self.leader()
                _, lh = call(self.addrs[leader], "GET", "/health", timeout=0.3) if leader is not None else (0, None)
            except OSError:
                h = lh = None
            if h and lh and h.get("leader_id") and (h.get("last_applied") or 0) >= (lh.get("commit_index") or 0) - 100:
                return True
            time.sleep(0.1)
        return False


class Fenced(threading.Thread):
    """Acquires short-lived locks without a break, noting when and with which token."""

    def __init__(self, cluster, name):
        super().__init__(daemon=True)
        self.cluster, self.name, self.stop_flag = cluster, name, threading.Event()
        self.grants = []  # (time, fence)

    def run(self):
        n = 0
        while not self.stop_flag.is_set():
            n += 1
            g = acquire_anywhere(self.cluster, f"{self.name}-{n}", 1000, time.monotonic() + 1)
            if g:
                self.grants.append((time.monotonic(), g["fence"]))

    def longest_pause(self, since, until):
        marks = [since] + [t for t, _ in self.grants if since < t < until] + [until]
        return max(b - a for a, b in zip(marks, marks[1:]))


def tail(path, lines=30):
    try:
        with open(path, "rb") as f:
            return b"".join(f.readlines()[-lines:]).decode("utf-8", "replace").rstrip()
    except OSError as e:
        return f"(no log: {e})"


def version(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return out.stdout.strip() or out.stderr.strip()


def run(old, new, cli, holders=5, load_clients=50, log=print):
    workdir = tempfile.mkdtemp(prefix="leasehold-upgrade-")
    cluster = MixedCluster(3, workdir, old)
    load, kept, probers = None, [], []
    failed_step = None
    try:
        cluster.wait_leader(20)
        endpoint = "http://" + ",".join(cluster.addrs)
        load = subprocess.Popen(
            [cli, "--endpoint", endpoint, "bench", "--workload", "cycle", "--clients", str(load_clients),
             "--duration", "300s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kept = [Holder(cluster, f"held-{k}") for k in range(holders)]
        for h in kept:
            h.start()
        probers = [Fenced(cluster, f"probe-{k}") for k in range(2)]
        for p in probers:
            p.start()
        time.sleep(3.0)
        leader = cluster.wait_leader()
        order = [i for i in range(3) if i != leader] + [leader]
        steps = []
        for i in order:
            was_leader = i == cluster.leader()
            stopped = time.monotonic()
            cluster.kill(i, signal.SIGTERM)
            cluster.bins[i] = new
            cluster.start(i)
            if not cluster.caught_up(i):
                failed_step = f"node {i + 1} did not catch up within 30 s of its upgrade"
                raise SystemExit(failed_step)
            time.sleep(2.5)  # past the holders' TTL: their locks must still be held
            until = time.monotonic()
            pause = max(p.longest_pause(stopped - 0.5, until) for p in probers)
            steps.append({"node": i + 1, "was_leader": was_leader, "pause_ms": pause * 1000,
                          "back_after_ms": (until - 2.5 - stopped) * 1000})
            log(f"node {i + 1}{' (leader)' if was_leader else ''} upgraded: longest pause {pause * 1000:.0f} ms, "
                f"caught up after {(until - 2.5 - stopped) * 1000:.0f} ms")
        time.sleep(1.0)
    finally:
        for p in probers:
            p.stop_flag.set()
        for h in kept:
            h.stop_flag.set()
        for t in probers + kept:
            t.join(5)
        if load and load.poll() is None:
            load.kill()
            load.wait()
        cluster.stop()
        if failed_step:
            log(f"FAILED: {failed_step}; node logs kept in {workdir}")
            for n in range(3):
                log(f"--- node {n + 1}, last lines of its log ---")
                log(tail(os.path.join(workdir, f"node-{n + 1}.log")))

    fences = [f for p in probers for _, f in p.grants]
    reused = len(fences) - len(set(fences))
    # Each prober asks only once its last acquire was answered: each of its
    # tokens is above the one before.
    out_of_order = sum(1 for p in probers for (_, a), (_, b) in zip(p.grants, p.grants[1:]) if b <= a)
    lost = [h.lost for h in kept if h.lost is not None]
    pauses = sorted(s["pause_ms"] for s in steps)
    result = {"from": version(old), "to": version(new), "load_clients": load_clients, "steps": steps,
              "pause_p50_ms": statistics.median(pauses), "pause_max_ms": pauses[-1],
              "holders": holders, "locks_lost": len(lost), "grants_checked": len(fences),
              "tokens_reused": reused, "tokens_out_of_order": out_of_order}
    if lost or reused or out_of_order:
        log(f"FAILED: {len(lost)} locks lost ({lost}), {reused} tokens reused, {out_of_order} out of order; "
            f"node logs kept in {workdir}")
        result["failed"] = True
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="old", required=True, help="the old leaseholdd binary")
    ap.add_argument("--to", dest="new", required=True, help="the new leaseholdd binary")
    ap.add_argument("--cli", required=True, help="a leasehold CLI, for the cycle load")
    ap.add_argument("--holders", type=int, default=5)
    ap.add_argument("--load-clients", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.old, args.new, args.cli, args.holders, args.load_clients)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['from']} -> {r['to']}, one node at a time under cycle x{r['load_clients']}: pause per node "
              f"p50 {r['pause_p50_ms']:.0f} ms, max {r['pause_max_ms']:.0f} ms; {r['locks_lost']} of "
              f"{r['holders']} held locks lost; {r['grants_checked']} grants, {r['tokens_reused']} tokens "
              f"reused, {r['tokens_out_of_order']} out of order")
    sys.exit(1 if r.get("failed") else 0)


if __name__ == "__main__":
    main()
