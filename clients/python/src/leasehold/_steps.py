"""What the clients do, written once: each operation is a generator that
yields the steps it needs carried out (a call to the server, a pause, a
renewer started or stopped) and is sent their results. The blocking client
carries the steps out with threads and blocking calls (``Client._run``), the
asyncio client with tasks and awaits (``AsyncClient._run``). No I/O here: the
rules live in one place, and both clients keep them alike.

A step that fails is thrown back into its generator, a ``KeyboardInterrupt``
or a task's cancellation too, so an operation's clean-up (revoking the lease
of an acquire that was given up) runs in both clients alike.
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, Generator, List, Optional, Protocol, Union

import httpx

from . import errors
from ._core import (
    MAYBE_DONE,
    Clock,
    Endpoints,
    LeaseState,
    Number,
    Retry,
    acquire_body,
    outcome,
    request_id,
    retryable,
    transport_error,
)

#: A rule broken on purpose for the conformance suite
#: (``LEASEHOLD_PLANTED_BUG``; never set it otherwise).
PLANTED = os.environ.get("LEASEHOLD_PLANTED_BUG")


@dataclass(frozen=True)
class Call:
    """A call to the server, carried out by :func:`call`; its answer (the
    decoded JSON) is sent back, or its error thrown."""

    method: str
    path: str
    body: Optional[Dict[str, Any]]
    timeout: Optional[float] = None
    retry: Optional[Retry] = None
    retry_codes: tuple = MAYBE_DONE
    params: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class Http:
    """One HTTP exchange; the ``httpx.Response`` is sent back, or the
    ``httpx.TransportError`` thrown."""

    method: str
    url: str
    body: Optional[Dict[str, Any]]
    params: Optional[Dict[str, Any]]
    timeout: float


@dataclass(frozen=True)
class Pause:
    """Wait this long; a renewer's driver ends the operation instead if its
    lease is released meanwhile."""

    seconds: float


@dataclass(frozen=True)
class StartKeeper:
    """Renew ``lease_id`` in the background while an acquire waits; a handle
    is sent back."""

    lease_id: int
    clock: Clock


@dataclass(frozen=True)
class StopKeeper:
    """Stop that renewer (again is harmless); why it lost the lease is sent
    back, or ``None``."""

    keeper: Any


Steps = Generator[Union[Call, Http, Pause, StartKeeper, StopKeeper], Any, Any]


class Connection(Protocol):
    """What :func:`call` needs of a client."""

    endpoints: Endpoints
    retry: Retry
    timeout: float


def call(client: Connection, c: Call) -> Steps:
    """One call, retried while nothing was done (a node down, not the
    leader) and, for ``c.retry_codes``, while the outcome is unknown (every
    body that changes state carries a request id, so a retry acts once)."""
    pauses = (c.retry or client.retry).pauses()
    while True:
        url = client.endpoints.current() + c.path
        try:
            r = yield Http(c.method, url, c.body, c.params, c.timeout or client.timeout)
        except httpx.TransportError as e:
            # Never connected: nothing was done. Broken after: it may have
            # acted. A TLS refusal, or a lone endpoint refusing connections,
            # is final at once.
            connected = not isinstance(e, httpx.ConnectError)
            err: errors.LeaseholdError = transport_error(url, e, connected, len(client.endpoints.urls) > 1)
            client.endpoints.next()
        else:
            try:
                answer = r.json()
            except ValueError:
                answer = None
            failed = outcome(client.endpoints, r.status_code, r.is_success, answer)
            if failed is None:
                return answer
            err = failed
        pause = next(pauses, None) if retryable(err, c.retry_codes) else None
        if pause is None:
            raise err
        if PLANTED == "fresh-request-id" and isinstance(c.body, dict) and "request_id" in c.body:
            # Planted for the conformance suite: the retry is a new request.
            c.body["request_id"] = request_id()
        if not isinstance(err, errors.NotLeader):
            yield Pause(pause)


def acquire(
    holder: str,
    call_timeout: float,
    key: str,
    ttl: Number,
    wait: Optional[Number],
    lock_delay: Number,
    shared: bool,
    permits: Optional[int],
    keys: Optional[List[str]] = None,
) -> Steps:
    """Takes ``key`` (or the set ``keys``): at once, or waiting up to
    ``wait`` seconds in its queue under a lease renewed meanwhile. Returns
    the server's answer and the lease's clock. A wait given up (a timeout,
    an error, an interrupt) revokes the lease it made."""
    ttl = float(ttl)
    sent_at = time.monotonic()
    common = dict(lock_delay=lock_delay, shared=shared, permits=permits, keys=keys)
    if wait is None:
        # One command: the lease and the lock, or neither.
        body = acquire_body(key, ttl=ttl, holder=holder, request_id=request_id(), **common)
        answer = yield Call("POST", "/v1/acquire", body)
        return answer, Clock(ttl, sent_at)
    # A wait may outlast the TTL: the lease is granted first and renewed
    # while it waits.
    granted = yield Call(
        "POST", "/v1/leases", {"ttl_ms": round(ttl * 1000), "holder": holder, "request_id": request_id()}
    )
    lease_id = int(granted["lease"])
    clock = Clock(ttl, sent_at)
    keeper = yield StartKeeper(lease_id, clock)
    try:
        until = time.monotonic() + float(wait)
        body = acquire_body(key, lease=lease_id, wait=wait, request_id=request_id(), **common)
        while True:
            body["wait_ms"] = max(1, round((until - time.monotonic()) * 1000))
            try:
                answer = yield Call("POST", "/v1/acquire", body, timeout=body["wait_ms"] / 1000 + call_timeout)
                break
            except errors.OutcomeUnknown:
                # The wait's call broke (a restart, a leader change): the
                # same request re-attaches to its place in the queue.
                if time.monotonic() >= until:
                    raise errors.WaitTimeout(f"timed out waiting for lock {key!r}", {"key": key}) from None
        lost = yield StopKeeper(keeper)
        if lost is not None:
            raise errors.LeaseLost(f"lease lost while waiting for {key!r}: {lost}", {"key": key})
    except BaseException:
        yield StopKeeper(keeper)
        try:
            yield Call("DELETE", f"/v1/leases/{lease_id}", None, retry_codes=())
        except errors.LeaseholdError:
            pass
        raise
    return answer, clock


def keep(lease_id: int, clock: Clock) -> Steps:
    """Renews a lease every TTL/3 while its acquire waits; returns why the
    lease was lost (a refused renewal), if it was."""
    while True:
        yield Pause(clock.every())
        sent_at = time.monotonic()
        try:
            yield Call("POST", f"/v1/leases/{lease_id}/keepalive", {}, retry=Retry(budget=0))
            clock.renewed(sent_at)
        except (errors.LeaseExpired, errors.LeaseNotFound) as e:
            return str(e)
        except errors.LeaseholdError:
            continue


def renew(lease: LeaseState, several_nodes: bool) -> Steps:
    """A held lease's renewal, every TTL/3 from when the last renewal was
    sent, until it is lost or released. A renewal refused loses it at once;
    one not answered is tried again soon, until the client-side deadline."""
    clock = lease._clock
    every = clock.every()
    next_at = time.monotonic() + every
    while True:
        yield Pause(max(0.0, next_at - time.monotonic()))
        if clock.left() <= 0:
            lease._lose("the client-side deadline passed without a renewal")
            return
        sent_at = time.monotonic()
        timeout = clock.call_timeout(several_nodes)
        try:
            renewed = yield Call(
                "POST",
                f"/v1/leases/{lease.lease_id}/keepalive",
                {},
                timeout=min(timeout, max(clock.left(), 0.01)),
                retry=Retry(budget=0),
            )
        except (errors.LeaseExpired, errors.LeaseNotFound, errors.PermissionDenied, errors.Unauthenticated) as e:
            lease._lose(f"renewal refused: {e}")
            return
        except errors.LeaseholdError:
            # Not answered: try again soon, until the deadline.
            next_at = time.monotonic() + min(0.1, every)
            continue
        if lease._released:
            # Released while the renewal was in flight: it extends nothing.
            return
        held = renewed.get("key_count") if isinstance(renewed, dict) else None
        if held is not None and int(held) < lease._key_count:
            # An older server sends no count: nothing to go by.
            lease._lose("the lock was released by its token elsewhere while the lease lived")
            return
        clock.renewed(sent_at)
        next_at = sent_at + every


def release(lease: LeaseState) -> Steps:
    """Ends a lease (its renewer already stopped), which releases its locks;
    raises :class:`~leasehold.LeaseLost` if it was lost before, and the
    error if the revoke was never answered."""
    was_lost = lease._was_lost()
    path = f"/v1/leases/{lease.lease_id}"
    unanswered = None
    try:
        yield Call("DELETE", path, None, retry_codes=())
    except (errors.LeaseExpired, errors.LeaseNotFound):
        # Ended before this release: revoked, or expired past the deadline.
        was_lost = True
    except errors.OutcomeUnknown:
        # The answer was lost, and the revoke may have acted: again, and
        # now "already ended" means it did.
        try:
            yield Call("DELETE", path, None)
        except (errors.LeaseExpired, errors.LeaseNotFound):
            pass
        except errors.LeaseholdError as e:
            unanswered = e
    lease._released_now(was_lost, unanswered)


def save_checkpoint(lease: LeaseState, data: Union[bytes, str]) -> Steps:
    """Saves bytes with the lock for the next holder, fenced by the lease's token."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    body = {"key": lease.key, "fence": lease.token(), "data_base64": base64.b64encode(raw).decode()}
    yield Call("POST", "/v1/checkpoint", body)

