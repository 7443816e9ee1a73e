"""The client against a REAL running oncely gateway, with workers.

Set ONCELY_GATEWAY_URL, ONCELY_GATEWAY_TOKEN (tenant A, every action type),
ONCELY_GATEWAY_TOKEN_B (another tenant) and ONCELY_GATEWAY_TOKEN_LIMITED (tenant A,
``ticket.create`` only). The gateway must have ``email.send`` (payload schema requiring
the strings ``to`` and ``subject``), ``ticket.create`` and ``payment_order.create``, and
workers running, so operations end ``succeeded`` within seconds. The project's suite runs
this (tests/tests/it/python_client.rs). Without ONCELY_GATEWAY_URL the module is skipped.

The approval tests also need ONCELY_GATEWAY_TOKEN_APPROVER (tenant A, ``approve =
true``) and an approval rule holding every ``payment_order.create``; without that token
they are skipped.
"""

import asyncio
import logging
import os
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterator

import pytest

import oncely

URL = os.environ.get("ONCELY_GATEWAY_URL", "")
if not URL:
    pytest.skip(
        "ONCELY_GATEWAY_URL is not set: these tests need a running oncely gateway "
        "(see clients/python/README.md)",
        allow_module_level=True,
    )

#: Long enough for a worker to run the operation at the sandbox.
SETTLE = 60.0
ALL_TYPES = ["email.send", "payment_order.create", "ticket.create"]


