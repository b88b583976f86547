"""The resource's half of fencing: refuse writes with a token lower than the
highest one seen.

For a SQL table, keep the highest token in a column of the row and make the
write conditional on it, in the same statement::

    UPDATE accounts SET balance = %s, fence = %s WHERE id = %s AND fence <= %s

:func:`fenced_update` builds and runs exactly that, and raises
:class:`~leasehold.StaleFence` when the row has seen a newer token (or does not
exist). Use ``<=`` so a holder may write more than once with its own token.
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Sequence

from .errors import StaleFence

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def fence_clause(column: str = "fence", placeholder: str = "%s") -> str:
    """``fence <= %s``: the condition a fenced write adds to its WHERE clause."""
    _ident(column)
    return f"{column} <= {placeholder}"


def fenced_update(
    cursor: Any,
    table: str,
    values: Mapping[str, Any],
    where: Mapping[str, Any],
    fence: int,
    *,
    fence_column: str = "fence",
    placeholder: Optional[str] = None,
) -> int:
    """Runs ``UPDATE table SET values..., fence_column = fence WHERE where... AND
    fence_column <= fence`` on a DB-API cursor and returns the rows changed;
    raises :class:`~leasehold.StaleFence` if none were.

    ``table`` and the column names are identifiers written into the SQL: they
    must come from your code, never from input (they are checked to be plain
    names). Values always go as parameters, in the driver's own style, read
    off the cursor's module (DB-API's ``paramstyle``: ``%s`` for psycopg and
    PyMySQL, ``?`` for sqlite3); ``placeholder`` overrides it.
    """
    for name in [table, fence_column, *values, *where]:
        _ident(name)
    if placeholder is None:
        placeholder = _placeholder_of(cursor)
    sets = [f"{c} = {placeholder}" for c in values] + [f"{fence_column} = {placeholder}"]
    conds = [f"{c} = {placeholder}" for c in where] + [fence_clause(fence_column, placeholder)]
    sql = f"UPDATE {table} SET {', '.join(sets)} WHERE {' AND '.join(conds)}"
    params: Sequence[Any] = [*values.values(), fence, *where.values(), fence]
    cursor.execute(sql, params)
    if cursor.rowcount == 0:
        raise StaleFence(
            f"{table}: no row matched {dict(where)!r} with {fence_column} <= {fence}",
            {"presented_fence": fence},
        )
    return int(cursor.rowcount)


class FenceGate:
    """An in-memory gate: remembers the highest token per resource and
    refuses anything lower. Thread-safe."""

    def __init__(self) -> None:
        self._highest: Dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, resource: str, fence: int) -> None:
        """Admits a write with ``fence``, or raises :class:`~leasehold.StaleFence`."""
        with self._lock:
            current = self._highest.get(resource, 0)
            if fence < current:
                raise StaleFence(
                    f"{resource}: token {fence} is below {current}",
                    {"presented_fence": fence, "current_fence": current},
                )
            self._highest[resource] = fence

    def highest(self, resource: str) -> int:
        with self._lock:
            return self._highest.get(resource, 0)


# DB-API's positional parameter styles, and how each writes one parameter.
_STYLES = {"qmark": "?", "format": "%s", "pyformat": "%s"}


def _placeholder_of(cursor: Any) -> str:
    """The parameter marker of the driver ``cursor`` belongs to: its
    module's ``paramstyle`` (PEP 249), ``%s`` if it says none we can use."""
    module = sys.modules.get(type(cursor).__module__.split(".")[0])
    style = getattr(module, "paramstyle", None)
    return _STYLES.get(str(style), "%s")


def _ident(name: str) -> None:
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not a plain SQL name")
