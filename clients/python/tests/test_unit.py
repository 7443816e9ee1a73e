"""The client's requests and its mapping of the gateway's answers, against
httpx.MockTransport: no server needed, these always run. The protocol itself is tested
against a real gateway in test_gateway.py."""

import json
import logging
import pickle
import socket
import time
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import httpx
import pytest

import oncely

URL = "http://gw.test"
TOKEN = "secret-token-123"
Handler = Callable[[httpx.Request], httpx.Response]

ACTION: Dict[str, Any] = {
    "key": "v1:ab",
    "action_type": "email.send",
    "status": "succeeded",
    "terminal": True,
    "attempt": 1,
    "result": {"id": "em_1"},
    "provider_operation_id": "em_1",
    "error_code": None,
}
RUNNING: Dict[str, Any] = {**ACTION, "status": "executing", "terminal": False, "result": None, "provider_operation_id": None}
ENQUEUED: Dict[str, Any] = {
    "outcome": "enqueued",
    "key": "v1:ab",
    "status": "planned",
    "links": {"self": "/v1/actions/v1%3Aab", "wait": "/v1/actions/v1%3Aab?wait=30s"},
}
IDENTITY: Dict[str, Any] = {
    "workflow_id": "case-1842",
    "step": "send_approval_notice",
    "business_object": "application-731",
    "revision": 2,
    "payload": {"to": "a@example.test", "subject": "Approved"},
}


def client(handler: Handler, url: str = URL) -> oncely.Client:
    return oncely.Client(url, token=TOKEN, transport=httpx.MockTransport(handler))


def async_client(handler: Handler) -> oncely.AsyncClient:
    return oncely.AsyncClient(URL, token=TOKEN, transport=httpx.MockTransport(handler))


def answer(status: int, body: Any, headers: Optional[Dict[str, str]] = None) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json=body, headers=headers or {})

    return handle


def error(status: int, code: str, message: str = "m", **extra: Any) -> Handler:
    return answer(status, {"error": {"code": code, "message": message, **extra}})


def enqueue(c: oncely.Client, **override: Any) -> oncely.EnqueueResult:
    return c.enqueue("email.send", **{**IDENTITY, **override})


def path_of(request: httpx.Request) -> str:
    return request.url.raw_path.decode().split("?")[0]


# --- enqueue ------------------------------------------------------------------------------


def test_enqueue_sends_the_identity_the_token_and_no_idempotency_header_by_default() -> None:
    seen: List[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json=ENQUEUED)

    with client(handle) as c:
        r = enqueue(c)
    assert r == oncely.Enqueued(key="v1:ab", status="planned", links=ENQUEUED["links"])
    (req,) = seen
    assert req.method == "POST"
    assert path_of(req) == "/v1/actions/email.send"
    assert req.headers["authorization"] == f"Bearer {TOKEN}"
    assert req.headers["content-type"] == "application/json"
    assert req.headers["user-agent"].startswith("oncely-python/")
    assert "idempotency-key" not in req.headers
    assert json.loads(req.content) == IDENTITY


def test_enqueue_sends_the_idempotency_key_header_when_given() -> None:
    seen: List[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json=ENQUEUED)

    with client(handle) as c:
        c.enqueue("email.send", idempotency_key="client-42", **IDENTITY)
    assert seen[0].headers["idempotency-key"] == "client-42"


def test_a_duplicate_is_a_value_with_the_saved_status_and_result() -> None:
    body = {**ENQUEUED, "outcome": "duplicate", "status": "succeeded", "action": ACTION}
    with client(answer(200, body, {"Idempotent-Replayed": "true"})) as c:
        r = enqueue(c)
    assert isinstance(r, oncely.Duplicate)
    assert (r.key, r.status, r.result, r.provider_operation_id, r.error_code) == (
        "v1:ab",
        "succeeded",
        {"id": "em_1"},
        "em_1",
        None,
    )
    assert r.action == oncely.Action.from_json(ACTION)
    assert r.action.terminal and r.action.attempt == 1 and r.action.action_type == "email.send"


def test_a_conflict_is_a_value_not_an_exception() -> None:
    with client(error(422, "conflict", "same identity, other payload", key="v1:ab")) as c:
        r = enqueue(c)
    assert r == oncely.Conflict(key="v1:ab", message="same identity, other payload")


