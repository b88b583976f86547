"""Errors, one class per error code the server sends.

Every server error is a :class:`LeaseholdError` with ``code`` (the stable code
from the server, e.g. ``"held"``), ``message`` and ``details`` (the other
fields of the error body, e.g. ``holder`` and ``fence`` for ``held``). The
class tells the cases apart, so nobody needs to parse messages::

    try:
        lease = client.try_lock("nightly")
    except leasehold.Held as e:
        print("held by", e.holder, "with token", e.fence)
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class LeaseholdError(Exception):
    """Any error from Leasehold: the server's refusals and the client's own."""

    code: str = "error"

    def __init__(self, message: str, details: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: Dict[str, Any] = dict(details or {})

    def __getattr__(self, name: str) -> Any:
        # Details as attributes: e.holder, e.fence, e.leader ...
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(name)


class InvalidArgument(LeaseholdError):
    """A field failed validation; nothing was changed."""

    code = "invalid_argument"


class LeaseNotFound(LeaseholdError):
    """The lease id was never handed out."""

    code = "lease_not_found"


class LeaseExpired(LeaseholdError):
    """The lease expired or was revoked."""

    code = "lease_expired"


class Held(LeaseholdError):
    """The key is held by someone else (``holder``, ``lease``, ``fence``)."""

    code = "held"


class LockDelayed(LeaseholdError):
    """The key was freed by an expiry and is in its lock-delay (``delay_left_ms``)."""

    code = "lock_delayed"


class StaleFence(LeaseholdError):
    """The token presented does not hold the key (any more)."""

    code = "stale_fence"


class WaitTimeout(LeaseholdError):
    """A wait in the key's queue ended without a grant."""

    code = "wait_timeout"


class Unauthenticated(LeaseholdError):
    """No token, or a bad or revoked one."""

    code = "unauthenticated"


class PermissionDenied(LeaseholdError):
    """The token may not do this (``key``, ``needed``)."""

    code = "permission_denied"


class NotLeader(LeaseholdError):
    """This node does not lead; ``leader`` is where to go (may be empty)."""

    code = "not_leader"


class Unavailable(LeaseholdError):
    """Nothing was done; the server could not take the request. Safe to retry."""

    code = "unavailable"


class OutcomeUnknown(LeaseholdError):
    """The request reached the server and no answer came back: it may have acted.

    The client already retried it with its request id until it gave up.
    """

    code = "outcome_unknown"


class ResourceExhausted(LeaseholdError):
    """A quota or rate limit refused it (HTTP 429); nothing was done. Retry
    later; renewals, releases and revokes are never refused."""

    code = "resource_exhausted"


class TlsRequired(LeaseholdError):
    """Plaintext reached a port that speaks TLS only: use an ``https://``
    endpoint. Nothing was done."""

    code = "tls_required"


class WatchBehind(LeaseholdError):
    """A watch's events were dropped (it fell too far behind, or no node
    still has them): list the locks again, then watch from now."""

    code = "watch_behind"


class NotAdded(LeaseholdError):
    """A member to add did not answer or catch up; it is not a member."""

    code = "not_added"


class NotFound(LeaseholdError):
    """No such route: the server is older than this client."""

    code = "not_found"


class MethodNotAllowed(LeaseholdError):
    """The route exists, but not with this method: the server is older than
    this client."""

    code = "method_not_allowed"


class Internal(LeaseholdError):
    """The server failed in a way the caller cannot fix: report it."""

    code = "internal"


class LeaseLost(LeaseholdError):
    """This client's lease is lost: renewal was refused, or its deadline passed.

    Stop mutating: another holder may already have the key.
    """

    code = "lease_lost"


_BY_CODE: Dict[str, Type[LeaseholdError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        LeaseNotFound,
        LeaseExpired,
        Held,
        LockDelayed,
        StaleFence,
        WaitTimeout,
        Unauthenticated,
        PermissionDenied,
        NotLeader,
        Unavailable,
        OutcomeUnknown,
        ResourceExhausted,
        TlsRequired,
        WatchBehind,
        NotAdded,
        NotFound,
        MethodNotAllowed,
        Internal,
    )
}


def from_body(status: int, body: Any) -> LeaseholdError:
    """The error an HTTP error answer stands for."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return LeaseholdError(f"HTTP {status} without an error body")
    code = str(error.get("code", "error"))
    message = str(error.get("message", code))
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    cls = _BY_CODE.get(code, LeaseholdError)
    err = cls(message, details)
    if cls is LeaseholdError:
        err.code = code
    return err
