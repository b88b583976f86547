#!/usr/bin/env python3
"""What the 3-node cluster's `cycle` x50 would do without some of its flushes.

An upper-bound experiment, not a way to run leaseholdd: it starts 3-node
release clusters on free ports with each node's data dir either on this
machine's disk (a temporary dir under TMPDIR) or in memory (tmpfs, by default
/dev/shm, where `fdatasync` returns at once), runs `leasehold bench --workload
cycle --clients 50` against each, and Redis with `appendfsync always` on the
disk for reference, interleaved, ROUNDS times. Layouts:

- `disk`: every node on the disk (how the cluster runs);
- `leader-memory`: the leader's log in memory, the followers' on the disk:
  the most that overlapping the leader's flush with replication could give;
- `followers-memory`: the followers' logs in memory, the leader's on the disk;
- `memory`: every node in memory: what the cluster does with no flush at all.

Node 1 is the first leader of a new group; a layout whose leader came out
elsewhere is started again. Stops exactly the processes it started.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/flushes.py [--rounds 3] [--seconds 5] [--memory /dev/shm]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import failover as fo  # noqa: E402  (the cluster helpers)

LAYOUTS = {
    # Which of nodes 1, 2, 3 keep their data in memory.
    "disk": (),
    "leader-memory": (0,),
    "followers-memory": (1, 2),
    "memory": (0, 1, 2),
}


def cycle(endpoint, seconds):
    r = subprocess.run([fo.CLI, "--endpoint", endpoint, "bench", "--workload", "cycle",
                        "--clients", "50", "--duration", f"{seconds}s", "--json"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"bench failed: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])["ops_per_sec"]


def run_layout(name, seconds, memory):
    disk = tempfile.mkdtemp(prefix="leasehold-flushes-")
    mem = tempfile.mkdtemp(prefix="leasehold-flushes-", dir=memory)
    try:
        for _ in range(3):
            dirs = [os.path.join(mem if i in LAYOUTS[name] else disk, f"d{i + 1}-{time.monotonic_ns()}")
                    for i in range(3)]
            cluster = fo.Cluster(3, disk, data_dirs=dirs)
            try:
                if cluster.wait_leader(20) != 0:
                    continue
                return cycle("http://" + ",".join(cluster.addrs), seconds)
            finally:
                cluster.stop()
        raise SystemExit(f"{name}: node 1 did not lead in 3 starts")
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(mem, ignore_errors=True)


def run_redis(seconds):
    d = tempfile.mkdtemp(prefix="leasehold-flushes-redis-")
    port = fo.free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                          "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            r = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
            if r.stdout.strip() == "PONG":
                break
            time.sleep(0.05)
        return cycle(f"redis://127.0.0.1:{port}", seconds)
    finally:
        p.terminate()
        p.wait()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--memory", default="/dev/shm", help="a tmpfs directory")
    args = ap.parse_args()
    if not os.path.isdir(args.memory):
        raise SystemExit(f"{args.memory} is not a directory (a tmpfs is needed)")
    rates = {name: [] for name in [*LAYOUTS, "redis-always"]}
    for r in range(args.rounds):
        for name in LAYOUTS:
            rates[name].append(run_layout(name, args.seconds, args.memory))
            print(f"round {r + 1}: {name}: {rates[name][-1]:,.0f} cycles/s", flush=True)
        rates["redis-always"].append(run_redis(args.seconds))
        print(f"round {r + 1}: redis-always: {rates['redis-always'][-1]:,.0f} cycles/s", flush=True)
    redis = statistics.median(rates["redis-always"])
    print()
    print("| layout | cycles/s (runs) | median | vs Redis fsync-always |")
    print("|---|---|---|---|")
    for name, runs in rates.items():
        med = statistics.median(runs)
        shown = ", ".join(f"{x / 1000:.1f}k" for x in runs)
        print(f"| {name} | {shown} | {med / 1000:.1f}k | {med / redis:.2f}x |")


if __name__ == "__main__":
    main()
