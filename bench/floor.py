#!/usr/bin/env python3
"""How close leaseholdd's 3-node cluster comes to the floor of this machine.

Builds `bench/floor.rs` (a replicated log with nothing else: threads,
blocking I/O, one `fdatasync` a batch on each node) with `rustc`, and runs,
interleaved in rounds, its single node and its 3 nodes beside leaseholdd's
single node and 3-node cluster (release builds, `cycle` through `leasehold
bench`). Prints each run, then the 3-node to single ratios of each pair:
throughput, and p50 latency. A floor request is one command; a leaseholdd
cycle is two (acquire, release), so compare ratios, not numbers.
Stops exactly the processes it started; data dirs are temporary.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/floor.py [--rounds 3] [--seconds 4] [--clients 1,50]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

import failover

HERE = os.path.dirname(os.path.abspath(__file__))


def build_floor(tmp):
    exe = os.path.join(tmp, "floor")
    subprocess.run(["rustc", "-O", "--edition", "2021", "-o", exe, os.path.join(HERE, "floor.rs")], check=True)
    return exe


class Floor:
    def __init__(self, exe, n, tmp):
        self.exe = exe
        self.procs = []
        followers = []
        for i in range(n - 1):
            port = failover.free_port()
            d = tempfile.mkdtemp(dir=tmp)
            self.procs.append(subprocess.Popen([exe, "follower", str(port), d]))
            followers.append(f"127.0.0.1:{port}")
        time.sleep(0.3)
        port = failover.free_port()
        d = tempfile.mkdtemp(dir=tmp)
        self.procs.append(subprocess.Popen([exe, "leader", str(port), d, *followers]))
        self.addr = f"127.0.0.1:{port}"
        time.sleep(0.3)

    def run(self, clients, seconds):
        out = subprocess.run([self.exe, "client", self.addr, str(clients), str(seconds)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        return r["ops_per_sec"], r["p50_us"] / 1000

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


class Leaseholdd:
    def __init__(self, n, tmp):
        if n == 1:
            self.addrs = [f"127.0.0.1:{failover.free_port()}"]
            log = open(os.path.join(tmp, "single.log"), "ab")
            self.procs = [subprocess.Popen([failover.BIN, "--listen", self.addrs[0], "--data-dir",
                                            tempfile.mkdtemp(dir=tmp)], stdout=log, stderr=log)]
        else:
            cluster = failover.Cluster(n, tempfile.mkdtemp(dir=tmp))
            self.addrs, self.procs = cluster.addrs, cluster.procs
        deadline = time.monotonic() + 20
        while not any(self.leads(a) for a in self.addrs):
            if time.monotonic() > deadline:
                raise SystemExit("leaseholdd: no leader within 20 s")
            time.sleep(0.1)

    @staticmethod
    def leads(addr):
        try:
            _, health = failover.call(addr, "GET", "/health", timeout=0.5)
            return bool(health and health.get("leader"))
        except OSError:
            return False

    def run(self, clients, seconds):
        out = subprocess.run([failover.CLI, "--endpoint", "http://" + ",".join(self.addrs), "bench",
                              "--workload", "cycle", "--clients", str(clients), "--duration", f"{seconds}s",
                              "--json"], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        return r["ops_per_sec"], r["latency_ms"]["p50"]

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--clients", default="1,50")
    args = ap.parse_args()
    cells = [int(c) for c in args.clients.split(",")]
    for b in (failover.BIN, failover.CLI):
        if not os.path.exists(b):
            raise SystemExit("build first: cargo build --release --bin leaseholdd --bin leasehold")
    tmp = tempfile.mkdtemp(prefix="leasehold-floor-")
    started = []
    try:
        exe = build_floor(tmp)
        for n in (1, 3):
            started.append(Leaseholdd(n, tmp))
        leaseholdd = {1: started[0], 3: started[1]}
        results = {}
        for r in range(args.rounds):
            for clients in cells:
                for n in (1, 3):
                    floor = Floor(exe, n, tmp)
                    try:
                        results.setdefault(("floor", clients, n), []).append(floor.run(clients, args.seconds))
                    finally:
                        floor.stop()
                    results.setdefault(("leaseholdd", clients, n), []).append(
                        leaseholdd[n].run(clients, args.seconds))
                for name in ("floor", "leaseholdd"):
                    for n in (1, 3):
                        ops, p50 = results[(name, clients, n)][-1]
                        print(f"round {r + 1} x{clients} {name} {n} node(s): {ops:,.0f}/s p50 {p50:.3f} ms", flush=True)
        print()
        for clients in cells:
            for name in ("floor", "leaseholdd"):
                one, three = results[(name, clients, 1)], results[(name, clients, 3)]
                rate = [t[0] / o[0] for o, t in zip(one, three)]
                p50 = [t[1] / o[1] for o, t in zip(one, three)]
                print(f"x{clients} {name}: 3 nodes / 1 node: throughput {min(rate):.2f}-{max(rate):.2f}x "
                      f"(median {statistics.median(rate):.2f}x), p50 {min(p50):.2f}-{max(p50):.2f}x "
                      f"(median {statistics.median(p50):.2f}x)")
    finally:
        for s in started:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