def test_another_422_raises() -> None:
    with client(error(422, "idempotency_key_reused", "used for another request")) as c:
        with pytest.raises(oncely.OncelyError) as e:
            c.enqueue("email.send", idempotency_key="k", **IDENTITY)
    assert type(e.value) is oncely.OncelyError
    assert (e.value.code, e.value.status, e.value.message) == ("idempotency_key_reused", 422, "used for another request")


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (400, "schema_violation", oncely.InvalidRequest),
        (401, "unauthorized", oncely.Unauthorized),
        (403, "forbidden_action_type", oncely.Forbidden),
        (404, "unknown_action_type", oncely.NotFound),
        (409, "request_in_progress", oncely.RequestInProgress),
        (413, "payload_too_large", oncely.PayloadTooLarge),
        (503, "database_unavailable", oncely.Unavailable),
        (500, "internal", oncely.OncelyError),
        (429, "rate_limited", oncely.RateLimited),
        (418, "teapot", oncely.OncelyError),
    ],
)
def test_error_answers_raise_by_status_with_the_gateways_code(status: int, code: str, cls: Type[oncely.OncelyError]) -> None:
    with client(error(status, code, "why", field="/payload/to")) as c:
        with pytest.raises(cls) as e:
            enqueue(c)
    assert type(e.value) is cls
    assert (e.value.code, e.value.message, e.value.status, e.value.field) == (code, "why", status, "/payload/to")
    assert str(e.value) == f"{code}: why (field /payload/to)"


def test_an_error_without_a_field_has_none() -> None:
    with client(error(401, "unauthorized", "no token")) as c:
        with pytest.raises(oncely.Unauthorized) as e:
            c.action_types()
    assert e.value.field is None and e.value.retry_after is None and str(e.value) == "unauthorized: no token"


def test_unavailable_carries_retry_after_seconds_and_the_recorded_key() -> None:
    body = {"error": {"code": "broker_unavailable", "message": "recorded", "key": "v1:ab"}}
    with client(answer(503, body, {"Retry-After": "2"})) as c:
        with pytest.raises(oncely.Unavailable) as e:
            enqueue(c)
    assert (e.value.code, e.value.status, e.value.retry_after, e.value.key) == ("broker_unavailable", 503, 2.0, "v1:ab")


def test_rate_limited_carries_retry_after_seconds() -> None:
    body = {"error": {"code": "rate_limited", "message": "over the token quota"}}
    with client(answer(429, body, {"Retry-After": "3", "RateLimit": '"token";r=0;t=3'})) as c:
        with pytest.raises(oncely.RateLimited) as e:
            enqueue(c)
    assert (e.value.code, e.value.status, e.value.retry_after) == ("rate_limited", 429, 3.0)


def test_retry_after_as_an_http_date() -> None:
    when = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    with client(answer(503, {"error": {"code": "database_unavailable", "message": "m"}}, {"Retry-After": when})) as c:
        with pytest.raises(oncely.Unavailable) as e:
            enqueue(c)
    assert e.value.retry_after is not None and 25 <= e.value.retry_after <= 31


def test_an_error_that_is_not_the_gateways_json_still_maps_by_status() -> None:
    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="<html>bad gateway</html>", headers={"Retry-After": "5"})

    with client(html) as c:
        with pytest.raises(oncely.Unavailable) as e:
            c.status("v1:ab")
    assert (e.value.code, e.value.status, e.value.retry_after) == ("http_503", 503, 5.0)

    with client(lambda r: httpx.Response(502, text="oops")) as c:
        with pytest.raises(oncely.OncelyError) as e2:
            enqueue(c)
    assert (e2.value.code, e2.value.status) == ("http_502", 502)


def test_a_success_answer_that_is_not_the_api_raises_invalid_response() -> None:
    for handler in (answer(200, {"no": "action"}), answer(202, ["a", "list"]), lambda r: httpx.Response(200, text="hi")):
        with client(handler) as c:
            with pytest.raises(oncely.OncelyError) as e:
                enqueue(c)
        assert e.value.code == "invalid_response"


# --- transport ----------------------------------------------------------------------------


