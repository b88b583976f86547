"""The asyncio client: :class:`AsyncClient` and its :class:`AsyncLease`.

The same rules as the blocking client; renewal runs as a task on the loop::

    async with leasehold.AsyncClient("http://127.0.0.1:7419") as client:
        async with await client.lock("nightly", ttl=30) as lease:
            await write(lease.token())
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
import urllib.parse
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple, Union

import httpx

from . import errors
from .election import AsyncElection
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
    acquire_body,
    checkpoint_of,
    outcome,
    request_id,
    resumable,
    retryable,
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
    ) -> None:
        super().__init__(key, lease_id, fence, clock, checkpoint, asyncio.Event())
        self._client = client
        self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def save_checkpoint(self, data: Union[bytes, str]) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._client._call(
            "POST",
            "/v1/checkpoint",
            {"key": self.key, "fence": self.token(), "data_base64": base64.b64encode(raw).decode()},
        )

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
        was_lost = self._was_lost()
        path = f"/v1/leases/{self.lease_id}"
        unanswered = None
        try:
            await self._client._call("DELETE", path, None, retry_codes=())
        except (errors.LeaseExpired, errors.LeaseNotFound):
            was_lost = True
        except errors.OutcomeUnknown:
            try:
                await self._client._call("DELETE", path, None)
            except (errors.LeaseExpired, errors.LeaseNotFound):
                pass
            except errors.LeaseholdError as e:
                unanswered = e
        self._released_now(was_lost, unanswered)

    async def __aenter__(self) -> "AsyncLease":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await self.release()
        except errors.LeaseLost:
            if exc_type is None:
                raise

    async def _renew(self) -> None:
        every = self._clock.every()
        next_at = time.monotonic() + every
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if self._clock.left() <= 0:
                self._lose("the client-side deadline passed without a renewal")
                return
            sent_at = time.monotonic()
            timeout = self._clock.call_timeout(len(self._client.endpoints.urls) > 1)
            try:
                await self._client._call(
                    "POST",
                    f"/v1/leases/{self.lease_id}/keepalive",
                    {},
                    timeout=min(timeout, max(self._clock.left(), 0.01)),
                    retry=Retry(budget=0),
                )
            except (errors.LeaseExpired, errors.LeaseNotFound, errors.PermissionDenied, errors.Unauthenticated) as e:
                self._lose(f"renewal refused: {e}")
                return
            except errors.LeaseholdError:
                next_at = time.monotonic() + min(0.1, every)
                continue
            self._clock.renewed(sent_at)
            next_at = sent_at + every


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
        self._http = httpx.AsyncClient(headers=s.headers, verify=s.verify)

    async def aclose(self) -> None:
        await self._http.aclose()

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
                async with self._http.stream("GET", url, params=watching.params(), timeout=timeout) as r:
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
        ttl = float(ttl)
        sent_at = time.monotonic()
        if wait is None:
            body = acquire_body(
                key,
                ttl=ttl,
                holder=self.holder,
                lock_delay=lock_delay,
                request_id=request_id(),
                shared=shared,
                permits=permits,
                keys=keys,
            )
            answer = await self._call("POST", "/v1/acquire", body)
            return self._lease(key, answer, Clock(ttl, sent_at))
        granted = await self._call(
            "POST",
            "/v1/leases",
            {"ttl_ms": round(ttl * 1000), "holder": self.holder, "request_id": request_id()},
        )
        lease_id = int(granted["lease"])
        clock = Clock(ttl, sent_at)
        keeper = asyncio.get_running_loop().create_task(self._keep(lease_id, clock))
        try:
            until = time.monotonic() + float(wait)
            body = acquire_body(
                key,
                lease=lease_id,
                wait=wait,
                lock_delay=lock_delay,
                request_id=request_id(),
                shared=shared,
                permits=permits,
                keys=keys,
            )
            while True:
                body["wait_ms"] = max(1, round((until - time.monotonic()) * 1000))
                try:
                    answer = await self._call(
                        "POST", "/v1/acquire", body, timeout=body["wait_ms"] / 1000 + self.timeout
                    )
                    break
                except errors.OutcomeUnknown:
                    if time.monotonic() >= until:
                        raise errors.WaitTimeout(f"timed out waiting for lock {key!r}", {"key": key})
        except BaseException:
            keeper.cancel()
            try:
                await self._call("DELETE", f"/v1/leases/{lease_id}", None, retry_codes=())
            except errors.LeaseholdError:
                pass
            raise
        keeper.cancel()
        return self._lease(key, answer, clock)

    async def _keep(self, lease_id: int, clock: Clock) -> None:
        while True:
            await asyncio.sleep(clock.every())
            sent_at = time.monotonic()
            try:
                await self._call("POST", f"/v1/leases/{lease_id}/keepalive", {}, retry=Retry(budget=0))
                clock.renewed(sent_at)
            except (errors.LeaseExpired, errors.LeaseNotFound):
                return
            except errors.LeaseholdError:
                continue

    def _lease(self, key: str, answer: Dict[str, Any], clock: Clock) -> AsyncLease:
        return AsyncLease(self, key, int(answer["lease"]), int(answer["fence"]), clock, checkpoint_of(answer))

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
        pauses = (retry or self.retry).pauses()
        while True:
            url = self.endpoints.current() + path
            try:
                r = await self._http.request(method, url, json=body, params=params, timeout=timeout or self.timeout)
            except httpx.TransportError as e:
                # Never connected: nothing was done. Broken after: it may
                # have acted. A TLS refusal, or a lone endpoint refusing
                # connections, is final at once.
                connected = not isinstance(e, httpx.ConnectError)
                err: errors.LeaseholdError = transport_error(url, e, connected, len(self.endpoints.urls) > 1)
                self.endpoints.next()
            else:
                try:
                    answer = r.json()
                except ValueError:
                    answer = None
                failed = outcome(self.endpoints, r.status_code, r.is_success, answer)
                if failed is None:
                    return answer
                err = failed
            pause = next(pauses, None) if retryable(err, retry_codes) else None
            if pause is None:
                raise err
            if not isinstance(err, errors.NotLeader):
                await asyncio.sleep(pause)
