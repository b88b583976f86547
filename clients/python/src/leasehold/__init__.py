"""Leasehold client: distributed locks that are a lease plus a fencing token.

::

    import leasehold

    client = leasehold.Client("http://127.0.0.1:7419")
    with client.lock("nightly", ttl=30) as lease:
        for batch in batches:
            write(batch, fence=lease.token())   # raises LeaseLost once lost

A lease renews itself every TTL/3; its client-side deadline counts from when
each request was sent, so the client always gives up before the server does.
Send :meth:`Lease.token` with every write and let the resource refuse lower
tokens (:mod:`leasehold.fence`).
"""

from ._core import DEFAULT_ENDPOINT, MAX_PERMITS, Retry
from .aio import AsyncClient, AsyncLease
from .client import Client, Lease
from .election import AsyncElection, AsyncLeadership, Election, Leader, Leadership
from ._core import WatchEvent
from .errors import (
    Held,
    Internal,
    InvalidArgument,
    LeaseExpired,
    LeaseholdError,
    LeaseLost,
    LeaseNotFound,
    LockDelayed,
    MethodNotAllowed,
    NotAdded,
    NotFound,
    NotLeader,
    OutcomeUnknown,
    PermissionDenied,
    ResourceExhausted,
    StaleFence,
    TlsRequired,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
    WatchBehind,
)
from .fence import FenceGate, fence_clause, fenced_update

__all__ = [
    "AsyncClient",
    "AsyncElection",
    "AsyncLeadership",
    "AsyncLease",
    "Client",
    "DEFAULT_ENDPOINT",
    "Election",
    "FenceGate",
    "Held",
    "Internal",
    "InvalidArgument",
    "Leader",
    "Leadership",
    "Lease",
    "LeaseExpired",
    "LeaseLost",
    "LeaseNotFound",
    "LeaseholdError",
    "LockDelayed",
    "MAX_PERMITS",
    "MethodNotAllowed",
    "NotAdded",
    "NotFound",
    "NotLeader",
    "OutcomeUnknown",
    "PermissionDenied",
    "ResourceExhausted",
    "Retry",
    "StaleFence",
    "Unauthenticated",
    "TlsRequired",
    "Unavailable",
    "WaitTimeout",
    "WatchBehind",
    "WatchEvent",
    "fence_clause",
    "fenced_update",
]
__version__ = "0.2.0"
