#!/usr/bin/env python3
"""What a million held locks cost one leaseholdd: memory, and restarts.

Starts a fresh leaseholdd (release build) with its data dir in a temp dir,
holds HOLD_LOCKS locks on one lease (`leasehold bench --workload hold`), then
stops it (SIGTERM) and starts it again RESTARTS times. Reports the server's
RSS after the hold and after each restart (once it serves, and again a
second later), the time from start to serving (`/health` says leader), the
size of the snapshot file, and how many locks the node holds after each
restart (every one must be back).

    python3 bench/memory.py                        # 1,000,000 locks, 3 restarts
    HOLD_LOCKS=200000 RESTARTS=1 python3 bench/memory.py

Figures are of this machine at the time of the run: compare runs made in one
session, never absolute numbers across days.
"""
import json, os, re, subprocess, sys, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare as c  # noqa: E402  (its helpers: spawn, start_leaseholdd, bench)

HOLD = int(os.environ.get("HOLD_LOCKS", 1_000_000))
RESTARTS = int(os.environ.get("RESTARTS", 3))


def rss(pid):
    status = open(f"/proc/{pid}/status").read()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def locks_held(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(r"^leasehold_locks_held(?:\{[^}]*\})? (\d+)", text, re.M)
    return int(m.group(1)) if m else None


def mib(n):
    return f"{n / 2**20:.0f} MiB"


def main():
    subprocess.run(["cargo", "build", "--release", "--bin", "leasehold", "--bin", "leaseholdd"],
                   cwd=c.ROOT, check=True)
    data = os.path.join(c.tmp, "memory")
    _, proc, data, port = c.start_leaseholdd(data)
    url = f"http://127.0.0.1:{port}"
    print(f"holding {HOLD:,} locks on one lease ...", flush=True)
    hold = c.bench(url, "hold", 50, ["--keys", str(HOLD), "--ttl", "30m", "--server-pid", str(proc.pid)])
    if "error" in hold:
        raise SystemExit(f"hold failed: {hold['error']}")
    rows = [("after the hold", rss(proc.pid), None, None, locks_held(port))]
    for i in range(RESTARTS):
        proc.terminate()
        proc.wait(60)
        started = time.time()
        _, proc, _, _ = c.start_leaseholdd(data, port)
        serving = time.time() - started
        at_serving = rss(proc.pid)
        time.sleep(1)
        rows.append((f"restart {i + 1}", at_serving, rss(proc.pid), serving, locks_held(port)))
    snapshot = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)
                   if f.startswith("snapshot"))

    print(f"\n{HOLD:,} locks held on one lease; snapshot file {mib(snapshot)}\n")
    print("| | RSS when serving | RSS 1 s later | start to serving | locks held |")
    print("|---|---|---|---|---|")
    for what, first, later, serving, held in rows:
        print(f"| {what} | {mib(first)} | {mib(later) if later else ''} | "
              f"{f'{serving:.2f} s' if serving is not None else ''} | {held:,} |"
              if held is not None else f"| {what} | {mib(first)} | | | ? |")
    print(json.dumps({"hold": hold, "rows": rows, "snapshot_bytes": snapshot}))


if __name__ == "__main__":
    try:
        main()
    finally:
        c.stop_all()
