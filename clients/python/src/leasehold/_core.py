"""What the blocking and the asyncio clients share: endpoints, request bodies,
retry rules and the lease's clock. No I/O here."""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

from . import errors

#: The local single-node default.
DEFAULT_ENDPOINT = "http://127.0.0.1:7419"

#: Most permits a semaphore may have (the server's limit).
MAX_PERMITS = 10_000

Number = Union[int, float]


def default_holder() -> str:
    """``host/pid``: shown to others who find the key held."""
    return f"{socket.gethostname()}/{os.getpid()}"


def request_id() -> int:
    """A random request id, never 0 (0 means none), below 2**63."""
    return random.getrandbits(62) | 1


def ms(seconds: Number) -> int:
    return int(round(float(seconds) * 1000))


class Endpoints:
    """The nodes of a deployment and which one to talk to.

    ``"http://a:7419,b:7419,c:7419"`` (or a list) names a cluster: calls go to
    the node that answered last, follow a ``not_leader`` answer's ``leader``,
    and move to the next node when one cannot be reached.
    """

    def __init__(self, url: Union[str, List[str]]) -> None:
        parts: List[str] = []
        for item in [url] if isinstance(url, str) else list(url):
            scheme = "https://" if item.strip().startswith("https://") else "http://"
            for part in item.split(","):
                part = part.strip()
                if not part:
                    continue
                if "://" not in part:
                    part = scheme + part
                parts.append(part.rstrip("/"))
        if not parts:
            raise errors.InvalidArgument("no endpoint given")
        self.urls = parts
        self._current = 0
        self._lock = threading.Lock()

    def current(self) -> str:
        with self._lock:
            return self.urls[self._current]

    def next(self) -> None:
        """The current node could not be reached: try the next."""
        with self._lock:
            self._current = (self._current + 1) % len(self.urls)

    def follow(self, leader: Any) -> bool:
        """A node named the leader; go there. False if it named no one."""
        if not leader:
            self.next()
            return False
        leader = str(leader)
        scheme = "https://" if self.urls[0].startswith("https://") else "http://"
        url = leader if "://" in leader else scheme + leader
        url = url.rstrip("/")
        with self._lock:
            if url not in self.urls:
                self.urls.append(url)
            self._current = self.urls.index(url)
        return True


Cert = Union[str, Tuple[str, str]]


