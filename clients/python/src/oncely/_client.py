from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import quote

import httpx

from ._errors import BY_STATUS, OncelyError, Unavailable
from ._types import Action, ActionType, Conflict, Duplicate, Enqueued, EnqueueResult

#: The longest wait the gateway grants per request; longer waits loop.
SERVER_MAX_WAIT = 60.0


def _request(
    action_type: str,
    workflow_id: str,
    step: str,
    business_object: str,
    revision: int,
    payload: Mapping[str, Any],
    idempotency_key: Optional[str],
) -> Tuple[str, Dict[str, Any], Dict[str, str]]:
    body = {
        "workflow_id": workflow_id,
        "step": step,
        "business_object": business_object,
        "revision": revision,
        "payload": dict(payload),
    }
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    return f"/v1/actions/{quote(action_type, safe='')}", body, headers


def _error(r: httpx.Response) -> OncelyError:
    try:
        e = r.json().get("error", {})
    except ValueError:
        e = {}
    retry_after: Optional[float] = None
    if "retry-after" in r.headers:
        try:
            retry_after = float(r.headers["retry-after"])
        except ValueError:
            retry_after = None
    cls = BY_STATUS.get(r.status_code, OncelyError)
    return cls(
        code=str(e.get("code", f"http_{r.status_code}")),
        message=str(e.get("message", r.reason_phrase)),
        status=r.status_code,
        field=e.get("field"),
        retry_after=retry_after,
        key=e.get("key"),
    )


def _enqueue_result(r: httpx.Response) -> EnqueueResult:
    if r.status_code == 202:
        d = r.json()
        return Enqueued(key=d["key"], status=d["status"], links=dict(d.get("links", {})))
    if r.status_code == 200:
        d = r.json()
        action = Action.from_json(d["action"])
        return Duplicate(
            key=d["key"],
            status=action.status,
            result=action.result,
            provider_operation_id=action.provider_operation_id,
            error_code=action.error_code,
            action=action,
        )
    err = _error(r)
    if r.status_code == 422 and err.code == "conflict":
        return Conflict(key=err.key or "", message=err.message)
    raise err


def _action(r: httpx.Response) -> Action:
    if r.status_code != 200:
        raise _error(r)
    return Action.from_json(r.json())


def _wait_param(seconds: float) -> str:
    return f"{max(0, int(seconds * 1000))}ms"


def _transport(e: Exception) -> Unavailable:
    u = Unavailable(code="transport", message=str(e) or type(e).__name__, status=0)
    u.__cause__ = e
    return u


def _key_path(key: str) -> str:
    return f"/v1/actions/{quote(key, safe='')}"


class Client:
    """A synchronous client. Retrying ``enqueue`` after ``Unavailable`` is always safe."""

    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def __repr__(self) -> str:
        return f"oncely.Client({str(self._http.base_url)!r})"

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, method: str, path: str, timeout: Optional[float] = None, **kw: Any) -> httpx.Response:
        try:
            if timeout is not None:
                kw["timeout"] = timeout
            return self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise _transport(e) from e

    def enqueue(
        self,
        action_type: str,
        *,
        workflow_id: str,
        step: str,
        business_object: str,
        revision: int = 1,
        payload: Mapping[str, Any],
        idempotency_key: Optional[str] = None,
    ) -> EnqueueResult:
        """Enqueue an action: ``Enqueued`` (new), ``Duplicate`` (requested before) or
        ``Conflict`` (same identity, other payload: refused)."""
        path, body, headers = _request(action_type, workflow_id, step, business_object, revision, payload, idempotency_key)
        return _enqueue_result(self._send("POST", path, json=body, headers=headers))

    def status(self, key: str) -> Action:
        """The operation's status and result."""
        return _action(self._send("GET", _key_path(key)))

    def wait(self, key: str, timeout: float = 30.0) -> Action:
        """Wait until the operation is terminal or ``timeout`` seconds pass; returns it
        either way (check ``.terminal``)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = min(SERVER_MAX_WAIT, max(0.0, deadline - time.monotonic()))
            a = _action(self._send("GET", _key_path(key), params={"wait": _wait_param(left)}, timeout=left + 10))
            if a.terminal or time.monotonic() >= deadline:
                return a

    def action_types(self) -> List[ActionType]:
        """The action types this token may enqueue, with their payload schemas."""
        r = self._send("GET", "/v1/action-types")
        if r.status_code != 200:
            raise _error(r)
        return [ActionType(**t) for t in r.json()["action_types"]]


class AsyncClient:
    """The asyncio twin of :class:`Client`."""

    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )

    def __repr__(self) -> str:
        return f"oncely.AsyncClient({str(self._http.base_url)!r})"

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, method: str, path: str, timeout: Optional[float] = None, **kw: Any) -> httpx.Response:
        try:
            if timeout is not None:
                kw["timeout"] = timeout
            return await self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise _transport(e) from e

    async def enqueue(
        self,
        action_type: str,
        *,
        workflow_id: str,
        step: str,
        business_object: str,
        revision: int = 1,
        payload: Mapping[str, Any],
        idempotency_key: Optional[str] = None,
    ) -> EnqueueResult:
        """See :meth:`Client.enqueue`."""
        path, body, headers = _request(action_type, workflow_id, step, business_object, revision, payload, idempotency_key)
        return _enqueue_result(await self._send("POST", path, json=body, headers=headers))

    async def status(self, key: str) -> Action:
        """See :meth:`Client.status`."""
        return _action(await self._send("GET", _key_path(key)))

    async def wait(self, key: str, timeout: float = 30.0) -> Action:
        """See :meth:`Client.wait`."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            left = min(SERVER_MAX_WAIT, max(0.0, deadline - time.monotonic()))
            a = _action(await self._send("GET", _key_path(key), params={"wait": _wait_param(left)}, timeout=left + 10))
            if a.terminal or time.monotonic() >= deadline:
                return a

    async def action_types(self) -> List[ActionType]:
        """See :meth:`Client.action_types`."""
        r = await self._send("GET", "/v1/action-types")
        if r.status_code != 200:
            raise _error(r)
        return [ActionType(**t) for t in r.json()["action_types"]]
