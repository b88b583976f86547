#!/usr/bin/env python3
"""Side-by-side: the same workloads, the same machine, one run.

Starts each store on free loopback ports with durable settings, runs
`leasehold bench` against each (median of N runs, interleaved across the
stores), stops exactly the processes
it started, and prints one table with each store's figures and the ratio to
leaseholdd. Writes bench/results.md (and results.json) with the machine,
versions and date.

    python3 bench/compare.py            # 5 runs of 5 s per cell, interleaved
    RUNS=5 SECONDS=10 python3 bench/compare.py
    python3 bench/compare.py --quick    # 1 run of 2 s, no 1M-lock hold, 3 kills
    STORES=leaseholdd,redis-always,leaseholdd-3,etcd-3 python3 bench/compare.py

Stores: leaseholdd (one node), leaseholdd-3 (a 3-node cluster), redis-always,
redis-none, postgres, etcd (one member), etcd-3 (a 3-member cluster); all on
this machine, same disk, same cores. Then the failover workload
(bench/failover.py): the leader of a 3-node leaseholdd killed KILLS times
under the cycle load.

Needs: redis-server, etcd, PostgreSQL binaries (/usr/lib/postgresql/*/bin),
and a release build (the script runs `cargo build --release` first).
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time, urllib.request, glob, platform, datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = "--quick" in sys.argv
RUNS = int(os.environ.get("RUNS", 1 if QUICK else 5))
SECS = int(os.environ.get("SECONDS_PER_RUN", 2 if QUICK else 5))
HOLD = int(os.environ.get("HOLD_LOCKS", 0 if QUICK else 1_000_000))
# The cost of keeping locks held: this many locks, this TTL, for this long.
KEEP_LOCKS = int(os.environ.get("KEEP_LOCKS", 1_000 if QUICK else 10_000))
KEEP_TTL_S = 3 if QUICK else 10
KEEP_SECS = 4 if QUICK else 10
KILLS = int(os.environ.get("KILLS", 3 if QUICK else 10))
LEASEHOLD = os.path.join(ROOT, "target/release/leasehold")
LEASEHOLDD = os.path.join(ROOT, "target/release/leaseholdd")
started = []
tmp = tempfile.mkdtemp(prefix="leasehold-bench-")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from failover import free_port  # noqa: E402  (a port outside the outgoing range)


def wait(what, ok, limit=30):
    end = time.time() + limit
    while time.time() < end:
        try:
            if ok():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def spawn(name, args, **kw):
    log = open(os.path.join(tmp, name + ".log"), "ab")
    p = subprocess.Popen(args, stdout=log, stderr=log, **kw)
    started.append(p)
    return p


def stop_all():
    for p in started:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    shutil.rmtree(tmp, ignore_errors=True)


def version(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    except Exception as e:
        return f"unknown ({e})"


def start_redis(durable):
    port = free_port()
    d = os.path.join(tmp, f"redis-{port}")
    os.makedirs(d)
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", ""]
    args += ["--appendonly", "yes", "--appendfsync", "always"] if durable else ["--appendonly", "no"]
    p = spawn(f"redis-{port}", args)
    wait("redis", lambda: listening(port))
    return f"redis://127.0.0.1:{port}", p.pid


def start_postgres():
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        raise SystemExit("no PostgreSQL binaries found")
    b, port = bins[-1], free_port()
    d = os.path.join(tmp, "pg")
    os.makedirs(d)
    user = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        shutil.chown(tmp, "postgres")
        shutil.chown(d, "postgres")
        user = ["runuser", "-u", "postgres", "--"]
    subprocess.run(user + [f"{b}/initdb", "-D", d, "-U", "root", "--auth=trust"], check=True, capture_output=True)
    # Durable: fsync and synchronous_commit are on (the defaults), said explicitly.
    p = spawn("postgres", user + [f"{b}/postgres", "-D", d, "-p", str(port), "-k", d, "-c", "listen_addresses=127.0.0.1",
                               "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "max_connections=200"])
    wait("postgres", lambda: listening(port))
    time.sleep(0.5)
    # The pid is runuser's or the postmaster's; the bench counts the
    # processes below it (the backends) too.
    return f"postgres://root@127.0.0.1:{port}/postgres", p.pid


def start_etcd():
    port, peer = free_port(), free_port()
    d = os.path.join(tmp, "etcd")
    p = spawn("etcd", ["etcd", "--name", "bench", "--data-dir", d,
                   "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
                   "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                   "--initial-cluster", f"bench=http://127.0.0.1:{peer}"])
    wait("etcd", lambda: b"true" in urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read())
    return f"etcd://127.0.0.1:{port}", p.pid


def start_etcd_cluster(n=3):
    ports = [(free_port(), free_port()) for _ in range(n)]
    initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
    for i, (port, peer) in enumerate(ports):
        spawn(f"etcd-m{i}", ["etcd", "--name", f"m{i}", "--data-dir", os.path.join(tmp, f"etcd-m{i}"),
                             "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", initial, "--initial-cluster-state", "new"])
    for port, _ in ports:
        wait("etcd member", lambda: b"true" in urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read())
    return "etcd://" + ",".join(f"127.0.0.1:{port}" for port, _ in ports), None


def start_leaseholdd_cluster(n=3):
    addrs = [f"127.0.0.1:{free_port()}" for _ in range(n)]
    peers = ",".join(f"{i + 1}={a}" for i, a in enumerate(addrs))
    for i, a in enumerate(addrs):
        spawn(f"leaseholdd-node{i + 1}", [LEASEHOLDD, "--node-id", str(i + 1), "--listen", a, "--peers", peers,
                                          "--data-dir", os.path.join(tmp, f"leasehold-node{i + 1}")])

    def leads():
        return any(b'"leader":true' in urllib.request.urlopen(f"http://{a}/health", timeout=1).read() for a in addrs)
    wait("a leaseholdd leader", leads)
    return "http://" + ",".join(addrs), None


def start_leaseholdd(data=None, port=None):
    port = port or free_port()
    data = data or os.path.join(tmp, "leasehold-data")
    p = spawn("leaseholdd", [LEASEHOLDD, "--listen", f"127.0.0.1:{port}", "--data-dir", data])
    wait("leaseholdd", lambda: b'"leader":true' in urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read())
    return f"http://127.0.0.1:{port}", p, data, port


def bench(url, workload, clients, extra=(), seconds=None):
    args = [LEASEHOLD, "--endpoint", url, "bench", "--workload", workload, "--clients", str(clients),
            "--duration", f"{seconds or SECS}s", "--json", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-300:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def median_of(runs):
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"]}
    rates = [r["ops_per_sec"] for r in ok]
    med = sorted(ok, key=lambda r: r["ops_per_sec"])[len(ok) // 2]
    med = dict(med)
    med["runs"] = rates
    med["spread_pct"] = 100 * (max(rates) - min(rates)) / statistics.median(rates) if len(rates) > 1 else 0.0
    return med


def main():
    subprocess.run(["cargo", "build", "--release", "--bin", "leasehold", "--bin", "leaseholdd"], cwd=ROOT, check=True)
    lh_url, lh_proc, lh_data, lh_port = start_leaseholdd()
    starters = [
        ("leaseholdd", "leaseholdd", lambda: (lh_url, lh_proc.pid)),
        ("leaseholdd-3", "leaseholdd (3 nodes)", start_leaseholdd_cluster),
        ("redis-always", "redis (appendfsync always)", lambda: start_redis(True)),
        ("redis-none", "redis (no persistence)", lambda: start_redis(False)),
        ("postgres", "postgres", start_postgres),
        ("etcd", "etcd", start_etcd),
        ("etcd-3", "etcd (3 members)", start_etcd_cluster),
    ]
    wanted = os.environ.get("STORES", "").split(",") if os.environ.get("STORES") else [k for k, _, _ in starters]
    stores = [(name, start()) for key, name, start in starters if key in wanted or key == "leaseholdd"]
    pids = {name: pid for name, (_, pid) in stores}
    stores = [(name, url) for name, (url, _) in stores]
    cells = [("cycle", 50), ("cycle", 200), ("cycle", 1), ("contended", 50)]
    if os.environ.get("CELLS"):
        # e.g. CELLS=cycle:50,cycle:200,cycle:1
        cells = [(w, int(c)) for w, c in (x.split(":") for x in os.environ["CELLS"].split(","))]
    # Runs are interleaved (run 1 of every store, then run 2, ...) so that a
    # slow spell of the machine falls on every store, not on one.
    runs = {(name, w, c): [] for name, _ in stores for w, c in cells}
    for workload, clients in cells:
        for i in range(RUNS):
            for name, url in stores:
                print(f"{name}: {workload} x{clients} run {i + 1}/{RUNS} ...", flush=True)
                runs[(name, workload, clients)].append(bench(url, workload, clients))
    results = {key: median_of(r) for key, r in runs.items()}

    keep = {}
    for name, url in stores:
        if pids[name] is None:
            continue  # a cluster: its CPU is spread over processes the figure does not sum
        print(f"{name}: keep {KEEP_LOCKS} locks for {KEEP_SECS} s ...", flush=True)
        keep[name] = bench(url, "keep", 50, ["--keys", str(KEEP_LOCKS), "--ttl", f"{KEEP_TTL_S}s",
                                             "--server-pid", str(pids[name])], seconds=KEEP_SECS)

    hold = {}
    if HOLD:
        # On a fresh server, so that the figure is what the locks cost, not
        # what the workloads above left in the heap (their remembered answers,
        # the allocator's free lists).
        lh_proc.terminate()
        lh_proc.wait(30)
        lh_url, lh_proc, lh_data, lh_port = start_leaseholdd(os.path.join(tmp, "leasehold-hold"))
        print(f"leaseholdd: hold {HOLD} locks ...", flush=True)
        hold = bench(lh_url, "hold", 50, ["--keys", str(HOLD), "--ttl", "10m", "--server-pid", str(lh_proc.pid)])
        lh_proc.terminate()
        lh_proc.wait(30)
        t = time.time()
        _, lh_proc, _, _ = start_leaseholdd(lh_data, lh_port)
        hold["restart_seconds"] = time.time() - t
        rss = open(f"/proc/{lh_proc.pid}/status").read().split("VmRSS:")[1].split()[0]
        hold["rss_after_restart_bytes"] = int(rss) * 1024

    failover = {}
    if KILLS:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import failover as fo
        for stop in ("kill", "term"):
            what = "kill -9" if stop == "kill" else "SIGTERM (planned restart)"
            print(f"leaseholdd (3 nodes): {KILLS} leader stops by {what} under cycle x50 ...", flush=True)
            try:
                failover[stop] = fo.run(KILLS, 50, log=lambda line: print("  " + line, flush=True), stop=stop)
            except (Exception, SystemExit) as e:
                failover[stop] = {"error": str(e)}

    write_results(stores, cells, results, hold, keep, failover)


def fmt_keep(r, base):
    if "error" in r or "server_cpu_share" not in r:
        return f"| error: {r.get('error', 'no CPU figure')[:80]} | | |"
    share = r["server_cpu_share"]
    b = base.get("server_cpu_share") if base else None
    ratio = f"{share / b:.1f}x" if b else "n/a (below the clock tick)"
    return f"| {100 * share:.2f}% | {ratio} | {r.get('locks_lost', '?')} of {r.get('locks_held', '?'):,} |"


def fmt_cell(r, base):
    if "error" in r:
        return "error"
    ratio = r["ops_per_sec"] / base["ops_per_sec"] if base and "error" not in base and base["ops_per_sec"] else 0
    return f"{r['ops_per_sec']:,.0f}/s, p50 {r['latency_ms']['p50']:.2f} ms, p99 {r['latency_ms']['p99']:.2f} ms ({ratio:.2f}x)"


def fmt_failover(runs):
    lines = []
    for stop, r in runs.items():
        how = "`kill -9`ed" if stop == "kill" else "stopped with SIGTERM (a planned restart)"
        if "error" in r:
            lines.append(f"failover ({stop}): error: {r['error'][:200]}")
            continue
        lines += ["", f"failover (3-node leaseholdd, `bench/failover.py --stop {stop}`): the leader {how} {r['kills']} "
                  f"times under the `cycle` load of {r['load_clients']} clients; from each stop to the first successful "
                  f"acquire at a client: p50 {r['p50_ms']:.0f} ms, max {r['max_ms']:.0f} ms; the longest pause between "
                  f"two successful acquires of a client acquiring without a break: p50 {r['pause_p50_ms']:.0f} ms, "
                  f"max {r['pause_max_ms']:.0f} ms; locks lost by a TTL 2 s holder renewing through each: "
                  f"{r['locks_lost']} of {r['kills']}."]
    return lines


def fmt_cluster_targets(stores, results):
    """The cluster's ratios: 3-node leaseholdd against 3-node etcd and Redis fsync-always."""
    names = [n for n, _ in stores]
    lines = []
    for w, c in (("cycle", 50), ("cycle", 200), ("cycle", 1)):
        lh = results.get(("leaseholdd (3 nodes)", w, c))
        if not lh or "error" in lh:
            continue
        parts = []
        single = results.get(("leaseholdd", w, c))
        if c == 1 and single and "error" not in single:
            parts.append(f"p50 {lh['latency_ms']['p50'] / single['latency_ms']['p50']:.2f}x the single node's")
        for other in ("etcd (3 members)", "redis (appendfsync always)", "leaseholdd"):
            r = results.get((other, w, c))
            if other in names and r and "error" not in r and r["ops_per_sec"]:
                parts.append(f"{lh['ops_per_sec'] / r['ops_per_sec']:.2f}x {other}")
        if parts:
            lines.append(f"3-node leaseholdd, {w} x{c}: " + ", ".join(parts) + ".")
    return ([""] + lines) if lines else []


