#!/usr/bin/env python3
"""A wiped follower rebuilt from a snapshot of many held locks.

Starts a 3-node release cluster on free ports (temporary data dirs), holds
LOCKS locks on the leader (`leasehold bench --workload hold`), takes a
snapshot of them by applying past `--snapshot-every`, then kills a follower,
deletes its data dir and starts it empty. Reports how long until it has
applied everything the leader had, the snapshot chunks sent, the snapshot's
size, the rebuilt follower's resident memory, and the number of locks
held in its table; then runs `cycle` x50 for LOAD seconds with every lock
still held and reports the elections it saw. Stops exactly the processes it
started.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/snapshot.py [--locks 1000000] [--load 30]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import failover as fo  # noqa: E402  (the cluster helpers)


def health(addr):
    try:
        return fo.call(addr, "GET", "/health", timeout=2)[1] or {}
    except OSError:
        return {}


def metric(addr, name):
    try:
        import urllib.request
        text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=5).read().decode()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0


def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--locks", type=int, default=1_000_000)
    ap.add_argument("--load", type=int, default=30, help="seconds of cycle x50 with the locks held")
    args = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="leasehold-snapshot-")
    fo.NODE_ARGS[:] = ["--snapshot-every", str(max(args.locks // 2, 1_000))]
    cluster = fo.Cluster(3, workdir)
    try:
        leader = cluster.wait_leader(20)
        endpoint = "http://" + ",".join(cluster.addrs)
        t = time.monotonic()
        r = subprocess.run([fo.CLI, "--endpoint", endpoint, "bench", "--workload", "hold", "--clients", "50",
                            "--keys", str(args.locks), "--ttl", "30m", "--json"],
                           capture_output=True, text=True)
        held = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"held {held['ops']:,} locks in {time.monotonic() - t:.1f} s through the cluster", flush=True)
        leader = cluster.wait_leader()
        laddr = cluster.addrs[leader]
        # Wait for the snapshot the hold triggered to be on disk.
        snap = os.path.join(workdir, f"d{leader + 1}", "snapshot")
        deadline = time.monotonic() + 120
        while not os.path.exists(snap) and time.monotonic() < deadline:
            time.sleep(0.2)
        follower = next(i for i in range(3) if i != leader)
        cluster.kill(follower)
        shutil.rmtree(os.path.join(workdir, f"d{follower + 1}"))
        target = health(laddr).get("last_applied", 0)
        chunks_before = metric(laddr, "leasehold_raft_snapshot_chunks_sent_total")
        t = time.monotonic()
        cluster.start(follower)
        faddr = cluster.addrs[follower]
        while health(faddr).get("last_applied", 0) < target:
            if time.monotonic() - t > 600:
                raise SystemExit("the wiped follower was not rebuilt within 600 s")
            time.sleep(0.1)
        took = time.monotonic() - t
        chunks = metric(laddr, "leasehold_raft_snapshot_chunks_sent_total") - chunks_before
        size = os.path.getsize(snap)
        print(f"wiped follower rebuilt in {took:.1f} s: snapshot of {size / 2**20:.0f} MiB in {chunks:.0f} chunks "
              f"(and whatever log followed it); its RSS {rss(cluster.procs[follower].pid) / 2**20:.0f} MiB", flush=True)
        held_there = metric(faddr, "leasehold_locks_held")
        print(f"locks held in the rebuilt node's table: {held_there:,.0f}", flush=True)
        # Then `cycle` load on top of every held lock: snapshots of the big
        # table come and go, and the group should keep its leader throughout.
        term = max(health(a).get("term", 0) for a in cluster.addrs)
        r = subprocess.run([fo.CLI, "--endpoint", endpoint, "bench", "--workload", "cycle", "--clients", "50",
                            "--duration", f"{args.load}s", "--json"], capture_output=True, text=True)
        load = json.loads(r.stdout.strip().splitlines()[-1])
        elections = max(health(a).get("term", 0) for a in cluster.addrs) - term
        print(f"cycle x50 for {args.load} s with them held: {load['ops_per_sec']:,.0f} cycles/s, "
              f"p99.9 {load['latency_ms']['p999']:.1f} ms, max {load['latency_ms']['max']:.1f} ms, "
              f"the term rose by {elections}", flush=True)
        print(json.dumps({"locks": held["ops"], "rebuild_seconds": took, "snapshot_bytes": size, "chunks": chunks,
                          "locks_on_rebuilt_node": held_there, "load_cycles_per_sec": load["ops_per_sec"],
                          "load_latency_ms": load["latency_ms"], "load_new_terms": elections}))
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
