"""docs/openapi.yaml against a real node: the node serves it at
/openapi.json, and schemathesis sends every operation the requests it
generates from it (valid and invalid ones, a thousand and more) and checks
every answer: no 5xx but the documented 503s, every body and status and
content type as documented, no node that panics or stops.

Not checked: that every request the schema allows is accepted (schemathesis'
positive_data_acceptance). JSON Schema cannot say what the server keeps to:
an integer written without a fraction (94.0 is refused), at most 512 bytes
of UTF-8 (not characters). The watch stream is left out: it never ends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[3]


def test_the_node_serves_the_document_it_is_described_by(server):
    served = httpx.get(server.url + "/openapi.json").json()
    assert served["openapi"].startswith("3.1")
    paths = set(served["paths"])
    for route in ["/v1/acquire", "/v1/release", "/v1/leases/{id}/keepalive", "/v1/watch", "/health"]:
        assert route in paths, route


def test_schemathesis_finds_nothing(server):
    st = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
    assert st, "schemathesis is not installed (scripts/test-python installs it)"
    # Auth on, with the root token for every request: calls that need admin
    # are answered, not refused.
    root = httpx.post(server.url + "/v1/auth/enable").json()["token"]
    headers = {"authorization": f"Bearer {root}"}
    lease = httpx.post(server.url + "/v1/leases", json={"ttl_ms": 600000, "holder": "seed"}, headers=headers).json()
    httpx.post(server.url + "/v1/acquire", json={"key": "seed", "lease": lease["lease"]}, headers=headers)
    run = subprocess.run(
        [st, "run", server.url + "/openapi.json",
         "--checks", "all", "--exclude-checks", "positive_data_acceptance",
         "--exclude-path", "/v1/watch",
         "--exclude-operation-id", "enableAuth", "--exclude-operation-id", "disableAuth",
         "--max-examples", os.environ.get("LEASEHOLD_SCHEMATHESIS_EXAMPLES", "40"),
         "--workers", "1", "--seed", "1",
         "-H", f"Authorization: Bearer {root}"],
        capture_output=True, text=True, timeout=600,
    )
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert server.proc.poll() is None, "the node stopped"
    log = (Path(server.dir.name) / "server.log").read_text()
    assert "panicked" not in log, log[-4000:]
    # And it still serves.
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
