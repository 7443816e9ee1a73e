"""Client for the oncely gateway: make AI agents' side effects happen once.

The gateway derives each action's key from its business identity (the token's tenant,
the action type, ``workflow_id``, ``step``, ``business_object``, ``revision``), so
repeating ``enqueue`` — after a timeout, a crash, an ``Unavailable`` — is always safe:
a repeat is reported as a :class:`Duplicate` with the saved status and result, and never
runs twice.

    from oncely import Client, Conflict

    with Client("http://127.0.0.1:8080", token=TOKEN) as c:
        r = c.enqueue("email.send", workflow_id="case-1842", step="send_approval_notice",
                      business_object="application-731", revision=2,
                      payload={"to": "a@example.test", "subject": "Approved"})
        if not isinstance(r, Conflict):
            done = c.wait(r.key, timeout=60)

``enqueue`` also takes ``not_before`` / ``expires_at``; ``cancel(key)`` stops an action
before it is sent, ``approve(key)`` / ``reject(key)`` decide on one an approval rule holds.
"""

from ._client import SERVER_MAX_WAIT, AsyncClient, Client
from ._errors import (
    AlreadyDecided,
    Forbidden,
    InvalidRequest,
    NotFound,
    NotHeld,
    OncelyError,
    OwnRequest,
    PayloadTooLarge,
    RateLimited,
    RequestInProgress,
    TooLate,
    Unauthorized,
    Unavailable,
)
from ._types import (
    TERMINAL_STATUSES,
    Action,
    ActionType,
    Cancelled,
    Conflict,
    Decision,
    Duplicate,
    Enqueued,
    EnqueueResult,
)
from ._version import __version__

__all__ = [
    "SERVER_MAX_WAIT",
    "TERMINAL_STATUSES",
    "Action",
    "ActionType",
    "AlreadyDecided",
    "AsyncClient",
    "Cancelled",
    "Client",
    "Conflict",
    "Decision",
    "Duplicate",
    "Enqueued",
    "EnqueueResult",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "NotHeld",
    "OncelyError",
    "OwnRequest",
    "PayloadTooLarge",
    "RateLimited",
    "RequestInProgress",
    "TooLate",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