def tls_context(verify: Union[bool, str, ssl.SSLContext, None], cert: Optional[Cert]) -> Union[bool, ssl.SSLContext]:
    """What the clients hand httpx as ``verify``, from their own arguments
    and the environment the CLI reads too.

    ``verify``: ``True`` (the system's CAs, or ``LEASEHOLD_CACERT`` if set),
    a CA file (PEM), ``False`` (no check; never in production) or an
    :class:`ssl.SSLContext` of your own. ``cert``: a client certificate for a
    server started with ``--tls-client-ca``: ``(cert.pem, key.pem)``, or one
    file holding both; default ``LEASEHOLD_CLIENT_CERT`` and
    ``LEASEHOLD_CLIENT_KEY``."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if cert is None:
        cert_file, key_file = os.environ.get("LEASEHOLD_CLIENT_CERT"), os.environ.get("LEASEHOLD_CLIENT_KEY")
        if cert_file:
            cert = (cert_file, key_file) if key_file else cert_file
    ca = verify if isinstance(verify, str) else (os.environ.get("LEASEHOLD_CACERT") if verify else None)
    if verify is not False and ca is None and cert is None:
        return True
    try:
        context = ssl.create_default_context(cafile=ca)
        if verify is False:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert is not None:
            certfile, keyfile = (cert, None) if isinstance(cert, str) else cert
            context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise errors.InvalidArgument(f"TLS files (CA {ca!r}, certificate {cert!r}): {e}") from None
    return context


# What a TLS failure's text says (OpenSSL's reason, or the alert the server
# sent), and what to do about it; the same advice as the Rust client's.
_TLS_ADVICE = (
    (("certificate required", "CERTIFICATE_REQUIRED"),
     "the server requires a client certificate: pass cert=(cert.pem, key.pem) (LEASEHOLD_CLIENT_CERT, LEASEHOLD_CLIENT_KEY)"),
    (("CERTIFICATE_VERIFY_FAILED", "certificate verify failed"),
     "the server's certificate is not signed by a CA this client trusts, or does not name the host: pass verify='ca.pem' with the CA that signed it (LEASEHOLD_CACERT)"),
    (("unknown ca", "UNKNOWN_CA", "bad certificate", "BAD_CERTIFICATE", "decrypt error"),
     "the server does not accept this client certificate: use one signed by the CA of the server's --tls-client-ca"),
    (("certificate expired", "CERTIFICATE_EXPIRED"),
     "a certificate is outside its validity period: renew it"),
    (("WRONG_VERSION_NUMBER", "wrong version number", "record layer failure"),
     "the server does not speak TLS on this port: use http://"),
)


def tls_advice(error: BaseException) -> Optional[str]:
    """What to do about a connection that failed for TLS, from ``error`` and
    the exceptions it came from; ``None`` if none names a TLS cause."""
    seen = set()
    at: Optional[BaseException] = error
    while at is not None and id(at) not in seen:
        seen.add(id(at))
        text = f"{at} {at!r}"
        for needles, advice in _TLS_ADVICE:
            if any(n in text for n in needles):
                return advice
        at = at.__cause__ or at.__context__
    return None


@dataclass
class Settings:
    """What both clients make of their arguments."""

    endpoints: Endpoints
    holder: str
    timeout: float
    retry: "Retry"
    headers: Dict[str, str]
    verify: Union[bool, ssl.SSLContext]

    @classmethod
    def of(
        cls,
        url: Union[str, List[str], None],
        holder: Optional[str],
        token: Optional[str],
        timeout: float,
        retry: Optional["Retry"],
        verify: Union[bool, str, ssl.SSLContext],
        cert: Optional[Cert],
    ) -> "Settings":
        token = token or os.environ.get("LEASEHOLD_TOKEN")
        return cls(
            endpoints=Endpoints(url or os.environ.get("LEASEHOLD_ENDPOINT") or DEFAULT_ENDPOINT),
            holder=holder or os.environ.get("LEASEHOLD_HOLDER") or default_holder(),
            timeout=timeout,
            retry=retry or Retry(),
            headers={"authorization": f"Bearer {token}"} if token else {},
            verify=tls_context(verify, cert),
        )


def transport_error(url: str, error: BaseException, connected: bool, several: bool) -> errors.LeaseholdError:
    """The error a failed HTTP exchange stands for. A TLS refusal is
    :class:`~leasehold.Unavailable` with what to do, raised at once (every
    node would refuse the same); a connection never made did nothing
    (``Unavailable``); one that broke after the request may have acted
    (``OutcomeUnknown``)."""
    advice = tls_advice(error)
    if advice is not None:
        err: errors.LeaseholdError = errors.Unavailable(f"{url}: {advice} ({error})")
        err.final = True
        return err
    if not connected:
        if not several and "refused" in str(error).lower():
            err = errors.Unavailable(f"{url}: {error} (is leaseholdd running there?)")
            err.final = True
            return err
        return errors.Unavailable(f"{url}: {error}")
    return errors.OutcomeUnknown(f"{url}: {error}")


@dataclass
class Retry:
    """How long to keep trying a call that was not answered."""

    #: Give up after this many seconds of trying.
    budget: float = 10.0
    #: The first pause between attempts; each next one is this much longer,
    #: up to ``max_pause``: 10, 20, ... 50 ms, as the Rust client looks for a
    #: new leader, so one just elected is found within ~50 ms. (Doubling to a
    #: second kept a client waiting up to a second past an election.)
    pause: float = 0.01
    max_pause: float = 0.05

    def pauses(self):
        """Pauses between attempts, until the budget is spent."""
        until = time.monotonic() + self.budget
        pause = self.pause
        while time.monotonic() + pause < until:
            yield pause
            pause = min(pause + self.pause, self.max_pause)


# Codes after which nothing was done: the same request may go anywhere.
NOT_DONE = ("not_leader", "unavailable")
# Codes after which the request may still take effect: retry with its id.
MAYBE_DONE = ("outcome_unknown",)


def acquire_body(
    key: str,
    *,
    lease: Optional[int] = None,
    ttl: Optional[Number] = None,
    holder: str = "",
    wait: Number = 0,
    lock_delay: Number = 0,
    request_id: int = 0,
    shared: bool = False,
    permits: Optional[int] = None,
    keys: Optional[List[str]] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"wait_ms": ms(wait), "request_id": request_id}
    if keys is not None:
        if not keys:
            raise errors.InvalidArgument("a lock set needs at least one key")
        body["keys"] = list(keys)
    else:
        body["key"] = key
    if lease is not None:
        body["lease"] = lease
    else:
        body["ttl_ms"] = ms(ttl or 0)
        body["holder"] = holder
    if lock_delay:
        body["lock_delay_ms"] = ms(lock_delay)
    if permits is not None:
        if shared:
            raise errors.InvalidArgument("a hold is shared or one of a semaphore's permits, not both")
        if not 1 <= int(permits) <= MAX_PERMITS:
            raise errors.InvalidArgument(f"permits is {permits}; a semaphore has 1 ..= {MAX_PERMITS}")
        body["mode"] = "permit"
        body["permits"] = int(permits)
    elif shared:
        body["mode"] = "shared"
    return body


class Clock:
    """A lease's client-side deadline, on the monotonic clock.

    Measured from when a request was *sent*, never from when its answer came:
    the server's TTL may have started any time after the send, so the client
    gives up a margin (a tenth of the TTL) before the earliest moment the
    server could expire the lease.
    """

    def __init__(self, ttl: float, sent_at: float) -> None:
        self.ttl = ttl
        self.margin = ttl / 10
        self._deadline = sent_at + ttl - self.margin
        self._lock = threading.Lock()

    def renewed(self, sent_at: float) -> None:
        with self._lock:
            self._deadline = max(self._deadline, sent_at + self.ttl - self.margin)

    def deadline(self) -> float:
        with self._lock:
            return self._deadline

    def left(self) -> float:
        return self.deadline() - time.monotonic()

    def every(self) -> float:
        """How often to renew: a third of the TTL."""
        return self.ttl / 3

    def call_timeout(self, several_nodes: bool) -> float:
        """How long one renewal may take before the next node is tried."""
        if several_nodes:
            return max(self.ttl / 6, 0.2)
        return max(self.left(), 0.05)


class LeaseState:
    """What a blocking and an asyncio lease share: the key, token, deadline,
    and the moment of loss. ``lost`` is the event the lease sets (a
    ``threading.Event`` or an ``asyncio.Event``)."""

    def __init__(
        self,
        key: str,
        lease_id: int,
        fence: int,
        clock: Clock,
        checkpoint: Optional[bytes],
        key_count: int,
        lost: Any,
    ) -> None:
        self.key = key
        # The keys the lease was granted (one, or a lock set's): a renewal
        # that counts fewer learns one was released by its token elsewhere.
        self._key_count = key_count
        self.lease_id = lease_id
        self.fence = fence
        #: What the previous holder saved with the lock, if anything.
        self.checkpoint = checkpoint
        #: Set the moment the lease is lost (or released).
        self.lost = lost
        self._clock = clock
        self._reason = ""
        self._released = False

    def token(self) -> int:
        """The fencing token, if the lease is still good; raises
        :class:`~leasehold.LeaseLost` otherwise. Checks the client-side
        deadline itself, so a process resumed after a pause sees the loss
        before its next write."""
        if not self.lost.is_set() and self._clock.left() <= 0:
            self._lose("the client-side deadline passed without a renewal")
        if self.lost.is_set():
            raise errors.LeaseLost(f"lease on {self.key!r} lost: {self._reason}", {"key": self.key})
        return self.fence

    def is_live(self) -> bool:
        """Whether :meth:`token` would answer."""
        try:
            self.token()
            return True
        except errors.LeaseLost:
            return False

    @property
    def lost_reason(self) -> str:
        """Why the lease was lost (empty while it is not)."""
        return self._reason

    def deadline(self) -> float:
        """When the lease is lost without another renewal, on ``time.monotonic()``."""
        return self._clock.deadline()

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self._reason = reason
            self.lost.set()

    def _was_lost(self) -> bool:
        return self.lost.is_set() or self._clock.left() <= 0

    def _released_now(self, was_lost: bool, unanswered: Optional[errors.LeaseholdError] = None) -> None:
        """After the release call: mark the lease ended (unrenewed, it ends
        with its TTL even if no revoke was answered), and raise if it had been
        lost before, or if the revoke was never answered."""
        if not self.lost.is_set():
            self._reason = "released"
            self.lost.set()
        if was_lost:
            raise errors.LeaseLost(f"lease on {self.key!r} was lost before its release", {"key": self.key})
        if unanswered is not None:
            raise unanswered


def checkpoint_of(answer: Dict[str, Any]) -> Optional[bytes]:
    """The previous holder's checkpoint in an acquire's answer."""
    import base64

    data = answer.get("checkpoint_base64")
    return None if data is None else base64.b64decode(data)


def outcome(endpoints: Endpoints, status: int, success: bool, answer: Any) -> Optional[errors.LeaseholdError]:
    """None for a success; else the error, after following a ``not_leader``."""
    if success:
        return None
    err = errors.from_body(status, answer)
    if isinstance(err, errors.NotLeader):
        endpoints.follow(err.details.get("leader"))
    return err


def retryable(err: errors.LeaseholdError, retry_codes: tuple) -> bool:
    """Nothing was done (retry anywhere), or the outcome is unknown and the
    call carries a request id (``retry_codes``); never an error marked
    final (a TLS refusal, a lone endpoint that refuses connections)."""
    if getattr(err, "final", False):
        return False
    return err.code in NOT_DONE or err.code in retry_codes


@dataclass(frozen=True)
class WatchEvent:
    """A lock event: ``kind`` is ``acquired``, ``released``, ``expired`` or
    ``checkpoint`` (``data`` holds the bytes saved). ``index`` and ``seq``
    place it in the deployment's history: the same on every node."""

    kind: str
    key: str
    fence: int
    lease: int
    holder: str
    index: int
    seq: int
    data: Optional[bytes] = None


