"""Leader election on a lock: campaign, observe, proclaim, resign.

An election is a key. Candidates wait in its FIFO queue; the one holding it
leads while its lease lives, and its fencing token is the leadership's term.
The leader's value is the key's checkpoint, saved under the leader's own
token, so observers never mistake the previous leader's value for the new
one's::

    election = client.election("scheduler")
    with election.campaign("node-3:9000", ttl=15) as leadership:
        run_scheduler(fence=leadership.token())

    for leader in election.observe():      # None while nobody leads
        print(leader.value if leader else "(none)")
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, Iterator, Optional, Protocol, Union

from . import errors
from ._core import Watching, WatchEvent


# What an election needs of a client and its leases. The clients import this
# module (``Client.election``), so it names them only by what they do.


class Lease(Protocol):
    lost: Any

    def token(self) -> int: ...

    def save_checkpoint(self, data: Union[str, bytes]) -> None: ...

    def release(self) -> None: ...

    def __exit__(self, *exc: Any) -> Any: ...


class Client(Protocol):
    endpoints: Any

    def lock(self, key: str, ttl: float, wait: Optional[float] = None) -> Any: ...

    def describe(self, key: str) -> Dict[str, Any]: ...

    def _watch(self, watching: Watching) -> Iterator[Optional[WatchEvent]]: ...


class AsyncLease(Protocol):
    lost: Any

    def token(self) -> int: ...

    async def save_checkpoint(self, data: Union[str, bytes]) -> None: ...

    async def release(self) -> None: ...

    async def __aexit__(self, *exc: Any) -> Any: ...


class AsyncClient(Protocol):
    endpoints: Any

    async def lock(self, key: str, ttl: float, wait: Optional[float] = None) -> Any: ...

    async def describe(self, key: str) -> Dict[str, Any]: ...

    def _watch(self, watching: Watching) -> AsyncIterator[Optional[WatchEvent]]: ...


@dataclass(frozen=True)
class Leader:
    """Who leads: the proclaimed value, the leader's token and holder name."""

    raw: bytes
    fence: int
    holder: str

    @property
    def value(self) -> str:
        return self.raw.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return f"Leader(value={self.value!r}, fence={self.fence}, holder={self.holder!r})"


class Leadership:
    """This process leads: a lease on the election's key."""

    def __init__(self, lease: "Lease") -> None:
        self.lease = lease

    def token(self) -> int:
        """The leadership's fencing token; raises LeaseLost once it is lost."""
        return self.lease.token()

    @property
    def lost(self):
        """A ``threading.Event`` set when the leadership is lost."""
        return self.lease.lost

    def proclaim(self, value: Union[str, bytes]) -> None:
        """Changes the value observers see, without a new election."""
        self.lease.save_checkpoint(value)

    def resign(self) -> None:
        """Steps down: the next candidate in line leads."""
        self.lease.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.lease.__exit__(*exc)


class Election:
    """The election ``name`` over a client; see :meth:`Client.election`."""

    def __init__(self, client: "Client", name: str) -> None:
        self.client = client
        self.name = name

    def campaign(self, value: Union[str, bytes], ttl: float = 15, *, wait: Optional[float] = None) -> Leadership:
        """Waits in line until this candidate leads (up to ``wait`` seconds;
        ``None``: however long it takes), then proclaims ``value``."""
        while True:
            try:
                lease = self.client.lock(self.name, ttl, wait=wait if wait else 3600)
                break
            except errors.WaitTimeout:
                if wait:
                    raise
        try:
            lease.save_checkpoint(value)
        except BaseException:
            try:
                lease.release()
            except errors.LeaseholdError:
                pass
            raise
        return Leadership(lease)

    def leader(self) -> Optional[Leader]:
        """Who leads now, if the key's holder has proclaimed."""
        return _leader_of(self.client.describe(self.name))

    def observe(self) -> Iterator[Optional[Leader]]:
        """The leader now, then every change: a :class:`Leader` when one
        proclaims (a new leader, or a new value), ``None`` when the leader
        goes. Runs until the generator is closed. It outlives the node it
        streams from (the watch goes on elsewhere, missing nothing); should
        events be lost all the same (``watch_behind``), it reads the election
        again and reports the leader then, if it changed."""
        observing = _Observing(self.name)
        while True:
            try:
                for event in self.client._watch(observing.watching):
                    if event is not None:
                        change = observing.event(event)
                    elif observing.must_read():
                        change = observing.read(self.client.describe(self.name))
                    else:
                        continue
                    if change is not _NOTHING:
                        yield change
            except errors.WatchBehind:
                observing.behind()


