#!/usr/bin/env python3
"""Live sessions on one leaseholdd node or a 3-node cluster.

Starts fresh release nodes (temporary data dirs), then for each count in
--sessions runs `leasehold bench --workload sessions`: that many leases,
each holding one lock, renewed every TTL/3 on schedule (open loop, as real
holders renew) over --connections connections (--connections equal to the
count: one connection per session). Reports renewals due and done per
second, the latency of a renewal from when it was due (p50, p99, max),
sessions lost (ended by the server although renewed on time: must be 0),
renewals the load generator could not send, and each node's CPU (a share of
one core over the window) and RSS, with both per 100,000 sessions. The load
generator runs on the same 2 cores as the nodes: read the CPU figures as the
nodes' own, and the latencies as an upper bound. Stops exactly the
processes it started.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/sessions.py [--nodes 1|3] [--sessions 10000,100000] [--connections 50]
                              [--renew together|each] [--ttl 30] [--seconds 20] [--json]
                              [--store leaseholdd|etcd]

--renew together (the default) renews by the Rust client's rule: a
connection's call leaves when its first renewal waiting is due and takes
every renewal due within a thirtieth of the TTL (at most 1 s), as one
KeepAliveMany. --renew each sends a call per renewal, as the Go,
TypeScript and Python clients do.

--store etcd runs the same count against a fresh etcd cluster of --nodes
members instead (etcd's defaults), through the `leasehold` crate's etcd
backend (`leasehold bench --workload keep`): each session is an etcd lease
holding one key, renewed every TTL/3 on its own keepalive stream, as that
backend renews. It reports sessions lost and each member's CPU and RSS, for
the comparison beside leaseholdd's figures (etcd's client gives no latency
per renewal).

Figures are of this machine at the time of the run: compare runs made in one
session, never absolute numbers across days (bench/results.md).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import failover as f  # noqa: E402  (its cluster of release nodes and helpers)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss(pid):
    status = open(f"/proc/{pid}/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def start(nodes, workdir):
    """A fresh single node (no flags but its address and data dir) or a
    cluster of `nodes`; returns (endpoint, processes, stop, cluster or None)."""
    if nodes == 1:
        addr = f"127.0.0.1:{f.free_port()}"
        log = open(os.path.join(workdir, "node.log"), "ab")
        p = subprocess.Popen([f.BIN, "--listen", addr, "--data-dir", os.path.join(workdir, "d")],
                             stdout=log, stderr=log)
        f.wait_leading(addr)

        def stop():
            p.kill()
            p.wait()
        return f"http://{addr}", [p], stop, None
    cluster = f.Cluster(nodes, workdir)
    cluster.wait_leader()
    return "http://" + ",".join(cluster.addrs), cluster.procs, cluster.stop, cluster


def start_etcd(members, workdir):
    """A fresh etcd cluster of `members` with etcd's defaults; returns
    (endpoint, processes, stop)."""
    ports = [(f.free_port(), f.free_port()) for _ in range(members)]
    initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
    procs = []
    for i, (port, peer) in enumerate(ports):
        log = open(os.path.join(workdir, f"etcd-m{i}.log"), "ab")
        procs.append(subprocess.Popen(
            ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(workdir, f"etcd-m{i}"),
             "--listen-client-urls", f"http://127.0.0.1:{port}",
             "--advertise-client-urls", f"http://127.0.0.1:{port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", initial, "--initial-cluster-state", "new"],
            stdout=log, stderr=log))

    def stop():
        for p in procs:
            p.kill()
            p.wait()
    deadline = time.time() + 30
    for port, _ in ports:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            if time.time() > deadline:
                stop()
                raise SystemExit(f"etcd on port {port} is not healthy after 30 s: see its log in {workdir}")
            time.sleep(0.1)
    return "etcd://" + ",".join(f"127.0.0.1:{port}" for port, _ in ports), procs, stop


def cycle_p99(endpoint, seconds, clients=50):
    """`cycle` from `clients` other clients for `seconds`: (cycles/s, p99 ms)."""
    out = subprocess.run(
        [f.CLI, "--endpoint", endpoint, "bench", "--workload", "cycle", "--clients", str(clients),
         "--duration", f"{seconds}s", "--json"],
        capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["ops_per_sec"], r["latency_ms"]["p99"]


class Then(threading.Thread):
    """What happens while the sessions bench runs, timed by the lines it
    writes to stderr: `expire` measures other clients' `cycle` while the
    sessions are idle and again while they expire; `kill` and `term` stop
    the leader halfway through the window and time the first acquire
    after it. Its findings go in `found`."""

    def __init__(self, what, bench, endpoint, cluster, ttl, seconds):
        super().__init__(daemon=True)
        self.what, self.bench, self.endpoint, self.cluster = what, bench, endpoint, cluster
        self.ttl, self.seconds, self.found, self.lines = ttl, seconds, {}, []
        self.log = None

    def run(self):
        for line in self.bench.stderr:
            self.lines.append(line)
            if self.log:
                self.log.write(line)
                self.log.flush()
            marker, _, at = line.strip().rpartition(" ")
            if self.what in ("kill", "term") and marker == "sessions: renewing from":
                time.sleep(self.seconds / 2)
                self.stop_leader()
            if self.what == "expire" and marker == "sessions: stopped renewing at":
                self.storm(float(at))

    def stop_leader(self):
        leader = self.cluster.leader()
        if leader is None:
            self.found["error"] = "no node led when the leader was to be stopped"
            return
        how = signal.SIGKILL if self.what == "kill" else signal.SIGTERM
        stopped = time.monotonic()
        self.found["stop_unix"] = time.time()
        # Not waited for before the acquire: a node stopped with SIGTERM
        # hands over, then takes a snapshot before it exits.
        self.cluster.procs[leader].send_signal(how)
        g = f.acquire_anywhere(self.cluster, f"bench/first-after-{self.what}", 5000, stopped + 10)
        self.found["first_acquire_ms"] = (time.monotonic() - stopped) * 1000 if g else None
        self.cluster.procs[leader].wait()
        self.found["node_stopped"] = leader + 1
        after = self.cluster.leader()
        self.found["leader_after"] = None if after is None else after + 1

    def storm(self, stopped):
        """The sessions' leases, renewed last over the period before
        `stopped`, expire over the period that ends a TTL after it."""
        period = self.ttl / 3
        calm_from, storm_from = stopped + 3, stopped + self.ttl - period - 1
        calm_for = max(1, int(storm_from - calm_from - 3))
        time.sleep(max(0, calm_from - time.time()))
        self.found["calm"] = cycle_p99(self.endpoint, calm_for)
        time.sleep(max(0, storm_from - time.time()))
        self.found["storm"] = cycle_p99(self.endpoint, int(period + 2))


def sample(pid, read, last):
    try:
        return read(pid)
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return last  # a node stopped on purpose (or stopping) keeps its last figure


def run(nodes, sessions, connections, ttl, seconds, workload="sessions", then="nothing"):
    workdir = tempfile.mkdtemp(prefix="leasehold-sessions-")
    if workload == "keep":
        endpoint, procs, stop = start_etcd(nodes, workdir)
        cluster = None
    else:
        endpoint, procs, stop, cluster = start(nodes, workdir)
    try:
        pids = [p.pid for p in procs]
        rss_before = [rss(p) for p in pids]
        extra = ["--stop-renewing"] if then == "expire" else []
        bench = subprocess.Popen(
            [f.CLI, "--endpoint", endpoint, "bench", "--workload", workload, "--keys", str(sessions),
             "--clients", str(connections), "--ttl", f"{ttl}s", "--duration", f"{seconds}s", "--json",
             *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        during = Then(then, bench, endpoint, cluster, ttl, seconds)
        during.log = open(os.path.join(workdir, "bench.log"), "w")
        during.start()
        # Every node's CPU time, sampled while the bench runs; the bench
        # reports its measured window, and the samples nearest its ends
        # give each node's share of a core over it.
        samples = []
        last_cpu, last_rss = [0.0] * len(pids), [0] * len(pids)
        while bench.poll() is None:
            try:
                mine = cpu_seconds(bench.pid)
            except (FileNotFoundError, ProcessLookupError):
                mine = None
            last_cpu = [sample(p, cpu_seconds, c) for p, c in zip(pids, last_cpu)]
            last_rss = [sample(p, rss, r) for p, r in zip(pids, last_rss)]
            samples.append((time.time(), last_cpu, last_rss, mine))
            time.sleep(0.1)
        stdout = bench.stdout.read()
        bench.wait()
        during.join(timeout=60)
        if bench.returncode != 0:
            raise SystemExit(f"bench failed: {''.join(during.lines).strip()[-500:]}")
        out = json.loads(stdout.strip().splitlines()[-1])
        opened, closed = out.get("window_unix", [samples[-1][0] - seconds, samples[-1][0]])
        begin, cpu_begin, _, gen_begin = min(samples, key=lambda s: abs(s[0] - opened))
        end, cpu_end, _, gen_end = min(samples, key=lambda s: abs(s[0] - closed))
        if gen_begin is not None and gen_end is not None:
            out["generator_cpu_share"] = (gen_end - gen_begin) / max(end - begin, 1e-9)
        rss_end = samples[-1][2]
        out["node_cpu_share"] = [(b - a) / max(end - begin, 1e-9) for a, b in zip(cpu_begin, cpu_end)]
        out["node_rss_bytes"] = rss_end
        out["node_rss_growth_bytes"] = [a - b for a, b in zip(rss_end, rss_before)]
        if then != "nothing":
            out["then"] = dict(during.found, what=then)
        return out
    finally:
        stop()
        shutil.rmtree(workdir, ignore_errors=True)


def costs(out, n):
    """Each node's CPU and RSS, and both per 100,000 of `n` sessions."""
    per = 100_000 / max(n, 1)
    rss_mib = ", ".join(f"{b / 2**20:.0f}" for b in out["node_rss_bytes"])
    cpu = ", ".join(f"{c:.2f}" for c in out["node_cpu_share"])
    growth = max(out["node_rss_growth_bytes"])
    return (f"CPU (cores) {cpu} ({max(out['node_cpu_share']) * per:.2f} per 100k; "
            f"load generator {out.get('generator_cpu_share', 0):.2f}); "
            f"RSS MiB {rss_mib} (+{growth * per / 2**20:.1f} MiB per 100k)")