#: How long a broken watch looks for a node to go on at.
WATCH_RESUME_FOR = 30.0


class Watching:
    """One watch across the streams it is read from: reads server-sent
    events line by line and knows where to resume. No I/O here.

    1. A stream that breaks (its node killed, stopped or cut off) is opened
       again on the next endpoint after the last event delivered
       (``after_index``, ``after_seq``): nothing is lost or repeated.
    2. A node that no longer has those events answers ``watch_behind``,
       raised as :class:`~leasehold.WatchBehind`: list, then watch again.
    3. Reopening goes on for :data:`WATCH_RESUME_FOR` seconds without a
       stream; then :class:`~leasehold.Unavailable`.
    4. Only what is safe to resume is resumed: a refusal with a code other
       than ``unavailable`` or ``not_leader`` is raised as it is.
    """

    def __init__(self, prefix: str, after: Optional[Tuple[int, int]] = None) -> None:
        self.prefix = prefix
        #: The last event delivered, as ``(index, seq)``.
        self.after = after
        self._kind: Optional[str] = None
        self._data: List[str] = []
        self._broken_since: Optional[float] = None
        self._attempt = 0

    def params(self) -> Dict[str, Any]:
        """The query that opens the stream where it stands."""
        params: Dict[str, Any] = {"prefix": self.prefix}
        if self.after is not None:
            params["after_index"], params["after_seq"] = self.after
        return params

    def opened(self) -> None:
        """A stream is open: the clock of :data:`WATCH_RESUME_FOR` stops."""
        self._broken_since = None
        self._attempt = 0

    def broke(self, why: str) -> float:
        """The stream broke (or could not open): the pause before the next
        attempt (50 ms, doubling to a second); raises
        :class:`~leasehold.Unavailable` once reopening has gone on too long."""
        self._kind, self._data = None, []
        now = time.monotonic()
        if self._broken_since is None:
            self._broken_since = now
        elif now - self._broken_since > WATCH_RESUME_FOR:
            raise errors.Unavailable(f"watch on {self.prefix!r}: no node took it for {WATCH_RESUME_FOR:.0f} s: {why}")
        pause = min(0.05 * 2**self._attempt, 1.0)
        self._attempt = min(self._attempt + 1, 5)
        return pause

    def line(self, line: str) -> Optional[WatchEvent]:
        """One line of the stream: the event it completes, if it does.
        Raises the error an ``error`` event carries."""
        if line.startswith("event:"):
            self._kind = line[len("event:") :].strip()
        elif line.startswith("data:"):
            self._data.append(line[len("data:") :].strip())
        elif line == "" and self._kind is not None:
            body = json.loads("\n".join(self._data)) if self._data else {}
            kind, self._kind, self._data = self._kind, None, []
            if kind == "error":
                # The same JSON body as any other refusal, as its own type.
                raise errors.from_body(0, body)
            event = WatchEvent(
                kind=kind,
                key=str(body.get("key", "")),
                fence=int(body.get("fence", 0)),
                lease=int(body.get("lease", 0)),
                holder=str(body.get("holder", "")),
                index=int(body.get("index", 0)),
                seq=int(body.get("seq", 0)),
                data=base64.b64decode(body["data_base64"]) if "data_base64" in body else None,
            )
            # A server from before positions sends none: resume from now.
            if event.index:
                self.after = (event.index, event.seq)
            return event
        return None


def resumable(err: errors.LeaseholdError) -> bool:
    """Whether a watch refused with ``err`` may go on at another node."""
    return err.code in NOT_DONE