def write_results(stores, cells, results, hold, keep, failover):
    lines = []
    head = "| store | " + " | ".join(f"{w} x{c}" for w, c in cells) + " |"
    lines += [head, "|" + "---|" * (len(cells) + 1)]
    for name, _ in stores:
        row = [fmt_cell(results[(name, w, c)], results[("leaseholdd", w, c)]) for w, c in cells]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines += ["", f"Keeping {KEEP_LOCKS:,} locks held (50 clients, TTL {KEEP_TTL_S} s, renewed the way each "
              f"backend's client renews) for {KEEP_SECS} s: the server's CPU over that time, as a share of one core "
              "(processes below the server's pid included), and locks lost. Single servers only: a cluster's CPU is spread over "
              "its nodes.", "",
              "| store | server CPU | vs leaseholdd | locks lost |", "|---|---|---|---|"]
    for name, _ in stores:
        if name in keep:
            lines.append(f"| {name} " + fmt_keep(keep[name], keep.get("leaseholdd")))
    lines += fmt_cluster_targets(stores, results) + fmt_failover(failover)
    spread = max((r.get("spread_pct", 0) for r in results.values() if "error" not in r), default=0)
    table = "\n".join(lines)
    print("\n" + table)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    info = [
        f"Date: {datetime.date.today()}",
        f"Machine: {os.cpu_count()} cores ({cpu}), {round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB, {platform.platform()}",
        f"Versions: {version([LEASEHOLDD, '--version'])}; {version(['redis-server', '--version'])}; "
        f"{version([sorted(glob.glob('/usr/lib/postgresql/*/bin'))[-1] + '/postgres', '--version'])}; {version(['etcd', '--version'])}",
        f"Method: {RUNS} runs of {SECS} s per cell, median by ops/s; the largest spread between runs of one cell was {spread:.0f}%.",
        "Cells: ops/s, and latency per op (cycle: acquire + release; contended: release-to-next-grant hand-over). Ratio: ops/s relative to leaseholdd.",
    ]
    hold_lines = []
    if hold and "error" not in hold:
        hold_lines = [
            f"hold (a fresh server): {hold['ops']:,} locks on one lease in {hold['seconds']:.1f} s; server RSS {hold.get('server_rss_bytes', 0) / 2**20:.0f} MiB "
            f"({hold.get('server_rss_bytes', 0) / 1e6:.0f} MB) "
            f"({hold.get('bytes_per_held_lock', 0):.0f} bytes per held lock); restart with them: {hold['restart_seconds']:.1f} s "
            f"(RSS after restart {hold['rss_after_restart_bytes'] / 2**20:.0f} MiB)."
        ]
    out = os.path.join(ROOT, "bench", "results.md")
    with open(out, "w") as f:
        f.write("# Benchmark results\n\nProduced by `python3 bench/compare.py`.\n\n")
        f.write("\n".join(f"- {l}" for l in info) + "\n\n" + table + "\n\n")
        if hold_lines:
            f.write("\n".join(hold_lines) + "\n")
        notes = os.path.join(ROOT, "bench", "notes.md")
        if os.path.exists(notes):
            f.write("\n" + open(notes).read())
    with open(os.path.join(ROOT, "bench", "results.json"), "w") as f:
        json.dump({"info": info, "cells": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in results.items()}, "hold": hold,
                   "keep": keep, "failover": failover}, f, indent=1)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: (stop_all(), sys.exit(1)))
    try:
        main()
    finally:
        stop_all()
