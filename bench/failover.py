#!/usr/bin/env python3
"""Failover of a 3-node leaseholdd cluster on this machine.

Starts three release `leaseholdd` nodes on free ports (temporary data dirs),
runs the `cycle` workload against the cluster (`leasehold bench`, 50 clients,
all three endpoints), keeps a holder of TTL 2 s renewing its lease every
TTL/3 through whichever node leads, and `kill -9`s the leader N times
(restarting it after each round). For each kill it reports the time from the
kill to the first successful acquire at a client that follows `not_leader`
hints and rotates past dead nodes, the longest pause between two successful
acquires of a client acquiring without a break, and whether the holder's
lock survived. With `--stop term` the leader is stopped with SIGTERM
instead (a planned restart: it hands leadership over before it exits).
Stops exactly the processes it started.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/failover.py [--kills 10] [--load-clients 50] [--stop kill|term] [--prober http|python|rust|go|typescript] [--json]

`bench/compare.py` runs it too, for its failover table.
"""

import argparse
import json
import os
import random
import sys
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "leaseholdd")
CLI = os.path.join(ROOT, "target", "release", "leasehold")
# Extra leaseholdd flags for every node, e.g. "--election-timeout 80ms".
NODE_ARGS = os.environ.get("NODE_ARGS", "").split()


_next_port = None


