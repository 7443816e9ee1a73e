"""Errors: the gateway's error answers (and transport failures) as exceptions."""

import re
from typing import Any, Dict, Optional, Tuple, Type


class OncelyError(Exception):
    """An error answer of the gateway.

    ``code`` is the gateway's stable error code (``schema_violation``,
    ``forbidden_action_type``, ``idempotency_key_reused``, …), ``message`` its
    explanation, ``status`` the HTTP status (``0`` for a transport error), ``field`` the
    JSON Pointer of the offending request field when one is to blame (``/payload/to``),
    ``retry_after`` the seconds of a ``Retry-After`` header, and ``key`` the operation's
    key when the answer names one.
    """

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        field: Optional[str] = None,
        retry_after: Optional[float] = None,
        *,
        key: Optional[str] = None,
    ) -> None:
        text = f"{code}: {message}"
        if field:
            text += f" (field {field})"
        super().__init__(text)
        self.code = code
        self.message = message
        self.status = status
        self.field = field
        self.retry_after = retry_after
        self.key = key

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"status={self.status!r}, field={self.field!r}, retry_after={self.retry_after!r})"
        )

    def __reduce__(self) -> Tuple[Any, ...]:
        # Keep the attributes through pickling (multiprocessing, task queues).
        args = (self.code, self.message, self.status, self.field, self.retry_after)
        state: Dict[str, Any] = dict(self.__dict__)
        return (type(self), args, state)


class InvalidRequest(OncelyError):
    """400: bad input (``malformed_json``, ``invalid_request``, ``schema_violation``);
    ``field`` is a JSON Pointer into the request body."""


class Unauthorized(OncelyError):
    """401: no token, or an unknown one."""


class Forbidden(OncelyError):
    """403 ``forbidden_action_type``: the token may not enqueue this action type; or
    ``forbidden``: the token may not approve or reject (the tokens file grants
    ``approve = true``)."""


class OwnRequest(Forbidden):
    """403 ``own_request``: the token that asked for an action may not approve it."""


class NotFound(OncelyError):
    """404: no such operation for this tenant (a key of another tenant answers the
    same), or ``unknown_action_type``."""


class RequestInProgress(OncelyError):
    """409 ``request_in_progress``: the first request with this ``Idempotency-Key`` is
    still being recorded; try again shortly."""


class TooLate(OncelyError):
    """409 ``too_late``: a worker took the action first, or it had already ended — the
    cancel did not happen, and the action may run or have run. ``action_status`` is the
    action's status the gateway named (``executing``, ``succeeded``, …; ``None`` when
    the message did not name one) and ``key`` its key; call ``status(key)`` or
    ``wait(key)`` for the whole operation."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        field: Optional[str] = None,
        retry_after: Optional[float] = None,
        *,
        key: Optional[str] = None,
    ) -> None:
        super().__init__(code, message, status, field, retry_after, key=key)
        found = _NAMED_STATUS.search(message)
        self.action_status: Optional[str] = found.group(1) if found else None


#: How the gateway names the status in a ``too_late`` message ("… the action is executing …").
_NAMED_STATUS = re.compile(r"the action is ([a-z_]+)")


class NotHeld(OncelyError):
    """409 ``not_held``: the action is not awaiting approval (never held, or already
    approved, rejected, cancelled…); ``key`` names it."""


class AlreadyDecided(OncelyError):
    """409 ``already_decided``: this token already decided on the action (four eyes
    needs another person)."""


class PayloadTooLarge(OncelyError):
    """413 ``payload_too_large``: the body is over the gateway's limit."""


class RateLimited(OncelyError):
    """429 ``rate_limited``: over the token's or the tenant's quota at the gateway.
    Nothing was recorded; ``retry_after`` is the seconds to wait (``Retry-After``).
    Calling ``enqueue`` again after it, with the same identity, is safe."""


class Unavailable(OncelyError):
    """503 (``database_unavailable``, ``broker_unavailable``; ``retry_after`` seconds
    from the ``Retry-After`` header), or a transport failure: code ``transport``,
    status ``0``, the httpx exception chained as ``__cause__``.

    Retrying ``enqueue`` after it is always safe: the key comes from the business
    identity, so a retry is at worst a ``Duplicate``, never a second effect. With code
    ``broker_unavailable`` the action is already recorded (``key``) and will be
    published when the broker is back.
    """


#: The exception class for an HTTP status and error code, before the status's alone
#: (:data:`BY_STATUS`).
BY_CODE: Dict[Tuple[int, str], Type[OncelyError]] = {
    (403, "own_request"): OwnRequest,
    (409, "too_late"): TooLate,
    (409, "not_held"): NotHeld,
    (409, "already_decided"): AlreadyDecided,
}

#: The exception class for each HTTP status; any other status raises OncelyError.
BY_STATUS: Dict[int, Type[OncelyError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: RequestInProgress,
    413: PayloadTooLarge,
    429: RateLimited,
    503: Unavailable,
}