def etcd_line(nodes, out):
    n = out["locks_held"]
    return (f"etcd, {nodes} member(s), {n:,} leases each holding a key, each renewed at TTL/3 on its own "
            f"keepalive stream over {out['clients']} client(s): lost {out['locks_lost']}; "
            f"{costs(out, n)}; granting {out['setup_seconds']:.1f} s; errors {out['errors']}")


def line(nodes, out):
    n = out.get("sessions_granted", out["sessions"])
    lat = out["latency_ms"]
    return (f"{nodes} node(s), {n:,} sessions over {out['connections']:,} connection(s): "
            f"renewals due {out['renewals_due_per_sec']:,.0f}/s, done {out['renewals_done_per_sec']:,.0f}/s "
            f"({out.get('renewals_per_call', 1):,.1f} per call); "
            f"from due: p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms; "
            f"lost {out['sessions_lost']} (locks {out['renewals_without_their_lock']}), "
            f"not sent {out['renewals_not_sent']}; "
            f"{costs(out, n)}; granting {out['grant_seconds']:.1f} s" + then_line(out))


def then_line(out):
    then, text = out.get("then", {}), ""
    if then.get("error"):
        text += f"; {then['error']}"
    elif then.get("what") in ("kill", "term"):
        took = then.get("first_acquire_ms")
        text += (f"; {then['what']} of the leader (node {then.get('node_stopped')}): first acquire after "
                 + (f"{took:.0f} ms" if took is not None else "none within 10 s")
                 + f", node {then.get('leader_after')} leads")
    expiry = out.get("sessions_expiry")
    if expiry:
        late = expiry["late_ms"]
        spread = (expiry["last_unix"] or 0) - (expiry["first_unix"] or 0)
        text += (f"; stopped renewing: {expiry['expired']:,} expired over {spread:.1f} s, "
                 f"{expiry['not_expired']} not seen ({expiry['still_held']} still held; "
                 f"the watch broke {expiry['watch_broken']} times), {expiry['early']} early "
                 f"({expiry['early_within_resolution']} inside the table's 1 ms, at most "
                 f"{expiry['earliest_ms']:.2f} ms); after their TTL "
                 f"p50 {late['p50']:.0f} ms, p99 {late['p99']:.0f} ms, max {late['max']:.0f} ms")
    for window in ("calm", "storm"):
        if window in then:
            rate, p99 = then[window]
            text += f"; others' cycle {window}: {rate:,.0f}/s, p99 {p99:.1f} ms"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, choices=[1, 3], default=1)
    ap.add_argument("--sessions", default="10000,100000", help="comma-separated session counts")
    ap.add_argument("--connections", type=int, default=50,
                    help="connections the sessions share (0: one per session)")
    ap.add_argument("--renew", choices=["together", "each"], default="together",
                    help="renewals due together in one call, or a call each")
    ap.add_argument("--ttl", type=int, default=30, help="lease TTL in seconds")
    ap.add_argument("--seconds", type=int, default=None, help="measured window (default: 2 x TTL/3)")
    ap.add_argument("--then", choices=["nothing", "expire", "kill", "term"], default="nothing",
                    help="expire: every session stops renewing when the window ends; "
                         "kill, term: the leader is stopped halfway through it (3 nodes)")
    ap.add_argument("--store", choices=["leaseholdd", "etcd"], default="leaseholdd",
                    help="etcd: the same sessions on an etcd cluster, through the crate's etcd backend")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.store == "etcd" and (args.then != "nothing" or args.renew != "together"):
        raise SystemExit("--store etcd runs sessions renewed as the etcd backend renews: no --then, no --renew")
    if args.store == "etcd" and not shutil.which("etcd"):
        raise SystemExit("etcd is not on PATH: install it (Debian: apt-get install etcd-server)")
    if args.then in ("kill", "term") and args.nodes != 3:
        raise SystemExit("--then kill|term needs --nodes 3")
    for b in (f.BIN, f.CLI):
        if not os.path.exists(b):
            raise SystemExit("build first: cargo build --release --bin leaseholdd --bin leasehold")
    seconds = args.seconds or max(1, 2 * args.ttl // 3)
    for n in (int(s) for s in args.sessions.split(",")):
        workload = "sessions" if args.renew == "together" else "sessions-each"
        if args.store == "etcd":
            workload = "keep"
        out = run(args.nodes, n, args.connections or n, args.ttl, seconds, workload, args.then)
        show = etcd_line if args.store == "etcd" else line
        print(json.dumps(out) if args.json else show(args.nodes, out), flush=True)


if __name__ == "__main__":
    main()
