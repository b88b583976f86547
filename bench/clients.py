#!/usr/bin/env python3
"""Each client's `cycle` rate and CPU, against one node.

Starts a release `leaseholdd` single node (temporary data dir) and runs,
interleaved in rounds, the `cycle` workload (take a free key, release it)
from 50 concurrent users of each client: Rust (`leasehold bench`, over its
framed protocol), Python (`clients/python/bench/cycle.py`, asyncio), Go
(`clients/go/bench/cycle`) and TypeScript (`clients/typescript/bench/cycle.mjs`),
the last three over HTTP/JSON. For each it reports the median cycles/s, its
ratio to the Rust client's, and the client process's CPU time (user +
system, from the kernel's accounting of the child) per cycle, and its ratio
to Rust's. Stops exactly the processes it started.

    cargo build --release --bin leaseholdd --bin leasehold
    scripts/prepare-clients
    python3 bench/clients.py [--rounds 3] [--seconds 5] [--clients 50] [--json]
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile

import failover

ROOT = failover.ROOT
PYTHON = os.path.join(ROOT, "target", "python-venv", "bin", "python")


def go_binary(tmp):
    exe = os.path.join(tmp, "cycle-go")
    subprocess.run(["go", "build", "-o", exe, "./bench/cycle"], cwd=os.path.join(ROOT, "clients", "go"), check=True,
                   env={**os.environ, "GOFLAGS": "-mod=mod", "GOPROXY": "off"})
    return exe


def commands(url, clients, seconds, go):
    return {
        "rust": [failover.CLI, "--endpoint", url, "--holder", "bench-rust", "bench", "--workload", "cycle",
                 "--clients", str(clients), "--duration", f"{seconds}s", "--json"],
        "python": [PYTHON, os.path.join(ROOT, "clients", "python", "bench", "cycle.py"), "--endpoint", url,
                   "--clients", str(clients), "--seconds", str(seconds), "--json"],
        "go": [go, "--endpoint", url, "--clients", str(clients), "--seconds", str(seconds)],
        "typescript": ["node", os.path.join(ROOT, "clients", "typescript", "bench", "cycle.mjs"), "--endpoint", url,
                       "--clients", str(clients), "--seconds", str(seconds)],
    }


def measure(cmd):
    """Runs one client; its JSON line, and its CPU seconds (user + system)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    out, err = p.stdout.read(), p.stderr.read()
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]}: exit {p.returncode}: {err[-500:]}")
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    r = json.loads(line)
    cycles = r.get("cycles") or r.get("ops") or 0
    rate = r.get("per_second") or r.get("ops_per_sec") or 0
    return cycles, rate, usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        addr = f"127.0.0.1:{failover.free_port()}"
        log = open(os.path.join(tmp, "node.log"), "ab")
        node = subprocess.Popen([failover.BIN, "--listen", addr, "--data-dir", os.path.join(tmp, "data")],
                                stdout=log, stderr=log)
        try:
            failover.wait_leading(addr)
            cmds = commands("http://" + addr, a.clients, a.seconds, go_binary(tmp))
            runs = {name: [] for name in cmds}
            for r in range(a.rounds):
                for name, cmd in cmds.items():
                    cycles, rate, cpu = measure(cmd)
                    runs[name].append((rate, cpu / max(cycles, 1) * 1e6))
                    if not a.json:
                        print(f"round {r + 1} {name}: {rate:.0f} cycles/s, {cpu / max(cycles, 1) * 1e6:.1f} µs CPU a cycle")
        finally:
            node.send_signal(signal.SIGKILL)
            node.wait()
    rust_rate = statistics.median(x[0] for x in runs["rust"])
    rust_cpu = statistics.median(x[1] for x in runs["rust"])
    table = {}
    for name, xs in runs.items():
        rate = statistics.median(x[0] for x in xs)
        cpu = statistics.median(x[1] for x in xs)
        table[name] = {"per_second": round(rate), "rate_vs_rust": round(rate / rust_rate, 2),
                       "cpu_us_per_cycle": round(cpu, 1), "cpu_vs_rust": round(cpu / rust_cpu, 2)}
    if a.json:
        print(json.dumps(table))
        return
    print(f"\ncycle x{a.clients} against one release node, {a.rounds} interleaved rounds of {a.seconds} s, medians:")
    print("| client | cycles/s | vs Rust | client CPU per cycle | vs Rust |")
    print("|---|---|---|---|---|")
    for name, t in table.items():
        print(f"| {name} | {t['per_second']} | {t['rate_vs_rust']}x | {t['cpu_us_per_cycle']} µs | {t['cpu_vs_rust']}x |")


if __name__ == "__main__":
    main()
