"""Client for the oncely gateway: enqueue AI agents' side effects so they happen once.

The gateway derives the idempotency key from the business identity (your token's tenant,
the action type, workflow_id, step, business_object, revision), so repeating
``enqueue`` — after a timeout, a crash, a redelivery — is always safe: a repeat is
reported as a ``Duplicate`` with the saved status and result, never run twice.
"""

from ._client import AsyncClient, Client
from ._errors import (
    Forbidden,
    InvalidRequest,
    NotFound,
    OncelyError,
    PayloadTooLarge,
    RequestInProgress,
    Unauthorized,
    Unavailable,
)
from ._types import Action, ActionType, Conflict, Duplicate, Enqueued, EnqueueResult

__all__ = [
    "Action",
    "ActionType",
    "AsyncClient",
    "Client",
    "Conflict",
    "Duplicate",
    "Enqueued",
    "EnqueueResult",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "OncelyError",
    "PayloadTooLarge",
    "RequestInProgress",
    "Unauthorized",
    "Unavailable",
]