class AsyncElection:
    """The election ``name`` over an :class:`~leasehold.AsyncClient`; the same
    rules as :class:`Election`."""

    def __init__(self, client: "AsyncClient", name: str) -> None:
        self.client = client
        self.name = name

    async def campaign(self, value: Union[str, bytes], ttl: float = 15, *, wait: Optional[float] = None) -> "AsyncLeadership":
        while True:
            try:
                lease = await self.client.lock(self.name, ttl, wait=wait if wait else 3600)
                break
            except errors.WaitTimeout:
                if wait:
                    raise
        try:
            await lease.save_checkpoint(value)
        except BaseException:
            try:
                await lease.release()
            except errors.LeaseholdError:
                pass
            raise
        return AsyncLeadership(lease)

    async def leader(self) -> Optional[Leader]:
        return _leader_of(await self.client.describe(self.name))

    async def observe(self) -> AsyncIterator[Optional[Leader]]:
        """See :meth:`Election.observe`."""
        observing = _Observing(self.name)
        while True:
            try:
                async for event in self.client._watch(observing.watching):
                    if event is not None:
                        change = observing.event(event)
                    elif observing.must_read():
                        change = observing.read(await self.client.describe(self.name))
                    else:
                        continue
                    if change is not _NOTHING:
                        yield change
            except errors.WatchBehind:
                observing.behind()


class AsyncLeadership:
    """This task leads: a lease on the election's key."""

    def __init__(self, lease: "AsyncLease") -> None:
        self.lease = lease

    def token(self) -> int:
        return self.lease.token()

    @property
    def lost(self):
        """An ``asyncio.Event`` set when the leadership is lost."""
        return self.lease.lost

    async def proclaim(self, value: Union[str, bytes]) -> None:
        await self.lease.save_checkpoint(value)

    async def resign(self) -> None:
        await self.lease.release()

    async def __aenter__(self) -> "AsyncLeadership":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.lease.__aexit__(*exc)


class _Observing:
    """One election followed through its watch events: what both clients'
    ``observe`` do, with the I/O left to them. Tokens only grow, so an event
    older than what is known (from before the state was read) changes
    nothing. The state is read when a stream opens: the first time, and
    after events were lost (``watch_behind``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: Where the watch stands; a fresh one after events were lost.
        self.watching = Watching(name)
        self.holder: Optional[int] = None
        self.last: Optional[Leader] = None
        self._read = False
        self._stale = False

    def must_read(self) -> bool:
        """A stream opened: whether the election must be read now."""
        return not self._read or self._stale

    def read(self, view: Dict[str, Any]) -> Any:
        """The election as ``describe`` shows it; what to report: the leader
        the first time, then only a change."""
        leader = _leader_of(view)
        first = not self._read
        self._read, self._stale = True, False
        self.holder = (view.get("holder") or {}).get("fence")
        if not first and leader == self.last:
            return _NOTHING
        self.last = leader
        return leader

    def behind(self) -> None:
        """Events were lost: watch from now, and read the election again."""
        self.watching = Watching(self.name)
        self._stale = True

    def event(self, event: WatchEvent) -> Any:
        """One event; the change it makes, or ``_NOTHING``."""
        if event.key != self.name or not self._read:
            return _NOTHING
        fence = event.fence
        change: Any = _NOTHING
        if event.kind == "acquired" and (self.holder is None or fence > self.holder):
            self.holder, change = fence, None
        elif event.kind in ("released", "expired") and fence == self.holder:
            self.holder, change = None, None
        elif event.kind == "checkpoint" and fence == self.holder and event.data:
            change = Leader(event.data, fence, event.holder)
        if change is _NOTHING or change == self.last:
            return _NOTHING
        self.last = change
        return change


_NOTHING = object()


def _leader_of(view: Dict[str, Any]) -> Optional[Leader]:
    holder = view.get("holder") or {}
    fence = holder.get("fence")
    if fence is None or view.get("checkpoint_fence") != fence or "checkpoint_base64" not in view:
        return None
    return Leader(base64.b64decode(view["checkpoint_base64"]), int(fence), str(holder.get("holder", "")))