@pytest.mark.parametrize("exc", [httpx.ConnectError("refused"), httpx.ReadTimeout("timed out")])
def test_a_transport_error_is_unavailable_with_the_cause_chained(exc: httpx.TransportError) -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise exc

    with client(fail) as c:
        with pytest.raises(oncely.Unavailable) as e:
            enqueue(c)
    assert (e.value.code, e.value.status) == ("transport", 0)
    assert e.value.__cause__ is exc


def test_a_refused_connection_to_a_real_port_is_unavailable() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with oncely.Client(f"http://127.0.0.1:{port}", token=TOKEN, timeout=2) as c:
        with pytest.raises(oncely.Unavailable) as e:
            c.status("v1:ab")
    assert e.value.code == "transport" and isinstance(e.value.__cause__, httpx.ConnectError)


# --- status, wait, action types -----------------------------------------------------------


def test_status_percent_encodes_the_key() -> None:
    seen: List[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ACTION)

    with client(handle) as c:
        a = c.status("v1:ab/c")
    assert a == oncely.Action("v1:ab", "email.send", "succeeded", True, 1, {"id": "em_1"}, "em_1", None)
    assert seen[0].method == "GET" and path_of(seen[0]) == "/v1/actions/v1%3Aab%2Fc"
    assert "wait" not in seen[0].url.params


def test_status_of_an_unknown_key_raises_not_found() -> None:
    with client(error(404, "not_found", "no such operation")) as c:
        with pytest.raises(oncely.NotFound) as e:
            c.status("v1:nope")
    assert e.value.code == "not_found"


