"""Starts a real leaseholdd for the tests, on a free port with its own data dir.

The binary is ``$LEASEHOLDD``, else the workspace's ``target/debug/leaseholdd``
(``cargo build --bin leaseholdd``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]


_next_port = None


def free_port() -> int:
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


class Server:
    def __init__(self, extra=(), scheme: str = "http", ready=None) -> None:
        binary = os.environ.get("LEASEHOLDD") or str(ROOT / "target" / "debug" / "leaseholdd")
        if not Path(binary).exists():
            pytest.fail(f"{binary} not found: cargo build --bin leaseholdd, or set LEASEHOLDD")
        self.dir = tempfile.TemporaryDirectory(prefix="leasehold-py-")
        self.addr = f"127.0.0.1:{free_port()}"
        self.url = f"{scheme}://{self.addr}"
        self.log = open(Path(self.dir.name) / "server.log", "wb")
        self.proc = subprocess.Popen(
            [binary, "--listen", self.addr, "--data-dir", str(Path(self.dir.name) / "data"), *extra],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        until = time.monotonic() + 20
        while True:
            try:
                if ready is not None:
                    if ready(self):
                        break
                elif httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > until:
                raise RuntimeError(f"leaseholdd did not start: {(Path(self.dir.name) / 'server.log').read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.stop()


class Cluster:
    """Three leaseholdd nodes on this machine, each with its own data dir."""

    def __init__(self) -> None:
        binary = os.environ.get("LEASEHOLDD") or str(ROOT / "target" / "debug" / "leaseholdd")
        self.dir = tempfile.TemporaryDirectory(prefix="leasehold-py-cluster-")
        self.addrs = {n: f"127.0.0.1:{free_port()}" for n in (1, 2, 3)}
        peers = ",".join(f"{n}={a}" for n, a in self.addrs.items())
        self.procs = {}
        for n, addr in self.addrs.items():
            log = open(Path(self.dir.name) / f"node{n}.log", "wb")
            self.procs[n] = subprocess.Popen(
                [binary, "--node-id", str(n), "--listen", addr, "--peers", peers,
                 "--data-dir", str(Path(self.dir.name) / f"d{n}")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = "http://" + ",".join(self.addrs.values())
        until = time.monotonic() + 30
        while self.leader() is None:
            if time.monotonic() > until:
                raise RuntimeError("the cluster elected no leader")
            time.sleep(0.1)

    def leader(self):
        for n, addr in self.addrs.items():
            if self.procs[n].poll() is not None:
                continue
            try:
                health = httpx.get(f"http://{addr}/health", timeout=1).json()
            except (httpx.TransportError, ValueError):
                continue
            if health.get("role") == "leader":
                return n
        return None

    def kill(self, n: int) -> None:
        self.procs[n].kill()
        self.procs[n].wait()

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()
        self.dir.cleanup()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.stop()
