"""The client's mapping of the gateway's answers, against httpx.MockTransport (no server).
The protocol itself is tested against a real gateway in test_gateway.py."""

import asyncio
import json

import httpx
import pytest

import oncely
from oncely import _client


def client_with(handler):
    c = oncely.Client("http://gw.test", token="secret-token")
    c._http = httpx.Client(base_url="http://gw.test", transport=httpx.MockTransport(handler), headers={"Authorization": "Bearer secret-token"})
    return c


def answer(status, body, headers=None):
    return lambda request: httpx.Response(status, json=body, headers=headers or {})


ACTION = {"key": "v1:ab", "action_type": "email.send", "status": "succeeded", "terminal": True, "attempt": 1, "result": {"id": "em_1"}, "provider_operation_id": "em_1", "error_code": None}


def test_the_request_carries_the_identity_token_and_header():
    seen = {}

    def handler(request):
        seen["path"] = request.url.raw_path.decode()
        seen["auth"] = request.headers["authorization"]
        seen["ikey"] = request.headers.get("idempotency-key")
        seen["body"] = json.loads(request.content)
        return httpx.Response(202, json={"outcome": "enqueued", "key": "v1:ab", "status": "planned", "links": {"self": "/v1/actions/v1%3Aab"}})

    r = client_with(handler).enqueue("email.send", workflow_id="w", step="s", business_object="o", revision=2, payload={"to": "x"}, idempotency_key="ck")
    assert r == oncely.Enqueued(key="v1:ab", status="planned", links={"self": "/v1/actions/v1%3Aab"})
    assert seen == {"path": "/v1/actions/email.send", "auth": "Bearer secret-token", "ikey": "ck", "body": {"workflow_id": "w", "step": "s", "business_object": "o", "revision": 2, "payload": {"to": "x"}}}


def test_duplicate_and_conflict_are_values():
    d = client_with(answer(200, {"outcome": "duplicate", "key": "v1:ab", "status": "succeeded", "action": ACTION}, {"Idempotent-Replayed": "true"})).enqueue("email.send", workflow_id="w", step="s", business_object="o", payload={})
    assert isinstance(d, oncely.Duplicate) and d.result == {"id": "em_1"} and d.action.terminal
    c = client_with(answer(422, {"error": {"code": "conflict", "message": "refused", "key": "v1:ab"}})).enqueue("email.send", workflow_id="w", step="s", business_object="o", payload={})
    assert c == oncely.Conflict(key="v1:ab", message="refused")


@pytest.mark.parametrize(
    "status,code,cls",
    [(400, "schema_violation", oncely.InvalidRequest), (401, "unauthorized", oncely.Unauthorized), (403, "forbidden_action_type", oncely.Forbidden), (404, "not_found", oncely.NotFound), (409, "request_in_progress", oncely.RequestInProgress), (413, "payload_too_large", oncely.PayloadTooLarge), (422, "idempotency_key_reused", oncely.OncelyError), (500, "internal", oncely.OncelyError)],
)
def test_errors_are_exceptions_with_the_code(status, code, cls):
    c = client_with(answer(status, {"error": {"code": code, "message": "m", "field": "/payload/to"}}))
    with pytest.raises(cls) as e:
        c.enqueue("email.send", workflow_id="w", step="s", business_object="o", payload={})
    assert (e.value.code, e.value.status, e.value.field) == (code, status, "/payload/to")


def test_unavailable_carries_retry_after_and_the_recorded_key():
    c = client_with(answer(503, {"error": {"code": "broker_unavailable", "message": "m", "key": "v1:ab"}}, {"Retry-After": "2"}))
    with pytest.raises(oncely.Unavailable) as e:
        c.enqueue("email.send", workflow_id="w", step="s", business_object="o", payload={})
    assert (e.value.retry_after, e.value.key) == (2.0, "v1:ab")


def test_a_transport_error_is_unavailable():
    def refuse(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(oncely.Unavailable) as e:
        client_with(refuse).status("v1:ab")
    assert e.value.code == "transport" and isinstance(e.value.__cause__, httpx.ConnectError)


def test_keys_are_percent_encoded_and_wait_loops_until_terminal(monkeypatch):
    monkeypatch.setattr(_client, "SERVER_MAX_WAIT", 0.01)
    calls = []

    def handler(request):
        calls.append((request.url.raw_path.decode().split("?")[0], request.url.params.get("wait")))
        return httpx.Response(200, json={**ACTION, "status": "executing", "terminal": False} if len(calls) < 3 else ACTION)

    a = client_with(handler).wait("v1:ab", timeout=5)
    assert a.terminal and a.result == {"id": "em_1"}
    assert len(calls) == 3 and calls[0][0] == "/v1/actions/v1%3Aab" and calls[0][1].endswith("ms")


def test_the_token_is_not_in_the_repr():
    c = oncely.Client("http://gw.test", token="secret-token")
    assert "secret-token" not in repr(c) and "secret-token" not in repr(c.__dict__.get("_http"))


def test_the_async_client_maps_the_same_way():
    async def go():
        c = oncely.AsyncClient("http://gw.test", token="t")
        c._http = httpx.AsyncClient(base_url="http://gw.test", transport=httpx.MockTransport(answer(200, ACTION)))
        async with c:
            return await c.status("v1:ab")

    assert asyncio.run(go()) == oncely.Action.from_json(ACTION)