def token(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        pytest.fail(f"{var} must be set along with ONCELY_GATEWAY_URL")
    return value


def new_client(var: str = "ONCELY_GATEWAY_TOKEN") -> oncely.Client:
    return oncely.Client(URL, token=token(var))


@pytest.fixture
def a() -> Iterator[oncely.Client]:
    with new_client() as c:
        yield c


@pytest.fixture
def b() -> Iterator[oncely.Client]:
    with new_client("ONCELY_GATEWAY_TOKEN_B") as c:
        yield c


@pytest.fixture
def limited() -> Iterator[oncely.Client]:
    with new_client("ONCELY_GATEWAY_TOKEN_LIMITED") as c:
        yield c


@pytest.fixture
def approver() -> Iterator[oncely.Client]:
    if not os.environ.get("ONCELY_GATEWAY_TOKEN_APPROVER"):
        pytest.skip("ONCELY_GATEWAY_TOKEN_APPROVER is not set (and the gateway needs an approval rule)")
    with new_client("ONCELY_GATEWAY_TOKEN_APPROVER") as c:
        yield c


@pytest.fixture
def wf() -> str:
    """A workflow id no other test or run uses."""
    return f"pytest-{uuid.uuid4().hex}"


def email(wf: str, subject: str = "Approved", **override: Any) -> Dict[str, Any]:
    args: Dict[str, Any] = {
        "workflow_id": wf,
        "step": "send_approval_notice",
        "business_object": "application-731",
        "revision": 2,
        "payload": {"to": "a@example.test", "subject": subject},
    }
    args.update(override)
    return args


def ticket(wf: str) -> Dict[str, Any]:
    return {
        "workflow_id": wf,
        "step": "open_ticket",
        "business_object": "customer-9",
        "revision": 1,
        "payload": {"title": "Printer on fire", "body": "third floor"},
    }


def payment(wf: str, n: int = 1) -> Dict[str, Any]:
    """A payment order: the approval tests' gateway holds every one of them."""
    return {
        "workflow_id": wf,
        "step": "pay_invoice",
        "business_object": f"invoice-{n}",
        "revision": 1,
        "payload": {"account_id": "example-account", "amount_minor": 125000, "currency": "EUR",
                    "business_reference": f"invoice-{n}"},
    }


def enqueued(r: oncely.EnqueueResult) -> oncely.Enqueued:
    assert isinstance(r, oncely.Enqueued), r
    return r


# --- sync ---------------------------------------------------------------------------------


def test_enqueue_then_the_same_again_is_a_duplicate(a: oncely.Client, wf: str) -> None:
    first = enqueued(a.enqueue("email.send", **email(wf)))
    assert first.key.startswith("v1:")
    assert first.status == "planned"
    assert set(first.links) >= {"self", "wait"}

    again = a.enqueue("email.send", **email(wf))
    assert isinstance(again, oncely.Duplicate), again
    assert again.key == first.key and again.action.key == first.key
    assert again.action.action_type == "email.send"
    assert again.status == again.action.status


def test_the_same_identity_with_another_payload_is_a_conflict(a: oncely.Client, wf: str) -> None:
    first = enqueued(a.enqueue("email.send", **email(wf)))
    other = a.enqueue("email.send", **email(wf, subject="Rejected"))
    assert isinstance(other, oncely.Conflict), other
    assert other.key == first.key and other.message
    # a new revision is a new action, on purpose
    bumped = enqueued(a.enqueue("email.send", **email(wf, subject="Rejected", revision=3)))
    assert bumped.key != first.key


def test_wait_until_succeeded_then_a_repeat_carries_the_saved_result(a: oncely.Client, wf: str) -> None:
    key = enqueued(a.enqueue("email.send", **email(wf))).key
    done = a.wait(key, timeout=SETTLE)
    assert done.key == key and done.action_type == "email.send"
    assert done.terminal and done.status == "succeeded", done
    assert done.result is not None and done.attempt >= 1
    assert a.status(key) == done

    replay = a.enqueue("email.send", **email(wf))
    assert isinstance(replay, oncely.Duplicate), replay
    assert replay.status == "succeeded" and replay.action.terminal
    assert replay.result == done.result
    assert replay.provider_operation_id == done.provider_operation_id


def test_a_short_wait_returns_the_current_state(a: oncely.Client, wf: str) -> None:
    key = enqueued(a.enqueue("ticket.create", **ticket(wf))).key
    started = time.monotonic()
    state = a.wait(key, timeout=0.2)
    assert state.key == key and state.action_type == "ticket.create"
    assert time.monotonic() - started < 5
    assert a.wait(key, timeout=SETTLE).status == "succeeded"


def test_another_tenants_key_is_not_found(a: oncely.Client, b: oncely.Client, wf: str) -> None:
    key = enqueued(a.enqueue("email.send", **email(wf))).key
    with pytest.raises(oncely.NotFound) as e:
        b.status(key)
    assert e.value.status == 404
    with pytest.raises(oncely.NotFound):
        b.wait(key, timeout=1)
    # the tenant is part of the identity: the same request from B is B's own action
    theirs = enqueued(b.enqueue("email.send", **email(wf)))
    assert theirs.key != key
    with pytest.raises(oncely.NotFound):
        a.status("v1:no-such-operation")


def test_a_limited_token_may_enqueue_only_its_types(limited: oncely.Client, wf: str) -> None:
    with pytest.raises(oncely.Forbidden) as e:
        limited.enqueue("email.send", **email(wf))
    assert (e.value.code, e.value.status) == ("forbidden_action_type", 403)
    enqueued(limited.enqueue("ticket.create", **ticket(wf)))
    assert [t.name for t in limited.action_types()] == ["ticket.create"]


def test_a_bad_token_is_unauthorized(wf: str) -> None:
    with oncely.Client(URL, token=f"not-a-token-{uuid.uuid4().hex}") as nobody:
        with pytest.raises(oncely.Unauthorized) as e:
            nobody.enqueue("email.send", **email(wf))
        assert (e.value.code, e.value.status) == ("unauthorized", 401)
        with pytest.raises(oncely.Unauthorized):
            nobody.action_types()
        with pytest.raises(oncely.Unauthorized):
            nobody.status("v1:whatever")


def test_a_schema_violation_is_invalid_request_naming_the_field(a: oncely.Client, wf: str) -> None:
    with pytest.raises(oncely.InvalidRequest) as e:
        a.enqueue("email.send", **email(wf, payload={"to": 42, "subject": "Approved"}))
    assert (e.value.code, e.value.status, e.value.field) == ("schema_violation", 400, "/payload/to")

    with pytest.raises(oncely.InvalidRequest) as e2:
        a.enqueue("email.send", **email(wf, payload={"to": "a@example.test"}))  # no subject
    assert e2.value.code == "schema_violation"
    assert e2.value.field is not None and e2.value.field.startswith("/payload")

    # nothing was recorded: the valid request is new, not a conflict
    enqueued(a.enqueue("email.send", **email(wf)))


def test_an_unknown_action_type_is_not_found(a: oncely.Client, wf: str) -> None:
    with pytest.raises(oncely.NotFound) as e:
        a.enqueue("rocket.launch", **email(wf))
    assert e.value.code == "unknown_action_type"


def test_the_idempotency_key_header(a: oncely.Client, wf: str) -> None:
    ik = f"pytest-{uuid.uuid4().hex}"
    first = enqueued(a.enqueue("email.send", idempotency_key=ik, **email(wf)))
    again = a.enqueue("email.send", idempotency_key=ik, **email(wf))
    assert isinstance(again, oncely.Duplicate) and again.key == first.key
    # the same header value for another request: refused, and not as a Conflict
    with pytest.raises(oncely.OncelyError) as e:
        a.enqueue("email.send", idempotency_key=ik, **email(wf, step="another_step"))
    assert (e.value.code, e.value.status) == ("idempotency_key_reused", 422)


def test_action_types_lists_the_three(a: oncely.Client) -> None:
    types = {t.name: t for t in a.action_types()}
    assert sorted(types) == ALL_TYPES
    assert all(isinstance(t.tool, str) and t.tool for t in types.values())
    schema = types["email.send"].payload_schema
    assert set(schema.get("required", [])) >= {"to", "subject"}


def test_nothing_secret_is_logged(a: oncely.Client, wf: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = f"private-{uuid.uuid4().hex}"
    enqueued(a.enqueue("email.send", **email(wf, subject=secret)))
    assert secret not in caplog.text
    assert token("ONCELY_GATEWAY_TOKEN") not in caplog.text
    assert token("ONCELY_GATEWAY_TOKEN") not in repr(a)


# --- schedule, expire, cancel, approve -------------------------------------------------------


def test_a_scheduled_action_is_deferred_and_cancelled_once_for_good(a: oncely.Client, wf: str) -> None:
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    first = enqueued(a.enqueue("email.send", not_before=later, expires_at=later + timedelta(hours=1), **email(wf)))
    assert first.status == "deferred"
    view = a.status(first.key)
    assert (view.status, view.terminal) == ("deferred", False)
    assert view.not_before == later and view.expires_at == later + timedelta(hours=1)

    # the time is not part of the identity: asked for at another time, it is the same action
    again = a.enqueue("email.send", not_before="2099-01-01T00:00:00Z", **email(wf))
    assert isinstance(again, oncely.Duplicate) and again.key == first.key and again.status == "deferred"

    gone = a.cancel(first.key)
    assert gone.key == first.key
    assert (gone.action.status, gone.action.terminal) == ("cancelled", True)
    # repeating the cancel answers the same
    assert a.cancel(first.key).action.status == "cancelled"
    assert a.wait(first.key, timeout=5).status == "cancelled"
    replay = a.enqueue("email.send", **email(wf))
    assert isinstance(replay, oncely.Duplicate) and replay.status == "cancelled"


def test_cancelling_a_finished_action_is_too_late(a: oncely.Client, b: oncely.Client, wf: str) -> None:
    key = enqueued(a.enqueue("ticket.create", **ticket(wf))).key
    assert a.wait(key, timeout=SETTLE).status == "succeeded"
    with pytest.raises(oncely.TooLate) as e:
        a.cancel(key)
    assert (e.value.code, e.value.status, e.value.key, e.value.action_status) == ("too_late", 409, key, "succeeded")
    assert a.status(key).status == "succeeded"
    with pytest.raises(oncely.NotFound):
        b.cancel(key)
    with pytest.raises(oncely.NotFound):
        a.cancel("v1:no-such-operation")


def test_a_bad_time_is_refused(a: oncely.Client, wf: str) -> None:
    with pytest.raises(oncely.InvalidRequest) as e:
        a.enqueue("email.send", not_before="next tuesday", **email(wf))
    assert (e.value.code, e.value.field) == ("invalid_request", "/not_before")
    with pytest.raises(ValueError):
        a.enqueue("email.send", expires_at=datetime.now(), **email(wf))
    # nothing was recorded
    assert enqueued(a.enqueue("email.send", **email(wf))).status == "planned"


def test_a_held_action_waits_for_an_approver(a: oncely.Client, approver: oncely.Client, wf: str) -> None:
    held = enqueued(a.enqueue("payment_order.create", **payment(wf, 1)))
    assert held.status == "awaiting_approval"
    view = a.status(held.key)
    assert (view.status, view.terminal, view.held_by_rule, view.approvals_needed) == (
        "awaiting_approval", False, "every-payment", 1)
    assert view.approval_deadline is not None and view.approval_deadline > datetime.now(timezone.utc)

    with pytest.raises(oncely.Forbidden) as e:
        a.approve(held.key)  # not an approver token
    assert (e.value.code, e.value.status) == ("forbidden", 403)
    d = approver.approve(held.key, note="invoice checked")
    assert (d.outcome, d.key, d.more_approvals_needed) == ("approved", held.key, None)
    assert d.action.status != "awaiting_approval"
    with pytest.raises(oncely.NotHeld) as e2:
        approver.approve(held.key)
    assert (e2.value.code, e2.value.status) == ("not_held", 409)

    rejected = enqueued(a.enqueue("payment_order.create", **payment(wf, 2))).key
    d = approver.reject(rejected, note="not our supplier")
    assert (d.outcome, d.action.status, d.action.terminal) == ("rejected", "rejected", True)
    assert a.wait(rejected, timeout=5).status == "rejected"
    with pytest.raises(oncely.NotHeld):
        approver.reject(rejected)

    own = enqueued(approver.enqueue("payment_order.create", **payment(wf, 3))).key
    with pytest.raises(oncely.OwnRequest) as e3:
        approver.approve(own)
    assert e3.value.code == "own_request" and isinstance(e3.value, oncely.Forbidden)

    # a held action can be cancelled; approving it then is refused
    assert a.cancel(own).action.status == "cancelled"
    with pytest.raises(oncely.NotHeld):
        approver.approve(own)
    with pytest.raises(oncely.NotFound):
        approver.approve("v1:no-such-operation")


# --- async --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_async_client(wf: str) -> None:
    async with oncely.AsyncClient(URL, token=token("ONCELY_GATEWAY_TOKEN")) as c:
        first = enqueued(await c.enqueue("email.send", **email(wf)))
        again = await c.enqueue("email.send", **email(wf))
        assert isinstance(again, oncely.Duplicate) and again.key == first.key
        other = await c.enqueue("email.send", **email(wf, subject="Rejected"))
        assert isinstance(other, oncely.Conflict) and other.key == first.key

        done = await c.wait(first.key, timeout=SETTLE)
        assert done.terminal and done.status == "succeeded" and done.result is not None
        assert (await c.status(first.key)).status == "succeeded"
        assert sorted(t.name for t in await c.action_types()) == ALL_TYPES

        with pytest.raises(oncely.InvalidRequest) as e:
            await c.enqueue("email.send", **email(wf, payload={"to": 42, "subject": "x"}))
        assert e.value.field == "/payload/to"

    async with oncely.AsyncClient(URL, token=token("ONCELY_GATEWAY_TOKEN_B")) as other_tenant:
        with pytest.raises(oncely.NotFound):
            await other_tenant.status(first.key)


@pytest.mark.anyio
async def test_the_async_client_schedules_cancels_and_decides(approver: oncely.Client, wf: str) -> None:
    later = datetime.now(timezone.utc) + timedelta(minutes=30)
    async with oncely.AsyncClient(URL, token=token("ONCELY_GATEWAY_TOKEN")) as c:
        first = enqueued(await c.enqueue("email.send", not_before=later, **email(wf)))
        assert first.status == "deferred"
        assert (await c.cancel(first.key)).action.status == "cancelled"
        assert (await c.cancel(first.key)).action.terminal

        done = enqueued(await c.enqueue("ticket.create", **ticket(wf))).key
        assert (await c.wait(done, timeout=SETTLE)).status == "succeeded"
        with pytest.raises(oncely.TooLate) as e:
            await c.cancel(done)
        assert e.value.action_status == "succeeded"

        held = enqueued(await c.enqueue("payment_order.create", **payment(wf))).key
        with pytest.raises(oncely.Forbidden):
            await c.reject(held)
    async with oncely.AsyncClient(URL, token=token("ONCELY_GATEWAY_TOKEN_APPROVER")) as ok:
        d = await ok.reject(held, note="async")
        assert d.outcome == "rejected" and d.action.terminal
        with pytest.raises(oncely.NotHeld):
            await ok.approve(held)


@pytest.mark.anyio
async def test_concurrent_repeats_run_once(wf: str) -> None:
    async with oncely.AsyncClient(URL, token=token("ONCELY_GATEWAY_TOKEN")) as c:
        rs = await asyncio.gather(*[c.enqueue("ticket.create", **ticket(wf)) for _ in range(5)])
        assert sum(isinstance(r, oncely.Enqueued) for r in rs) == 1, rs
        assert sum(isinstance(r, oncely.Duplicate) for r in rs) == 4, rs
        assert len({r.key for r in rs}) == 1
        done = await c.wait(rs[0].key, timeout=SETTLE)
        assert done.status == "succeeded" and done.attempt >= 1
