#!/usr/bin/env python3
"""One token flooding a leaseholdd, beside well-behaved clients.

Starts a release `leaseholdd` with quotas (lease, lock and rate limits
per token; the role `good` has room of its own), turns auth on and makes two
tokens: `good` and `flood`. Then, in rounds, interleaved:

- **alone**: the good token's 50 clients run `cycle`, and its holders keep
  HOLD locks of TTL 2 s renewing (`keep`, renewed at TTL/3);
- **flooded**: the same, while the flood token runs `cycle` with 200
  clients and `keep` on a million keys with 50 clients (a lease each, as
  fast as it can; stopped at the end of the round, since its refusals are
  held back and it would take hours to ask for them all).

For each it reports the good clients' cycle rate and p99, the locks the
good holders lost (must be 0), what the flood was refused, the node's peak
live leases and held locks, and its peak RSS. Stops exactly the processes
it started.

    cargo build --release --bin leaseholdd --bin leasehold
    python3 bench/flood.py [--rounds 3] [--seconds 10] [--json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from failover import call, free_port, wait_leading  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "leaseholdd")
CLI = os.path.join(ROOT, "target", "release", "leasehold")
HOLD = 200
# The flood's own leases: long enough to outlive a round, gone before the
# next one once its client is stopped.
FLOOD_TTL = 5
# The flood token's limits (the flags' defaults for every token), and the
# good role's own.
FLAGS = ["--max-leases-per-token", "10000", "--max-locks-per-token", "20000", "--rate-limit", "2000",
         "--role-quota", "good=leases:100000,locks:100000,rate:1000000"]


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) * 1024


def token(addr, root, role):
    rules = {"rules": [{"prefix": "", "permission": "lock"}]}
    req = {"Authorization": f"Bearer {root}"}
    s, r = call_as(addr, "PUT", f"/v1/auth/roles/{role}", rules, req)
    assert s == 200, r
    s, r = call_as(addr, "POST", "/v1/auth/tokens", {"name": role, "role": role}, req)
    assert s == 200, r
    return r["token"]


def call_as(addr, method, path, body, headers):
    import urllib.request
    import urllib.error
    data = json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method=method,
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def bench(url, tok, workload, clients, seconds, extra=()):
    args = [CLI, "--endpoint", url, "--token", tok, "bench", "--workload", workload, "--clients", str(clients),
            "--duration", f"{seconds}s", "--json", *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p):
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        return {"error": err.strip()[-300:]}
    return json.loads(out.strip().splitlines()[-1])


def round_(url, pid, good, flood, seconds, flooded):
    procs = {
        "cycle": bench(url, good, "cycle", 50, seconds),
        "keep": bench(url, good, "keep", 10, seconds, ["--keys", str(HOLD), "--ttl", "2s"]),
    }
    if flooded:
        procs["flood_cycle"] = bench(url, flood, "cycle", 200, seconds)
        procs["flood_keep"] = bench(url, flood, "keep", 50, seconds, ["--keys", "1000000", "--ttl", f"{FLOOD_TTL}s"])
    peak = {"rss": 0, "leasehold_leases": 0, "leasehold_locks_held": 0}
    done = threading.Event()
    addr = url.removeprefix("http://")

    def sample():
        while not done.is_set():
            try:
                peak["rss"] = max(peak["rss"], rss(pid))
                for name, value in gauges(addr).items():
                    peak[name] = max(peak[name], value)
            except OSError:
                return
            time.sleep(0.2)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    if flooded:
        # The flood's keep is still asking for its keys: stop it with the round.
        stop = threading.Timer(seconds + 2, procs["flood_keep"].kill)
        stop.start()
    out = {name: result(p) for name, p in procs.items()}
    done.set()
    t.join()
    out["rss_peak"] = peak["rss"]
    out["leases_peak"] = peak["leasehold_leases"]
    out["locks_peak"] = peak["leasehold_locks_held"]
    if flooded:
        stop.cancel()
        time.sleep(FLOOD_TTL + 1)  # the flood's leases expire before the next round
    return out


def gauges(addr):
    """The node's live leases and held locks, from /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=2) as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("leasehold_leases", "leasehold_locks_held"):
            found[name] = float(value)
    return found


