"""The blocking client: :class:`Client` and its :class:`Lease`."""

from __future__ import annotations

import ssl
import threading
import time
import urllib.parse
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import httpx

from . import errors
from .election import Election
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


class Lease(LeaseState):
    """A held lock (or reader's hold, or semaphore permit, or lock set): a
    lease that renews itself every TTL/3 in a background thread, and its
    fencing token.

    Call :meth:`token` right before each write the lock protects and send the
    token with the write; it raises :class:`~leasehold.LeaseLost` once the
    lease is lost (a renewal refused, or the client-side deadline passed).
    :attr:`lost` (a ``threading.Event``) is set at the same moment.

    Use it as a context manager to release on exit.
    """

    def __init__(
        self,
        client: "Client",
        key: str,
        lease_id: int,
        fence: int,
        clock: Clock,
        checkpoint: Optional[bytes],
        key_count: int = 1,
    ) -> None:
        super().__init__(key, lease_id, fence, clock, checkpoint, key_count, threading.Event())
        self._client = client
        self._stop = threading.Event()
        self._renewer = threading.Thread(
            target=self._renew, name=f"leasehold-renew-{lease_id}", daemon=True
        )
        self._renewer.start()

    def save_checkpoint(self, data: Union[bytes, str]) -> None:
        """Saves bytes with the lock for the next holder, fenced by this lease's token."""
        self._client._run(steps.save_checkpoint(self, data))

    def release(self) -> None:
        """Stops renewing, then ends the lease, which releases the lock; raises
        :class:`~leasehold.LeaseLost` if it was lost before."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        if threading.current_thread() is not self._renewer:
            self._renewer.join()
        self._client._run(steps.release(self))

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except errors.LeaseLost:
            if exc_type is None:
                raise

    # ---- renewal ----

    def _lose(self, reason: str) -> None:
        super()._lose(reason)
        self._stop.set()

    def _renew(self) -> None:
        several = len(self._client.endpoints.urls) > 1
        self._client._run(steps.renew(self, several), stop=self._stop)


class Client:
    """A connection to leaseholdd (one node, or a cluster's nodes).

    ``Client("http://127.0.0.1:7419")``, or several nodes:
    ``Client("http://10.0.0.1:7419,10.0.0.2:7419,10.0.0.3:7419")``. ``token`` is
    an access token (``lh_...``), sent as ``Authorization: Bearer``; it
    defaults to ``LEASEHOLD_TOKEN``. It speaks leaseholdd's HTTP/JSON API.
    """

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
        self._http = httpx.Client(headers=s.headers, verify=s.verify)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- locks ----

    def try_lock(
        self,
        key: str,
        ttl: Number = 15,
        *,
        lock_delay: Number = 0,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Lease:
        """Takes ``key`` if it is free, at once; raises :class:`~leasehold.Held`
        (or :class:`~leasehold.LockDelayed`) if not."""
        return self._acquire(key, ttl, None, lock_delay, shared, permits)

    def lock(
        self,
        key: str,
        ttl: Number = 15,
        *,
        wait: Optional[Number] = 30,
        lock_delay: Number = 0,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Lease:
        """Takes ``key``, waiting up to ``wait`` seconds in the server's FIFO queue
        (``wait=None`` or 0: do not wait). Use the result as a context manager::

            with client.lock("nightly", ttl=30) as lease:
                write(lease.token())

        ``shared=True`` takes it as one of many readers (a plain lock is the
        writer); ``permits=N`` takes one of N permits of a counting semaphore.
        """
        return self._acquire(key, ttl, wait or None, lock_delay, shared, permits)

    def lock_set(self, keys: List[str], ttl: Number = 15, *, wait: Optional[Number] = 30) -> Lease:
        """Every key of ``keys`` at once, all or nothing, with one fencing token
        for the set, waiting (up to ``wait``) in every key's queue at once; the
        server orders sets, so two sets never wait for each other. Releasing
        the lease releases them all. ``lease.key`` is the first key (sorted)."""
        keys = sorted(set(keys))
        return self._acquire(keys[0] if keys else "", ttl, wait or None, 0, False, None, keys=keys)

    def semaphore(self, key: str, permits: int, ttl: Number = 15, *, wait: Optional[Number] = 30) -> Lease:
        """One of ``permits`` permits of the semaphore ``key``."""
        return self.lock(key, ttl, wait=wait, permits=permits)

    def election(self, name: str) -> "Election":
        """The election ``name``: campaign, observe, proclaim, resign."""
        return Election(self, name)

    def release_by_fence(self, key: str, fence: int) -> None:
        """Releases ``key`` if token ``fence`` still holds it, whoever took
        it (an operator's release of a stuck hold); :class:`~leasehold.StaleFence`
        if it does not, and nothing changes. Its holder learns of it at its
        next renewal."""
        self._call("POST", "/v1/release", {"key": key, "fence": int(fence), "request_id": request_id()})

    def describe(self, key: str) -> Dict[str, Any]:
        """The lock as the server sees it: ``holders``, ``waiters``, ``permits`` ..."""
        return self._call("GET", "/v1/locks/" + urllib.parse.quote(key, safe="/"), None)

    def locks(self, prefix: str = "") -> List[Dict[str, Any]]:
        """Locks under a prefix (the first page of up to 10,000)."""
        return self._call("GET", "/v1/locks", None, params={"prefix": prefix})["locks"]

    def watch(self, prefix: str = "", *, after: Optional[Tuple[int, int]] = None) -> Iterator[WatchEvent]:
        """Lock events under ``prefix`` as they happen (or every one after
        ``after``, an earlier event's ``(index, seq)``), until the generator
        is closed. The watch outlives the node it streams from: it goes on at
        another endpoint after the last event delivered, losing and repeating
        nothing; :class:`~leasehold.WatchBehind` if no node has those events
        any more (list, then watch again)."""
        for event in self._watch(Watching(prefix, after)):
            if event is not None:
                yield event

    def _watch(self, watching: Watching) -> Iterator[Optional[WatchEvent]]:
        """The events of ``watching``, with ``None`` each time a stream
        opens (so an observer reads the state after subscribing)."""
        timeout = httpx.Timeout(self.timeout, read=None)
        while True:
            url = self.endpoints.current() + "/v1/watch"
            try:
                with self._http.stream("GET", url, params=watching.params(), timeout=timeout) as r:
                    if not r.is_success:
                        r.read()
                        err = outcome(self.endpoints, r.status_code, False, r.json())
                        if err is not None and not resumable(err):
                            raise err
                        why = str(err)
                    else:
                        watching.opened()
                        yield None
                        for line in r.iter_lines():
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
                # An error event: a node stopping may go on elsewhere.
                if not resumable(e):
                    raise
                why = str(e)
            self.endpoints.next()
            time.sleep(watching.broke(why))

    def _acquire(
        self,
        key: str,
        ttl: Number,
        wait: Optional[Number],
        lock_delay: Number,
        shared: bool,
        permits: Optional[int],
        keys: Optional[List[str]] = None,
    ) -> Lease:
        answer, clock = self._run(
            steps.acquire(self.holder, self.timeout, key, ttl, wait, lock_delay, shared, permits, keys)
        )
        return self._lease(key, answer, clock, len(keys) if keys else 1)

    def _lease(self, key: str, answer: Dict[str, Any], clock: Clock, key_count: int) -> Lease:
        return Lease(self, key, int(answer["lease"]), int(answer["fence"]), clock, checkpoint_of(answer), key_count)

    # ---- the wire ----

    def _call(
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
        return self._run(steps.call(self, c))

    def _run(self, operation: steps.Steps, *, stop: Optional[threading.Event] = None) -> Any:
        """Carries out an operation's steps (see :mod:`leasehold._steps`);
        its result. With ``stop``, a pause ends the operation once it is set."""
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
                    send = self._run(steps.call(self, step))
                elif isinstance(step, steps.Http):
                    send = self._http.request(
                        step.method, step.url, json=step.body, params=step.params, timeout=step.timeout
                    )
                elif isinstance(step, steps.Pause):
                    if stop is not None:
                        if stop.wait(step.seconds):
                            operation.close()
                            return None
                    else:
                        time.sleep(step.seconds)
                elif isinstance(step, steps.StartKeeper):
                    send = _Keeper(self, step.lease_id, step.clock)
                elif isinstance(step, steps.StopKeeper):
                    send = step.keeper.stop()
            except BaseException as e:  # thrown into the operation, which decides
                throw = e


class _Keeper:
    """Renews a lease while its acquire waits in the queue."""

    def __init__(self, client: Client, lease_id: int, clock: Clock) -> None:
        self.lost: Optional[str] = None
        self._stop = threading.Event()
        self._operation = steps.keep(lease_id, clock)
        self._client = client
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def stop(self) -> Optional[str]:
        """Stops renewing (again is harmless); why the lease was lost, if it was."""
        self._stop.set()
        self._thread.join()
        return self.lost

    def _keep(self) -> None:
        self.lost = self._client._run(self._operation, stop=self._stop)