def test_a_base_url_with_a_path_prefix_is_kept() -> None:
    seen: List[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(path_of(request))
        return httpx.Response(200, json=ACTION)

    with client(handle, url="http://gw.test/oncely/") as c:
        c.status("v1:ab")
    assert seen == ["/oncely/v1/actions/v1%3Aab"]


def test_wait_asks_the_server_to_hold_and_returns_once_terminal() -> None:
    waits: List[Tuple[str, Optional[str], Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        waits.append((path_of(request), request.url.params.get("wait"), request.extensions["timeout"]["read"]))
        return httpx.Response(200, json=ACTION)

    with client(handle) as c:
        a = c.wait("v1:ab", timeout=1.5)
    assert a.terminal and a.result == {"id": "em_1"}
    (path, wait, read_timeout) = waits[0]
    assert (path, wait) == ("/v1/actions/v1%3Aab", "1500ms")
    assert read_timeout > 11  # 10 s + the wait: the long-poll is not cut by the client's own timeout


def test_a_long_wait_is_split_at_the_servers_limit_and_loops_until_terminal() -> None:
    waits: List[Optional[str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        waits.append(request.url.params.get("wait"))
        # a server holding the request for the whole wait would take 60 s; answer at once
        return httpx.Response(200, json=RUNNING if len(waits) < 3 else ACTION)

    with client(handle) as c:
        a = c.wait("v1:ab", timeout=150)
    assert a.terminal and len(waits) == 3
    assert waits[0] == "60000ms"


def test_wait_returns_the_current_state_when_the_time_is_up() -> None:
    calls: List[str] = []

    def hold(request: httpx.Request) -> httpx.Response:
        wait = request.url.params["wait"]
        calls.append(wait)
        time.sleep(int(wait.removesuffix("ms")) / 1000)  # a server holding until its timeout
        return httpx.Response(200, json=RUNNING)

    started = time.monotonic()
    with client(hold) as c:
        a = c.wait("v1:ab", timeout=0.3)
    assert not a.terminal and a.status == "executing"
    assert 0.3 <= time.monotonic() - started < 2
    assert calls[0] == "300ms"


def test_wait_does_not_hammer_a_server_that_answers_early() -> None:
    calls: List[int] = []

    def early(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(200, json=RUNNING)

    with client(early) as c:
        a = c.wait("v1:ab", timeout=0.6)
    assert not a.terminal
    assert 2 <= len(calls) <= 5


def test_action_types() -> None:
    body = {
        "action_types": [
            {"name": "email.send", "tool": "email_send", "description": "Send one email.", "payload_schema": {"type": "object", "required": ["to", "subject"]}},
            {"name": "ticket.create", "tool": "ticket_create", "description": "", "payload_schema": None},
        ]
    }
    with client(answer(200, body)) as c:
        types = c.action_types()
    assert types == [
        oncely.ActionType("email.send", "email_send", "Send one email.", {"type": "object", "required": ["to", "subject"]}),
        oncely.ActionType("ticket.create", "ticket_create", "", {}),
    ]


def test_empty_arguments_are_refused_before_sending() -> None:
    with client(answer(200, ACTION)) as c:
        with pytest.raises(ValueError):
            c.status("")
        with pytest.raises(ValueError):
            c.enqueue("", **IDENTITY)
    with pytest.raises(ValueError):
        oncely.Client(URL, token="")


# --- schedule, expire, cancel, approve -----------------------------------------------------

HELD: Dict[str, Any] = {
    **RUNNING,
    "status": "awaiting_approval",
    "attempt": 0,
    "held_by_rule": "big_payments",
    "approvals_needed": 2,
    "approval_deadline": "2026-12-09T09:00:00.000Z",
    "not_before": "2026-12-08T09:00:00.000Z",
    "expires_at": "2026-12-10T09:00:00.5+03:00",
}
CANCELLED: Dict[str, Any] = {**RUNNING, "status": "cancelled", "terminal": True, "attempt": 0, "error_code": "cancelled"}


def recorder(status: int, body: Any, seen: List[httpx.Request]) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, json=body)

    return handle


def test_enqueue_sends_not_before_and_expires_at_as_rfc3339() -> None:
    seen: List[httpx.Request] = []
    at = datetime(2026, 12, 8, 12, 0, 0, tzinfo=timezone(timedelta(hours=3)))
    with client(recorder(202, {**ENQUEUED, "status": "deferred"}, seen)) as c:
        r = c.enqueue("email.send", not_before=at, expires_at="2026-12-10T09:00:00+01:00", **IDENTITY)
        assert isinstance(r, oncely.Enqueued) and r.status == "deferred"
        enqueue(c, not_before=datetime(2026, 12, 8, 9, 0, 0, 250000, tzinfo=timezone.utc))
    body = json.loads(seen[0].content)
    assert body == {**IDENTITY, "not_before": "2026-12-08T09:00:00Z", "expires_at": "2026-12-10T09:00:00+01:00"}
    assert json.loads(seen[1].content)["not_before"] == "2026-12-08T09:00:00.250000Z"
    assert "expires_at" not in json.loads(seen[1].content)


def test_a_naive_or_empty_time_is_refused_before_sending() -> None:
    seen: List[httpx.Request] = []
    with client(recorder(202, ENQUEUED, seen)) as c:
        with pytest.raises(ValueError, match="naive"):
            enqueue(c, not_before=datetime(2026, 12, 8, 9, 0, 0))
        with pytest.raises(ValueError, match="naive"):
            enqueue(c, expires_at=datetime.now())
        with pytest.raises(ValueError):
            enqueue(c, expires_at="")
        with pytest.raises(TypeError):
            enqueue(c, not_before=1765184400)
    assert seen == []


def test_a_bad_time_string_is_the_gateways_invalid_request() -> None:
    body = {"error": {"code": "invalid_request", "message": "`not_before` must be an RFC 3339 time", "field": "/not_before"}}
    with client(answer(400, body)) as c:
        with pytest.raises(oncely.InvalidRequest) as e:
            enqueue(c, not_before="tomorrow")
    assert (e.value.code, e.value.field) == ("invalid_request", "/not_before")


def test_an_awaiting_approval_answer_and_the_new_view_fields() -> None:
    with client(answer(202, {**ENQUEUED, "status": "awaiting_approval"})) as c:
        r = enqueue(c)
    assert isinstance(r, oncely.Enqueued) and r.status == "awaiting_approval"

    with client(answer(200, HELD)) as c:
        a = c.status("v1:ab")
    assert (a.status, a.terminal, a.held_by_rule, a.approvals_needed) == ("awaiting_approval", False, "big_payments", 2)
    assert a.approval_deadline == datetime(2026, 12, 9, 9, 0, tzinfo=timezone.utc)
    assert a.not_before == datetime(2026, 12, 8, 9, 0, tzinfo=timezone.utc)
    assert a.expires_at == datetime(2026, 12, 10, 6, 0, 0, 500000, tzinfo=timezone.utc)
    assert a.expires_at is not None and a.expires_at.utcoffset() == timedelta(hours=3)

    plain = oncely.Action.from_json(ACTION)
    assert (plain.held_by_rule, plain.approvals_needed, plain.approval_deadline, plain.not_before, plain.expires_at) == (None,) * 5


def test_a_view_with_a_bad_time_is_an_invalid_response() -> None:
    with client(answer(200, {**HELD, "not_before": "next tuesday"})) as c:
        with pytest.raises(oncely.OncelyError) as e:
            c.status("v1:ab")
    assert e.value.code == "invalid_response"


@pytest.mark.parametrize("status", ["succeeded", "failed_final", "rejected", "cancelled", "expired"])
def test_the_terminal_statuses(status: str) -> None:
    assert status in oncely.TERMINAL_STATUSES
    assert oncely.Action.from_json({"key": "v1:x", "status": status}).terminal
    for live in ("planned", "deferred", "awaiting_approval", "executing", "unknown"):
        assert not oncely.Action.from_json({"key": "v1:x", "status": live}).terminal


def test_cancel_posts_to_the_keys_cancel_and_returns_cancelled() -> None:
    seen: List[httpx.Request] = []
    with client(recorder(200, {"outcome": "cancelled", "action": CANCELLED}, seen)) as c:
        r = c.cancel("v1:ab/c")
    assert r == oncely.Cancelled(key="v1:ab", action=oncely.Action.from_json(CANCELLED))
    assert r.action.status == "cancelled" and r.action.terminal
    (req,) = seen
    assert (req.method, path_of(req)) == ("POST", "/v1/actions/v1%3Aab%2Fc/cancel")
    assert req.headers["authorization"] == f"Bearer {TOKEN}"


def test_a_late_cancel_raises_too_late_with_the_status() -> None:
    body = {"error": {"code": "too_late", "message": "too late to cancel: the action is executing (it may run or have run)", "key": "v1:ab"}}
    with client(answer(409, body)) as c:
        with pytest.raises(oncely.TooLate) as e:
            c.cancel("v1:ab")
    assert (e.value.code, e.value.status, e.value.key, e.value.action_status) == ("too_late", 409, "v1:ab", "executing")
    assert not isinstance(e.value, oncely.RequestInProgress)
    e2 = pickle.loads(pickle.dumps(e.value))
    assert type(e2) is oncely.TooLate and (e2.action_status, e2.key) == ("executing", "v1:ab")
    assert oncely.TooLate("too_late", "some other words", 409).action_status is None


def test_cancel_of_an_unknown_key_is_not_found_and_answers_not_the_api_are_invalid() -> None:
    with client(error(404, "not_found")) as c:
        with pytest.raises(oncely.NotFound):
            c.cancel("v1:nope")
    for body in ({"outcome": "cancelled"}, {"outcome": "something", "action": CANCELLED}):
        with client(answer(200, body)) as c:
            with pytest.raises(oncely.OncelyError) as e:
                c.cancel("v1:ab")
        assert e.value.code == "invalid_response"
    with client(answer(200, {})) as c:
        with pytest.raises(ValueError):
            c.cancel("")


def test_approve_and_reject_post_the_note_and_return_the_decision() -> None:
    seen: List[httpx.Request] = []
    approved = {"outcome": "approved", "action": {**HELD, "status": "planned"}}
    with client(recorder(200, approved, seen)) as c:
        d = c.approve("v1:ab", note="looks right")
        d2 = c.approve("v1:ab")
    assert d == d2
    assert (d.outcome, d.key, d.more_approvals_needed, d.action.status) == ("approved", "v1:ab", None, "planned")
    assert [(r.method, path_of(r)) for r in seen] == [("POST", "/v1/actions/v1%3Aab/approve")] * 2
    assert json.loads(seen[0].content) == {"note": "looks right"}
    assert json.loads(seen[1].content) == {}
    assert seen[0].headers["content-type"] == "application/json"

    recorded = {"outcome": "approval_recorded", "more_approvals_needed": 1, "action": HELD}
    with client(answer(200, recorded)) as c:
        d = c.approve("v1:ab")
    assert (d.outcome, d.more_approvals_needed, d.action.approvals_needed) == ("approval_recorded", 1, 2)

    seen.clear()
    rejected = {"outcome": "rejected", "action": {**HELD, "status": "rejected", "terminal": True, "error_code": "rejected"}}
    with client(recorder(200, rejected, seen)) as c:
        d = c.reject("v1:ab", note="wrong amount")
    assert (d.outcome, d.action.status, d.action.terminal) == ("rejected", "rejected", True)
    assert path_of(seen[0]) == "/v1/actions/v1%3Aab/reject"
    assert json.loads(seen[0].content) == {"note": "wrong amount"}


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (403, "forbidden", oncely.Forbidden),
        (403, "own_request", oncely.OwnRequest),
        (409, "not_held", oncely.NotHeld),
        (409, "already_decided", oncely.AlreadyDecided),
        (404, "not_found", oncely.NotFound),
        (400, "invalid_request", oncely.InvalidRequest),
    ],
)
def test_decision_errors_map_by_code(status: int, code: str, cls: Type[oncely.OncelyError]) -> None:
    with client(error(status, code, "why")) as c:
        with pytest.raises(cls) as e:
            c.approve("v1:ab")
        with pytest.raises(cls):
            c.reject("v1:ab")
    assert type(e.value) is cls and (e.value.code, e.value.status) == (code, status)


def test_own_request_is_a_forbidden_and_an_unknown_409_is_still_request_in_progress() -> None:
    assert issubclass(oncely.OwnRequest, oncely.Forbidden)
    for cls in (oncely.TooLate, oncely.NotHeld, oncely.AlreadyDecided):
        assert not issubclass(cls, oncely.RequestInProgress)
    with client(error(409, "something_new")) as c:
        with pytest.raises(oncely.RequestInProgress):
            c.cancel("v1:ab")
    # a code is trusted only with its status
    with client(error(400, "too_late")) as c:
        with pytest.raises(oncely.InvalidRequest):
            c.cancel("v1:ab")


def test_a_decision_answer_that_is_not_the_api_is_an_invalid_response() -> None:
    for body in ({"outcome": "maybe", "action": HELD}, {"outcome": "approved"}, ["x"]):
        with client(answer(200, body)) as c:
            with pytest.raises(oncely.OncelyError) as e:
                c.approve("v1:ab")
        assert e.value.code == "invalid_response"


@pytest.mark.anyio
async def test_async_schedule_cancel_approve_reject() -> None:
    seen: List[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = path_of(request)
        if path.endswith("/cancel"):
            if len(seen) > 2:
                return httpx.Response(409, json={"error": {"code": "too_late", "message": "too late to cancel: the action is succeeded (it may run or have run)", "key": "v1:ab"}})
            return httpx.Response(200, json={"outcome": "cancelled", "action": CANCELLED})
        if path.endswith("/approve"):
            return httpx.Response(403, json={"error": {"code": "own_request", "message": "no"}})
        if path.endswith("/reject"):
            return httpx.Response(200, json={"outcome": "rejected", "action": {**HELD, "status": "rejected", "terminal": True}})
        return httpx.Response(202, json={**ENQUEUED, "status": "deferred"})

    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    async with async_client(handle) as c:
        r = await c.enqueue("email.send", not_before=soon, expires_at=soon + timedelta(hours=1), **IDENTITY)
        assert isinstance(r, oncely.Enqueued) and r.status == "deferred"
        assert (await c.cancel("v1:ab")).action.status == "cancelled"
        with pytest.raises(oncely.TooLate) as e:
            await c.cancel("v1:ab")
        assert e.value.action_status == "succeeded"
        with pytest.raises(oncely.OwnRequest):
            await c.approve("v1:ab", note="mine")
        d = await c.reject("v1:ab")
        assert d.outcome == "rejected" and d.action.terminal
        with pytest.raises(ValueError):
            await c.enqueue("email.send", not_before=datetime.now(), **IDENTITY)
    sent = json.loads(seen[0].content)
    assert oncely.Action.from_json({"key": "k", "status": "deferred", "not_before": sent["not_before"]}).not_before == soon
    assert json.loads(seen[3].content) == {"note": "mine"}
    assert json.loads(seen[4].content) == {}


# --- secrecy, values, lifecycle -------------------------------------------------------------


def test_the_token_is_in_no_repr_and_nothing_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    c = client(answer(400, {"error": {"code": "schema_violation", "message": "bad", "field": "/payload/to"}}))
    assert TOKEN not in repr(c) and repr(c) == "oncely.Client('http://gw.test')"
    with pytest.raises(oncely.InvalidRequest) as e:
        enqueue(c, payload={"to": "secret@example.test", "subject": "private words"})
    c.close()
    for text in (repr(e.value), str(e.value), caplog.text):
        assert TOKEN not in text and "secret@example.test" not in text and "private words" not in text
    assert TOKEN not in repr(oncely.AsyncClient(URL, token=TOKEN))


def test_values_are_frozen_and_errors_pickle() -> None:
    r = oncely.Conflict(key="v1:ab", message="m")
    with pytest.raises(AttributeError):
        r.key = "other"  # type: ignore[misc]
    e = oncely.Unavailable("broker_unavailable", "m", 503, None, 2.0, key="v1:ab")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is oncely.Unavailable
    assert (e2.code, e2.message, e2.status, e2.retry_after, e2.key) == ("broker_unavailable", "m", 503, 2.0, "v1:ab")


def test_action_from_json_derives_terminal_when_absent() -> None:
    a = oncely.Action.from_json({"key": "v1:x", "status": "failed_final"})
    assert a.terminal and a.attempt == 0 and a.result is None


def test_the_context_manager_closes() -> None:
    with client(answer(200, ACTION)) as c:
        c.status("v1:ab")
    with pytest.raises(RuntimeError):  # httpx: the client has been closed
        c.status("v1:ab")


# --- async ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_enqueue_duplicate_conflict() -> None:
    answers = [
        (202, ENQUEUED),
        (200, {**ENQUEUED, "outcome": "duplicate", "status": "planned", "action": {**RUNNING, "status": "planned"}}),
        (422, {"error": {"code": "conflict", "message": "refused", "key": "v1:ab"}}),
    ]
    seen: List[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, body = answers[len(seen) - 1]
        return httpx.Response(status, json=body)

    async with async_client(handle) as c:
        first = await c.enqueue("email.send", idempotency_key="ik", **IDENTITY)
        again = await c.enqueue("email.send", **IDENTITY)
        other = await c.enqueue("email.send", **{**IDENTITY, "payload": {"to": "b@example.test", "subject": "No"}})
    assert isinstance(first, oncely.Enqueued) and first.key == "v1:ab"
    assert isinstance(again, oncely.Duplicate) and again.status == "planned" and not again.action.terminal
    assert other == oncely.Conflict(key="v1:ab", message="refused")
    assert seen[0].headers["idempotency-key"] == "ik" and seen[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert json.loads(seen[0].content) == IDENTITY


@pytest.mark.anyio
async def test_async_status_wait_action_types_and_errors() -> None:
    calls: List[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url.raw_path.decode()))
        if path_of(request) == "/v1/action-types":
            return httpx.Response(200, json={"action_types": [{"name": "ticket.create", "tool": "ticket_create", "description": "d", "payload_schema": {}}]})
        if path_of(request) == "/v1/actions/v1%3Aother":
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
        return httpx.Response(200, json=ACTION if "wait" in request.url.params else RUNNING)

    c = async_client(handle)
    assert (await c.status("v1:ab")).status == "executing"
    assert (await c.wait("v1:ab", timeout=5)).status == "succeeded"
    assert [t.name for t in await c.action_types()] == ["ticket.create"]
    with pytest.raises(oncely.NotFound):
        await c.status("v1:other")
    await c.close()
    assert calls[1] == "/v1/actions/v1%3Aab?wait=5000ms"


@pytest.mark.anyio
async def test_async_transport_error_is_unavailable() -> None:
    def fail(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out")

    async with async_client(fail) as c:
        with pytest.raises(oncely.Unavailable) as e:
            await c.action_types()
    assert e.value.code == "transport" and isinstance(e.value.__cause__, httpx.ConnectTimeout)


@pytest.mark.anyio
async def test_async_wait_loops_until_terminal() -> None:
    n: List[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        n.append(1)
        return httpx.Response(200, json=RUNNING if len(n) < 3 else ACTION)

    async with async_client(handle) as c:
        a = await c.wait("v1:ab", timeout=10)
    assert a.terminal and len(n) == 3
