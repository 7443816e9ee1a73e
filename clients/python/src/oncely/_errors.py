from typing import Optional


class OncelyError(Exception):
    """An error answer of the gateway: ``code`` is its stable error code."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        field: Optional[str] = None,
        retry_after: Optional[float] = None,
        key: Optional[str] = None,
    ) -> None:
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))
        self.code = code
        self.message = message
        self.status = status
        self.field = field
        self.retry_after = retry_after
        self.key = key


class InvalidRequest(OncelyError):
    """400: bad input; ``field`` is a JSON Pointer into the request body."""


class Unauthorized(OncelyError):
    """401: no or unknown token."""


class Forbidden(OncelyError):
    """403: the token may not enqueue this action type."""


class NotFound(OncelyError):
    """404: no such operation for this tenant (or no such action type)."""


class RequestInProgress(OncelyError):
    """409: the first request with this Idempotency-Key is still being recorded."""


class PayloadTooLarge(OncelyError):
    """413: the body is over the gateway's limit."""


class Unavailable(OncelyError):
    """503 (or a transport error, code ``transport``): retry after ``retry_after``
    seconds. Retrying ``enqueue`` is always safe. With code ``broker_unavailable`` the
    action is already recorded (``key``) and will run once RabbitMQ is back."""


BY_STATUS = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: RequestInProgress,
    413: PayloadTooLarge,
    503: Unavailable,
}
