"""Every ```python block of the README.md pages, run against a real node.

Each block runs in a namespace of its own that holds what the pages use
without showing it (``write``, ``batches``, ``cursor``, a live ``lease`` ...),
with the node's address in place of the default one. A block with
``await`` runs inside a coroutine. A block that follows a stream for as long
as it is read (``observe()``, ``watch()``) must still be running, having
raised nothing, after a few seconds; every other block must finish.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import textwrap
import threading
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

import leasehold

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", ROOT / "clients" / "python" / "README.md"]


def _blocks() -> List[Tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


class _Done:
    """What ``write`` returns: nothing to wait for, awaited or not."""

    def __await__(self):
        return iter(())


class _Cursor:
    """A DB-API cursor over SQLite that reads ``%s`` as ``?``, for the pages'
    PostgreSQL-style statements."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence INTEGER)")
        self.db.execute("INSERT INTO accounts VALUES (1, 100, 0)")
        self._cursor = self.db.cursor()

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self._cursor.execute(sql.replace("%s", "?"), params)

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount


def _namespace(server, client: leasehold.Client) -> Dict[str, Any]:
    written: List[Any] = []
    return {
        "leasehold": leasehold,
        "client": client,
        "lease": client.lock("docs/held-for-the-examples", ttl=30),
        "batches": [1, 2, 3],
        "batch": 1,
        "write": lambda *args, **kwargs: (written.append((args, kwargs)), _Done())[1],
        "call_api": lambda token: written.append(token),
        "run_scheduler": lambda fence: written.append(fence),
        "cursor": _Cursor(),
    }


@pytest.mark.parametrize("where,code", _blocks(), ids=[w for w, _ in _blocks()])
def test_the_pages_python_runs(server, where: str, code: str) -> None:
    code = code.replace("http://127.0.0.1:7419", server.url)
    client = leasehold.Client(server.url)
    namespace = _namespace(server, client)
    if "await " in code or "async with" in code or "async for" in code:
        code = "async def __block():\n" + textwrap.indent(code, "    ") + "\n__run(__block())\n"
        namespace["__run"] = asyncio.run
    failure: List[BaseException] = []

    def run() -> None:
        try:
            exec(compile(code, where, "exec"), namespace)
        except BaseException as e:  # reported below, with the block
            failure.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(3.0)
    if failure:
        raise AssertionError(f"{where} raised {failure[0]!r}:\n{code}") from failure[0]
    follows = "observe()" in code or ".watch(" in code
    if runner.is_alive():
        assert follows, f"{where} did not finish within 3 s:\n{code}"
    else:
        assert not follows, f"{where} stopped following its stream:\n{code}"


def test_every_code_in_the_readmes_table_has_its_own_class() -> None:
    """The README's table of error codes against the Python client: each
    code becomes its own exception class, with its code and details."""
    table = (ROOT / "README.md").read_text().split("| code | HTTP | what happened |", 1)[1]
    codes = []
    for row in table.split("\n\n", 1)[0].splitlines()[2:]:
        codes += re.findall(r"`([a-z_]+)`", row.split("|")[1])
    assert len(codes) >= 19, codes
    from leasehold.errors import from_body

    for code in codes:
        err = from_body(400, {"error": {"code": code, "message": "m", "holder": "h"}})
        assert type(err) is not leasehold.LeaseholdError, f"{code} has no class of its own"
        assert isinstance(err, leasehold.LeaseholdError)
        assert (err.code, err.message, err.holder) == (code, "m", "h")