def free_port():
    """A port nobody listens on, below the kernel's range for outgoing
    connections' local ports: a port from that range (bind to port 0) may be
    taken by any outgoing connection while its server restarts, which then
    fails with "address in use"."""
    global _next_port
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            below = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        below = 32768
    floor = 10000
    if below > floor + 1000:
        span = below - floor
        if _next_port is None:
            _next_port = os.getpid() * 7919 % span
        for _ in range(span):
            port = floor + _next_port % span
            _next_port += 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(addr, method, path, body=None, timeout=1.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def wait_leading(addr, what="leaseholdd", limit=20.0):
    """Waits until the node at `addr` leads; exits saying so after `limit` s."""
    deadline = time.monotonic() + limit
    while True:
        try:
            _, health = call(addr, "GET", "/health", timeout=0.5)
            if health and health.get("leader"):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: no leader within {limit:.0f} s")
        time.sleep(0.05)


class Cluster:
    def __init__(self, n, workdir, data_dirs=None):
        self.addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
        self.peers = ",".join(f"{i + 1}={a}" for i, a in enumerate(self.addrs))
        self.workdir = workdir
        # Each node's data dir; by default, one per node in `workdir`.
        self.data_dirs = data_dirs or [os.path.join(workdir, f"d{i + 1}") for i in range(n)]
        self.procs = [None] * n
        for i in range(n):
            self.start(i)

    def start(self, i):
        log = open(os.path.join(self.workdir, f"node-{i + 1}.log"), "ab")
        self.procs[i] = subprocess.Popen(
            [BIN, "--node-id", str(i + 1), "--listen", self.addrs[i], "--peers", self.peers,
             "--data-dir", self.data_dirs[i], *NODE_ARGS],
            stdout=log, stderr=log)

    def kill(self, i, how=signal.SIGKILL):
        self.procs[i].send_signal(how)
        self.procs[i].wait()

    def leader(self):
        for i, a in enumerate(self.addrs):
            if self.procs[i].poll() is not None:
                continue
            try:
                _, h = call(a, "GET", "/health", timeout=0.3)
            except OSError:
                continue
            if h and h.get("leader"):
                return i
        return None

    def wait_leader(self, limit=10.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            i = self.leader()
            if i is not None:
                return i
            time.sleep(0.05)
        raise SystemExit(f"no leader within {limit} s")

    def stop(self):
        for p in self.procs:
            if p and p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def acquire_anywhere(cluster, key, ttl_ms, deadline):
    """Acquire through any node as a real client does (docs/api.md, "Rules
    for a client of your own"): one request id for every attempt, so an
    attempt whose answer was lost (the leader killed after it granted) is
    answered with that grant when sent again, instead of finding the key held
    by its own orphaned lease; a leader named is followed at once, then with
    a pause growing by 10 ms to 50 ms while elections run. The grant or None."""
    body = {"key": key, "ttl_ms": ttl_ms, "request_id": random.getrandbits(52) | 1}
    i, hops = 0, 0
    while time.monotonic() < deadline:
        addr = cluster.addrs[i % len(cluster.addrs)]
        try:
            s, r = call(addr, "POST", "/v1/acquire", body, timeout=0.5)
        except OSError:
            i += 1
            continue
        if s == 200:
            return r
        leader = (r or {}).get("error", {}).get("leader")
        if leader in cluster.addrs:
            i = cluster.addrs.index(leader)
        else:
            i += 1
        time.sleep(min(0.01 * hops, 0.05))
        hops += 1
    return None


class Holder(threading.Thread):
    """Holds one lock with TTL 2 s, renewing every TTL/3 wherever the leader is."""

    def __init__(self, cluster, key):
        super().__init__(daemon=True)
        self.cluster, self.key, self.stop_flag = cluster, key, threading.Event()
        g = acquire_anywhere(cluster, key, 2000, time.monotonic() + 10)
        self.lease, self.fence, self.lost = g["lease"], g["fence"], None
        self.deadline = time.monotonic() + 1.8

    def run(self):
        while not self.stop_flag.is_set():
            sent = time.monotonic()
            if sent > self.deadline:
                self.lost = "deadline passed"
                return
            ok = False
            for a in self.cluster.addrs:
                try:
                    s, r = call(a, "POST", f"/v1/leases/{self.lease}/keepalive", timeout=0.3)
                except OSError:
                    continue
                if s == 200:
                    ok = True
                    break
                if s in (404, 410):
                    self.lost = "lease gone"
                    return
            if ok:
                self.deadline = sent + 1.8
                time.sleep(2.0 / 3)
            else:
                time.sleep(0.05)


class Prober(threading.Thread):
    """Acquires short-lived locks without a break, noting when each succeeds:
    over raw HTTP as `acquire_anywhere` does (`client="http"`), or with the
    Python client (`client="python"`, `leasehold.Client` over every node:
    run the script with a Python that has httpx, such as target/python-venv)."""

    def __init__(self, cluster, name, client="http"):
        super().__init__(daemon=True)
        self.cluster, self.name, self.stop_flag, self.ok = cluster, name, threading.Event(), []
        self.client = None
        if client == "python":
            sys.path.insert(0, os.path.join(ROOT, "clients", "python", "src"))
            import leasehold

            self.client = leasehold.Client("http://" + ",".join(cluster.addrs), timeout=0.5)

    def run(self):
        n = 0
        while not self.stop_flag.is_set():
            n += 1
            if self.client is not None:
                try:
                    self.client.try_lock(f"{self.name}-{n}", ttl=1).release()
                    self.ok.append(time.monotonic())
                except Exception:  # the pause is what is measured
                    pass
            elif acquire_anywhere(self.cluster, f"{self.name}-{n}", 1000, time.monotonic() + 1):
                self.ok.append(time.monotonic())

    def longest_pause(self, since, until):
        """The longest time between two successes (or `since`/`until`) in the window."""
        marks = [since] + [t for t in self.ok if since < t < until] + [until]
        return max(b - a for a, b in zip(marks, marks[1:]))


class ProcessProber:
    """A client's own `cycle` program, 5 users cycling without a break over
    every node: the Rust client (`leasehold bench`, whose longest single
    cycle is its longest pause), or the Go or TypeScript client's
    (`bench/cycle` in clients/go, `bench/cycle.mjs` in clients/typescript,
    which report the longest a user went between two cycles done)."""

    def __init__(self, cluster, seconds, client, go_binary=None):
        endpoint = "http://" + ",".join(cluster.addrs)
        cmd = {
            "rust": [CLI, "--endpoint", endpoint, "bench", "--workload", "cycle", "--clients", "5",
                     "--duration", f"{seconds}s", "--json"],
            "go": [go_binary, "--endpoint", endpoint, "--clients", "5", "--seconds", str(seconds)],
            "typescript": ["node", os.path.join(ROOT, "clients", "typescript", "bench", "cycle.mjs"),
                           "--endpoint", endpoint, "--clients", "5", "--seconds", str(seconds)],
        }[client]
        self.client = client
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def longest_pause(self):
        out, _ = self.proc.communicate(timeout=60)
        r = json.loads(out.splitlines()[-1])
        if self.client == "rust":
            return r["latency_ms"]["max"] / 1000
        return r["longest_gap_ms"] / 1000


def go_cycle_binary(workdir):
    """Builds the Go client's `cycle` program (standard library only)."""
    exe = os.path.join(workdir, "cycle-go")
    subprocess.run(["go", "build", "-o", exe, "./bench/cycle"], cwd=os.path.join(ROOT, "clients", "go"), check=True,
                   env={**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"})
    return exe


def run(kills=10, load_clients=50, log=print, stop="kill", prober="http"):
    """Stops the leader `kills` times (`kill -9`, or SIGTERM with stop="term")
    under a cycle load; the figures as a dict. `prober` is the client whose
    longest pause is measured: `http` (this script's, as a client of its own
    would be written), `python`, `rust`, `go` or `typescript`."""
    how = signal.SIGTERM if stop == "term" else signal.SIGKILL
    for b in (BIN, CLI):
        if not os.path.exists(b):
            raise SystemExit("build first: cargo build --release --bin leaseholdd --bin leasehold")
    workdir = tempfile.mkdtemp(prefix="leasehold-failover-")
    cluster = Cluster(3, workdir)
    go_binary = go_cycle_binary(workdir) if prober == "go" else None
    load = None
    times, pauses, lost = [], [], 0
    try:
        cluster.wait_leader(20)
        if load_clients:
            endpoint = "http://" + ",".join(cluster.addrs)
            load = subprocess.Popen(
                [CLI, "--endpoint", endpoint, "bench", "--workload", "cycle", "--clients", str(load_clients),
                 "--duration", f"{kills * 10 + 30}s"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        for k in range(kills):
            holder = Holder(cluster, f"held-{k}")
            holder.start()
            if prober in ("rust", "go", "typescript"):
                probe = ProcessProber(cluster, 4, prober, go_binary)
            else:
                probe = Prober(cluster, f"probe-{k}", prober)
                probe.start()
            time.sleep(1.0)
            leader = cluster.wait_leader()
            killed = time.monotonic()
            cluster.kill(leader, how)
            g = acquire_anywhere(cluster, f"first-{k}", 5000, killed + 10)
            took = time.monotonic() - killed
            time.sleep(2.5)  # past the holder's TTL: its lock must still be held
            holder.stop_flag.set()
            holder.join()
            if prober in ("rust", "go", "typescript"):
                pause = probe.longest_pause()
            else:
                probe.stop_flag.set()
                probe.join()
                pause = probe.longest_pause(killed - 0.5, killed + 2.5)
            survived = holder.lost is None
            lost += 0 if survived else 1
            times.append(took if g else float("inf"))
            pauses.append(pause)
            log(f"{stop} {k + 1}: first acquire after {took * 1000:.0f} ms, longest pause {pause * 1000:.0f} ms; "
                f"TTL 2 s holder {'kept its lock' if survived else 'LOST: ' + holder.lost}")
            cluster.start(leader)
            time.sleep(1.0)
        ms = sorted(t * 1000 for t in times)
        paused = sorted(p * 1000 for p in pauses)
        return {"kills": len(ms), "stop": stop, "prober": prober, "load_clients": load_clients,
                "p50_ms": statistics.median(ms),
                "max_ms": ms[-1], "pause_p50_ms": statistics.median(paused), "pause_max_ms": paused[-1],
                "locks_lost": lost, "times_ms": ms, "pauses_ms": paused}
    finally:
        if load and load.poll() is None:
            load.kill()
            load.wait()
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--load-clients", type=int, default=50, help="cycle clients during the kills (0: none)")
    ap.add_argument("--stop", choices=["kill", "term"], default="kill",
                    help="how the leader is stopped: kill -9, or SIGTERM (a planned restart)")
    ap.add_argument("--prober", choices=["http", "python", "rust", "go", "typescript"], default="http",
                    help="the client whose longest pause is measured: this script's own over HTTP, "
                         "the Python client (run with target/python-venv/bin/python), or the Rust, Go "
                         "or TypeScript one (built: scripts/prepare-clients)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = run(args.kills, args.load_clients, stop=args.stop, prober=args.prober)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['kills']} leader stops ({r['stop']}) under cycle x{r['load_clients']}, {r['prober']} prober: first acquire p50 "
              f"{r['p50_ms']:.0f} ms, max {r['max_ms']:.0f} ms; longest pause p50 {r['pause_p50_ms']:.0f} ms, "
              f"max {r['pause_max_ms']:.0f} ms; locks lost: {r['locks_lost']}")


if __name__ == "__main__":
    main()
