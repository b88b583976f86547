"""The asyncio client: :class:`AsyncClient` and its :class:`AsyncLease`.

The same rules as the blocking client; renewal runs as a task on the loop::

    async with leasehold.AsyncClient("http://127.0.0.1:7419") as client:
        async with await client.lock("nightly", ttl=30) as lease:
            await write(lease.token())
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.parse
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple, Union

import httpx

from . import errors
from .election import AsyncElection
from . import _steps as steps
from ._core import (
    MAYBE_DONE,
    Cert,
    Clock,
    LeaseState,
    Number,
    Retry,
    Settings,
    Watching,
    WatchEvent,
    checkpoint_of,
    outcome,
    request_id,
    resumable,
    transport_error,
)


class AsyncLease(LeaseState):
    """A held lock that renews itself every TTL/3 in a task; see
    :class:`leasehold.Lease`. :attr:`lost` is an :class:`asyncio.Event`."""

    def __init__(
        self,
        client: "AsyncClient",
        key: str,
        lease_id: int,
        fence: int,
        clock: Clock,
        checkpoint: Optional[bytes],
        key_count: int = 1,
    ) -> None:
        super().__init__(key, lease_id, fence, clock, checkpoint, key_count, asyncio.Event())
        self._client = client
        self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def save_checkpoint(self, data: Union[bytes, str]) -> None:
        await self._client._run(steps.save_checkpoint(self, data))

    async def release(self) -> None:
        """Stops renewing, then ends the lease, releasing the lock; raises
        :class:`~leasehold.LeaseLost` if it was lost before."""
        if self._released:
            return
        self._released = True
        self._renewer.cancel()
        try:
            await self._renewer
        except asyncio.CancelledError:
            pass
        await self._client._run(steps.release(self))

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await self.release()
        except errors.LeaseLost:
            if exc_type is None:
                raise

    async def _renew(self) -> None:
        await self._client._run(steps.renew(self, len(self._client.endpoints.urls) > 1))


#: Connections for the calls that answer at once (see AsyncClient).
QUICK_CONNECTIONS = 8


class AsyncClient:
    """The asyncio form of :class:`leasehold.Client`; the same arguments."""

    def __init__(
        self,
        url: Union[str, List[str], None] = None,
        *,
        holder: Optional[str] = None,
        token: Optional[str] = None,
        timeout: float = 5.0,
        retry: Optional[Retry] = None,
        verify: Union[bool, str, ssl.SSLContext] = True,
        cert: Optional[Cert] = None,
    ) -> None:
        s = Settings.of(url, holder, token, timeout, retry, verify, cert)
        self.endpoints, self.holder, self.timeout, self.retry = s.endpoints, s.holder, s.timeout, s.retry
        # Calls that answer at once share a few connections: httpcore's pool
        # scans every connection for every queued request, and at 50
        # concurrent calls that scan was most of the client's CPU. Waits and
        # watches, which hold a connection for long, have a pool of their
        # own, so a renewal never queues behind them.
        quick = httpx.Limits(max_connections=QUICK_CONNECTIONS, max_keepalive_connections=QUICK_CONNECTIONS)
        self._http = httpx.AsyncClient(headers=s.headers, verify=s.verify, limits=quick)
        self._long = httpx.AsyncClient(headers=s.headers, verify=s.verify)

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._long.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def try_lock(
        self,
        key: str,
        ttl: Number = 15,
        *,
        lock_delay: Number = 0,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> AsyncLease:
        return await self._acquire(key, ttl, None, lock_delay, shared, permits)

    async def lock(
        self,
        key: str,
        ttl: Number = 15,
        *,
        wait: Optional[Number] = 30,
        lock_delay: Number = 0,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> AsyncLease:
        return await self._acquire(key, ttl, wait or None, lock_delay, shared, permits)

    async def lock_set(self, keys: List[str], ttl: Number = 15, *, wait: Optional[Number] = 30) -> AsyncLease:
        """See :meth:`leasehold.Client.lock_set`."""
        keys = sorted(set(keys))
        return await self._acquire(keys[0] if keys else "", ttl, wait or None, 0, False, None, keys=keys)

    async def semaphore(self, key: str, permits: int, ttl: Number = 15, *, wait: Optional[Number] = 30) -> AsyncLease:
        return await self.lock(key, ttl, wait=wait, permits=permits)

    def election(self, name: str) -> "AsyncElection":
        """The election ``name``: campaign, observe, proclaim, resign."""
        return AsyncElection(self, name)

    async def release_by_fence(self, key: str, fence: int) -> None:
        """See :meth:`leasehold.Client.release_by_fence`."""
        await self._call("POST", "/v1/release", {"key": key, "fence": int(fence), "request_id": request_id()})

    async def describe(self, key: str) -> Dict[str, Any]:
        return await self._call("GET", "/v1/locks/" + urllib.parse.quote(key, safe="/"), None)

    async def watch(self, prefix: str = "", *, after: Optional[Tuple[int, int]] = None) -> AsyncIterator[WatchEvent]:
        """Lock events under ``prefix``; see :meth:`leasehold.Client.watch`."""
        async for event in self._watch(Watching(prefix, after)):
            if event is not None:
                yield event

    async def _watch(self, watching: Watching) -> AsyncIterator[Optional[WatchEvent]]:
        timeout = httpx.Timeout(self.timeout, read=None)
        while True:
            url = self.endpoints.current() + "/v1/watch"
            try:
                async with self._long.stream("GET", url, params=watching.params(), timeout=timeout) as r:
                    if not r.is_success:
                        await r.aread()
                        err = outcome(self.endpoints, r.status_code, False, r.json())
                        if err is not None and not resumable(err):
                            raise err
                        why = str(err)
                    else:
                        watching.opened()
                        yield None
                        async for line in r.aiter_lines():
                            event = watching.line(line)
                            if event is not None:
                                yield event
                        why = "the node closed the stream"
            except httpx.TransportError as e:
                err = transport_error(url, e, True, True)
                if getattr(err, "final", False):
                    raise err from None
                why = f"{url}: {e}"
            except errors.LeaseholdError as e:
                if not resumable(e):
                    raise
                why = str(e)
            self.endpoints.next()
            await asyncio.sleep(watching.broke(why))

    async def _acquire(
        self,
        key: str,
        ttl: Number,
        wait: Optional[Number],
        lock_delay: Number,
        shared: bool,
        permits: Optional[int],
        keys: Optional[List[str]] = None,
    ) -> AsyncLease:
        answer, clock = await self._run(
            steps.acquire(self.holder, self.timeout, key, ttl, wait, lock_delay, shared, permits, keys)
        )
        return self._lease(key, answer, clock, len(keys) if keys else 1)

    async def _run(self, operation: steps.Steps) -> Any:
        """Carries out an operation's steps (see :mod:`leasehold._steps`), as
        ``Client._run`` does, with tasks and awaits; its result. A task
        cancelled during a step has the cancellation thrown into the
        operation, whose clean-up then runs."""
        send: Any = None
        throw: Optional[BaseException] = None
        while True:
            try:
                step = operation.throw(throw) if throw is not None else operation.send(send)
            except StopIteration as done:
                return done.value
            send, throw = None, None
            try:
                if isinstance(step, steps.Call):
                    send = await self._run(steps.call(self, step))
                elif isinstance(step, steps.Http):
                    http = self._long if (step.timeout or 0) > self.timeout else self._http
                    send = await http.request(step.method, step.url, json=step.body, params=step.params, timeout=step.timeout)
                elif isinstance(step, steps.Pause):
                    await asyncio.sleep(step.seconds)
                elif isinstance(step, steps.StartKeeper):
                    send = asyncio.get_running_loop().create_task(self._run(steps.keep(step.lease_id, step.clock)))
                elif isinstance(step, steps.StopKeeper):
                    send = await _stop(step.keeper)
            except BaseException as e:  # thrown into the operation, which decides
                throw = e

    def _lease(self, key: str, answer: Dict[str, Any], clock: Clock, key_count: int) -> AsyncLease:
        return AsyncLease(self, key, int(answer["lease"]), int(answer["fence"]), clock, checkpoint_of(answer), key_count)

    async def _call(
        self,
        method: str,
        path: str,
        body: Optional[Dict[str, Any]],
        *,
        params: Optional[Dict[str, Any]] = None,
        timeout: Optional[float] = None,
        retry: Optional[Retry] = None,
        retry_codes: tuple = MAYBE_DONE,
    ) -> Any:
        """One call to the server, with its retries (:func:`leasehold._steps.call`)."""
        c = steps.Call(method, path, body, timeout, retry, retry_codes, params)
        return await self._run(steps.call(self, c))


async def _stop(keeper: "asyncio.Task[Optional[str]]") -> Optional[str]:
    """Stops a waiting acquire's renewer (again is harmless); why it lost
    the lease, if it did."""
    if not keeper.done():
        keeper.cancel()
    try:
        return await keeper
    except asyncio.CancelledError:
        return None
