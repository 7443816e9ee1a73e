"""The synchronous and asynchronous clients.

The protocol (building requests, reading answers) lives in module functions shared by
both; the two classes only send. Nothing here logs: not the payload, not the token.
"""

import asyncio
import email.utils
import math
import time
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Type, Union
from urllib.parse import quote

import httpx

from ._errors import BY_CODE, BY_STATUS, OncelyError, Unavailable
from ._types import (
    Action,
    ActionType,
    Cancelled,
    Conflict,
    Decision,
    Duplicate,
    Enqueued,
    EnqueueResult,
    format_time,
)
from ._version import __version__

__all__ = ["AsyncClient", "Client", "SERVER_MAX_WAIT"]

#: The longest wait the gateway grants in one request (seconds); longer waits loop.
SERVER_MAX_WAIT = 60.0

#: A long-poll that comes back early and not terminal is not repeated sooner than this.
_MIN_POLL_INTERVAL = 0.25

#: ``not_before`` / ``expires_at``: a timezone-aware datetime or an RFC 3339 string.
Time = Union[datetime, str]


# --- requests ---------------------------------------------------------------------------


def _quote_segment(value: str) -> str:
    """Percent-encode one path segment (keys hold ':' — ``v1%3A…``)."""
    return quote(value, safe="")


def _action_path(key: str) -> str:
    if not key:
        raise ValueError("key must not be empty")
    return f"/v1/actions/{_quote_segment(key)}"


def _enqueue_path(action_type: str) -> str:
    if not action_type:
        raise ValueError("action_type must not be empty")
    return f"/v1/actions/{_quote_segment(action_type)}"


def _control_path(key: str, verb: str) -> str:
    return f"{_action_path(key)}/{verb}"


def _enqueue_body(
    workflow_id: str,
    step: str,
    business_object: str,
    revision: int,
    payload: Mapping[str, Any],
    not_before: Optional[Time] = None,
    expires_at: Optional[Time] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {
        "workflow_id": workflow_id,
        "step": step,
        "business_object": business_object,
        "revision": revision,
        "payload": dict(payload),
    }
    if not_before is not None:
        body["not_before"] = format_time(not_before)
    if expires_at is not None:
        body["expires_at"] = format_time(expires_at)
    return body


def _decision_body(note: Optional[str]) -> Dict[str, Any]:
    return {} if note is None else {"note": note}


def _enqueue_headers(idempotency_key: Optional[str]) -> Dict[str, str]:
    return {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}


def _wait_param(seconds: float) -> str:
    """The ``wait`` query value: whole milliseconds, rounded up, at most the server's max."""
    ms = math.ceil(min(max(seconds, 0.0), SERVER_MAX_WAIT) * 1000)
    return f"{ms}ms"


def _headers(token: str) -> Dict[str, str]:
    if not token:
        raise ValueError("token must not be empty")
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "User-Agent": f"oncely-python/{__version__}",
    }


# --- answers ----------------------------------------------------------------------------


def _retry_after(r: httpx.Response) -> Optional[float]:
    """``Retry-After`` in seconds: delta-seconds, or an HTTP date from now."""
    value = r.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _json_object(r: httpx.Response) -> Optional[Dict[str, Any]]:
    try:
        data = r.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _error(r: httpx.Response) -> OncelyError:
    """The exception for an error answer, by status; the gateway's code when it gave one."""
    body = _json_object(r) or {}
    err = body.get("error")
    if not isinstance(err, dict):
        err = {}
    field = err.get("field")
    key = err.get("key")
    code = str(err.get("code") or f"http_{r.status_code}")
    cls = BY_CODE.get((r.status_code, code)) or BY_STATUS.get(r.status_code, OncelyError)
    return cls(
        code=code,
        message=str(err.get("message") or r.reason_phrase or f"HTTP {r.status_code}"),
        status=r.status_code,
        field=str(field) if field is not None else None,
        retry_after=_retry_after(r),
        key=str(key) if key is not None else None,
    )