def refused(r):
    return sum(n for e, n in (r.get("errors") or {}).items() if "resource" in e.lower() or "limit" in e.lower())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for b in (BIN, CLI):
        if not os.path.exists(b):
            raise SystemExit("build first: cargo build --release --bin leaseholdd --bin leasehold")
    workdir = tempfile.mkdtemp(prefix="leasehold-flood-")
    addr = f"127.0.0.1:{free_port()}"
    log = open(os.path.join(workdir, "leaseholdd.log"), "ab")
    server = subprocess.Popen([BIN, "--listen", addr, "--data-dir", os.path.join(workdir, "data"), *FLAGS],
                              stdout=log, stderr=log)
    try:
        wait_leading(addr)
        s, r = call(addr, "POST", "/v1/auth/enable")
        assert s == 200, r
        root = r["token"]
        good, flood = token(addr, root, "good"), token(addr, root, "flood")
        url = f"http://{addr}"
        rounds = {"alone": [], "flooded": []}
        for k in range(args.rounds):
            for kind in ("alone", "flooded"):
                r = round_(url, server.pid, good, flood, args.seconds, kind == "flooded")
                rounds[kind].append(r)
                c, kp = r["cycle"], r["keep"]
                line = (f"round {k + 1} {kind}: good cycle {c.get('ops_per_sec', 0):.0f}/s, "
                        f"p99 {c.get('latency_ms', {}).get('p99', 0):.2f} ms; good holders lost "
                        f"{kp.get('locks_lost')} of {kp.get('locks_held')}; node peak {r['leases_peak']:.0f} leases, "
                        f"{r['locks_peak']:.0f} locks, RSS {r['rss_peak'] / 2**20:.0f} MiB")
                if kind == "flooded":
                    fc = r["flood_cycle"]
                    line += f"; flood: cycle {fc.get('ops_per_sec', 0):.0f}/s with {refused(fc)} refused"
                print(line, file=sys.stderr)
        summary = {}
        for kind, rs in rounds.items():
            summary[kind] = {
                "good_cycle_per_sec": statistics.median(r["cycle"].get("ops_per_sec", 0) for r in rs),
                "good_cycle_p99_ms": statistics.median(r["cycle"].get("latency_ms", {}).get("p99", 0) for r in rs),
                "good_locks_lost": sum(r["keep"].get("locks_lost") or 0 for r in rs),
                "good_locks_held": sum(r["keep"].get("locks_held") or 0 for r in rs),
                "rss_peak_mib": max(r["rss_peak"] for r in rs) / 2**20,
            }
            summary[kind]["leases_peak"] = max(r["leases_peak"] for r in rs)
            summary[kind]["locks_peak"] = max(r["locks_peak"] for r in rs)
            if kind == "flooded":
                summary[kind]["flood_cycle_refused"] = sum(refused(r["flood_cycle"]) for r in rs)
        a, f = summary["alone"], summary["flooded"]
        if args.json:
            print(json.dumps(summary))
        else:
            print(f"good cycle x50: {a['good_cycle_per_sec']:.0f}/s alone, {f['good_cycle_per_sec']:.0f}/s flooded "
                  f"({f['good_cycle_per_sec'] / a['good_cycle_per_sec']:.2f}x); p99 {a['good_cycle_p99_ms']:.2f} ms "
                  f"alone, {f['good_cycle_p99_ms']:.2f} ms flooded; good holders lost {f['good_locks_lost']} of "
                  f"{f['good_locks_held']} while flooded; node peak {f['leases_peak']:.0f} leases and "
                  f"{f['locks_peak']:.0f} locks flooded ({a['leases_peak']:.0f} and {a['locks_peak']:.0f} alone); "
                  f"flood cycle refused {f['flood_cycle_refused']} times; RSS peak {a['rss_peak_mib']:.0f} MiB "
                  f"alone, {f['rss_peak_mib']:.0f} MiB flooded")
        sys.exit(1 if f["good_locks_lost"] or a["good_locks_lost"] else 0)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