def _invalid(r: httpx.Response, cause: Optional[BaseException] = None) -> NoReturn:
    e = OncelyError(
        code="invalid_response",
        message=f"the gateway's answer (HTTP {r.status_code}) is not what the API documents",
        status=r.status_code,
    )
    raise e from cause


def _enqueue_result(r: httpx.Response) -> EnqueueResult:
    if r.status_code in (200, 202):
        body = _json_object(r)
        if body is None:
            _invalid(r)
        try:
            if r.status_code == 202:
                links = body.get("links") or {}
                return Enqueued(
                    key=str(body["key"]),
                    status=str(body.get("status") or "planned"),
                    links={str(k): str(v) for k, v in dict(links).items()},
                )
            action = Action.from_json(body["action"])
            return Duplicate(
                key=str(body.get("key") or action.key),
                status=str(body.get("status") or action.status),
                result=action.result,
                provider_operation_id=action.provider_operation_id,
                error_code=action.error_code,
                action=action,
            )
        except (KeyError, TypeError, ValueError) as e:
            _invalid(r, e)
    err = _error(r)
    if r.status_code == 422 and err.code == "conflict":
        return Conflict(key=err.key or "", message=err.message)
    raise err


def _action(r: httpx.Response) -> Action:
    if r.status_code != 200:
        raise _error(r)
    body = _json_object(r)
    if body is None:
        _invalid(r)
    try:
        return Action.from_json(body)
    except (KeyError, TypeError, ValueError) as e:
        _invalid(r, e)


def _cancelled(r: httpx.Response) -> Cancelled:
    if r.status_code != 200:
        raise _error(r)
    body = _json_object(r)
    if body is None:
        _invalid(r)
    try:
        return Cancelled.from_json(body)
    except (KeyError, TypeError, ValueError) as e:
        _invalid(r, e)


def _decision(r: httpx.Response) -> Decision:
    if r.status_code != 200:
        raise _error(r)
    body = _json_object(r)
    if body is None:
        _invalid(r)
    try:
        return Decision.from_json(body)
    except (KeyError, TypeError, ValueError) as e:
        _invalid(r, e)


def _action_types(r: httpx.Response) -> List[ActionType]:
    if r.status_code != 200:
        raise _error(r)
    body = _json_object(r)
    if body is None:
        _invalid(r)
    try:
        return [ActionType.from_json(t) for t in body["action_types"]]
    except (KeyError, TypeError, ValueError) as e:
        _invalid(r, e)


def _transport(e: httpx.TransportError) -> Unavailable:
    detail = str(e) or type(e).__name__
    return Unavailable(code="transport", message=f"{type(e).__name__}: {detail}", status=0)


def _wait_timeout(base: float, chunk: float) -> httpx.Timeout:
    # The long-poll holds the answer for up to `chunk` seconds: read that much longer.
    return httpx.Timeout(base, read=base + chunk)


def _early_poll_pause(started: float, chunk: float, deadline: float) -> float:
    """How long to pause before asking again when a long-poll came back not terminal:
    zero when it ran its course; a short pause when it came back early, so a server or
    proxy that ignores ``wait`` is not hammered."""
    now = time.monotonic()
    if now - started >= chunk - 0.05:
        return 0.0
    return max(0.0, min(_MIN_POLL_INTERVAL, deadline - now))


# --- the clients ------------------------------------------------------------------------


class Client:
    """A synchronous client of the oncely gateway.

    ``Client(url, token, timeout=10.0)``; use it as a context manager or call
    :meth:`close`. Thread-safe (one httpx connection pool). It never retries by itself:
    retrying :meth:`enqueue` after :class:`~oncely.Unavailable` is always safe, because
    the key comes from the business identity — a retry is at worst a ``Duplicate``.
    """

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float = 10.0,
        *,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._timeout = float(timeout)
        self._http = httpx.Client(
            base_url=self._url,
            headers=_headers(token),
            timeout=self._timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"oncely.Client({self._url!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return self._http.send(request)
        except httpx.TransportError as e:
            raise _transport(e) from e

    def enqueue(
        self,
        action_type: str,
        *,
        workflow_id: str,
        step: str,
        business_object: str,
        revision: int,
        payload: Mapping[str, Any],
        idempotency_key: Optional[str] = None,
        not_before: Optional[Time] = None,
        expires_at: Optional[Time] = None,
    ) -> EnqueueResult:
        """Ask for an action once.

        Returns :class:`Enqueued` (new: it will run once), :class:`Duplicate` (asked
        before: nothing new happens; the saved status and result) or :class:`Conflict`
        (the same identity with another payload: refused). Raises :class:`OncelyError`
        subclasses for error answers. ``idempotency_key`` sends the optional
        ``Idempotency-Key`` header.

        ``not_before``: deliver no earlier than this (the answer's status is
        ``deferred``); ``expires_at``: not started by then, it ends ``expired``, never
        sent. Each is a timezone-aware ``datetime`` (a naive one raises ``ValueError``)
        or an RFC 3339 string, sent as it is (the gateway refuses a bad one:
        :class:`InvalidRequest`, field ``/not_before``). Neither is part of the
        identity: the same action asked for at another time is a :class:`Duplicate`.
        """
        request = self._http.build_request(
            "POST",
            _enqueue_path(action_type),
            json=_enqueue_body(
                workflow_id, step, business_object, revision, payload, not_before, expires_at
            ),
            headers=_enqueue_headers(idempotency_key),
        )
        return _enqueue_result(self._send(request))

    def status(self, key: str) -> Action:
        """The operation's current state. :class:`NotFound` for an unknown key or one of
        another tenant."""
        return _action(self._send(self._http.build_request("GET", _action_path(key))))

    def wait(self, key: str, timeout: float = 30.0) -> Action:
        """Long-poll until the operation is terminal or ``timeout`` seconds pass, and
        return it either way (check ``.terminal``). Waits beyond the gateway's 60 s
        limit are made of several requests."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            chunk = min(SERVER_MAX_WAIT, max(0.0, deadline - time.monotonic()))
            started = time.monotonic()
            request = self._http.build_request(
                "GET",
                _action_path(key),
                params={"wait": _wait_param(chunk)},
                timeout=_wait_timeout(self._timeout, chunk),
            )
            action = _action(self._send(request))
            if action.terminal or time.monotonic() >= deadline:
                return action
            pause = _early_poll_pause(started, chunk, deadline)
            if pause > 0:
                time.sleep(pause)

    def cancel(self, key: str) -> Cancelled:
        """Cancel the action before it is sent: on return it never will be. Repeating it
        answers the same :class:`Cancelled`.

        Raises :class:`TooLate` when a worker took it first or it had already ended
        (``e.action_status`` names its status: it may run or have run),
        :class:`NotFound` for an unknown key or one of another tenant. Any token of the
        action's tenant may cancel.
        """
        request = self._http.build_request("POST", _control_path(key, "cancel"))
        return _cancelled(self._send(request))

    def approve(self, key: str, note: Optional[str] = None) -> Decision:
        """Approve an action an approval rule holds (``awaiting_approval``); ``note``
        goes to the audit trail (at most 2,000 characters).

        Returns a :class:`Decision`: ``approved`` (due now, or at its ``not_before``)
        or ``approval_recorded`` (four eyes: ``more_approvals_needed`` more). Needs a
        token with ``approve = true``, of the action's tenant: else :class:`Forbidden`
        (code ``forbidden``); :class:`OwnRequest` for the token that asked for it,
        :class:`NotHeld` when it is not awaiting approval, :class:`AlreadyDecided`
        when this token decided on it before, :class:`NotFound`.
        """
        return self._decide(key, "approve", note)

    def reject(self, key: str, note: Optional[str] = None) -> Decision:
        """Reject a held action: it ends ``rejected``, never sent (the
        :class:`Decision`'s outcome is ``rejected``). The errors of :meth:`approve`."""
        return self._decide(key, "reject", note)

    def _decide(self, key: str, verb: str, note: Optional[str]) -> Decision:
        request = self._http.build_request(
            "POST", _control_path(key, verb), json=_decision_body(note)
        )
        return _decision(self._send(request))

    def action_types(self) -> List[ActionType]:
        """The action types this token may enqueue, with their payload schemas."""
        return _action_types(self._send(self._http.build_request("GET", "/v1/action-types")))


class AsyncClient:
    """The asyncio twin of :class:`Client`: the same methods, awaited.

    ``async with AsyncClient(url, token) as c: await c.enqueue(...)``, or
    ``await c.close()``.
    """

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float = 10.0,
        *,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self._url = url.rstrip("/")
        self._timeout = float(timeout)
        self._http = httpx.AsyncClient(
            base_url=self._url,
            headers=_headers(token),
            timeout=self._timeout,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"oncely.AsyncClient({self._url!r})"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def aclose(self) -> None:
        """The same as :meth:`close` (httpx's name)."""
        await self.close()

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._http.send(request)
        except httpx.TransportError as e:
            raise _transport(e) from e

    async def enqueue(
        self,
        action_type: str,
        *,
        workflow_id: str,
        step: str,
        business_object: str,
        revision: int,
        payload: Mapping[str, Any],
        idempotency_key: Optional[str] = None,
        not_before: Optional[Time] = None,
        expires_at: Optional[Time] = None,
    ) -> EnqueueResult:
        """See :meth:`Client.enqueue`."""
        request = self._http.build_request(
            "POST",
            _enqueue_path(action_type),
            json=_enqueue_body(
                workflow_id, step, business_object, revision, payload, not_before, expires_at
            ),
            headers=_enqueue_headers(idempotency_key),
        )
        return _enqueue_result(await self._send(request))

    async def status(self, key: str) -> Action:
        """See :meth:`Client.status`."""
        return _action(await self._send(self._http.build_request("GET", _action_path(key))))

    async def wait(self, key: str, timeout: float = 30.0) -> Action:
        """See :meth:`Client.wait`."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            chunk = min(SERVER_MAX_WAIT, max(0.0, deadline - time.monotonic()))
            started = time.monotonic()
            request = self._http.build_request(
                "GET",
                _action_path(key),
                params={"wait": _wait_param(chunk)},
                timeout=_wait_timeout(self._timeout, chunk),
            )
            action = _action(await self._send(request))
            if action.terminal or time.monotonic() >= deadline:
                return action
            pause = _early_poll_pause(started, chunk, deadline)
            if pause > 0:
                await asyncio.sleep(pause)

    async def cancel(self, key: str) -> Cancelled:
        """See :meth:`Client.cancel`."""
        return _cancelled(
            await self._send(self._http.build_request("POST", _control_path(key, "cancel")))
        )

    async def approve(self, key: str, note: Optional[str] = None) -> Decision:
        """See :meth:`Client.approve`."""
        return await self._decide(key, "approve", note)

    async def reject(self, key: str, note: Optional[str] = None) -> Decision:
        """See :meth:`Client.reject`."""
        return await self._decide(key, "reject", note)

    async def _decide(self, key: str, verb: str, note: Optional[str]) -> Decision:
        request = self._http.build_request(
            "POST", _control_path(key, verb), json=_decision_body(note)
        )
        return _decision(await self._send(request))

    async def action_types(self) -> List[ActionType]:
        """See :meth:`Client.action_types`."""
        return _action_types(
            await self._send(self._http.build_request("GET", "/v1/action-types"))
        )
