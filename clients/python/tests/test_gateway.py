"""The client against a real, running oncely gateway (with workers): set
ONCELY_GATEWAY_URL, ONCELY_GATEWAY_TOKEN (tenant A, all action types),
ONCELY_GATEWAY_TOKEN_B (another tenant) and ONCELY_GATEWAY_TOKEN_LIMITED (ticket.create
only). The oncely integration tests (tests/tests/it/python_client.rs) do."""

import asyncio
import os
import uuid

import pytest

import oncely

URL = os.environ.get("ONCELY_GATEWAY_URL")
pytestmark = pytest.mark.skipif(not URL, reason="ONCELY_GATEWAY_URL is not set (no running gateway)")


def client(var="ONCELY_GATEWAY_TOKEN"):
    return oncely.Client(URL or "", token=os.environ[var])


def email(wf, subject="Approved"):
    return dict(workflow_id=wf, step="notify", business_object="application-1", revision=1, payload={"to": "a@example.test", "subject": subject})


def test_enqueue_duplicate_conflict_wait():
    wf = f"case-{uuid.uuid4().hex}"
    with client() as c:
        first = c.enqueue("email.send", **email(wf))
        assert isinstance(first, oncely.Enqueued) and first.key.startswith("v1:")
        again = c.enqueue("email.send", **email(wf))
        assert isinstance(again, oncely.Duplicate) and again.key == first.key
        other = c.enqueue("email.send", **email(wf, subject="Rejected"))
        assert isinstance(other, oncely.Conflict) and other.key == first.key
        done = c.wait(first.key, timeout=60)
        assert done.terminal and done.status == "succeeded" and isinstance(done.result, dict)
        assert c.status(first.key).status == "succeeded"
        replay = c.enqueue("email.send", **email(wf))
        assert isinstance(replay, oncely.Duplicate) and replay.status == "succeeded" and replay.result == done.result


def test_tenants_tokens_and_schemas():
    wf = f"case-{uuid.uuid4().hex}"
    with client() as a, client("ONCELY_GATEWAY_TOKEN_B") as b, client("ONCELY_GATEWAY_TOKEN_LIMITED") as limited:
        key = a.enqueue("email.send", **email(wf)).key
        with pytest.raises(oncely.NotFound):
            b.status(key)
        with pytest.raises(oncely.Forbidden) as e:
            limited.enqueue("email.send", **email(wf))
        assert e.value.code == "forbidden_action_type"
        assert [t.name for t in limited.action_types()] == ["ticket.create"]
        assert sorted(t.name for t in a.action_types()) == ["email.send", "payment_order.create", "ticket.create"]
        with pytest.raises(oncely.InvalidRequest) as e:
            a.enqueue("email.send", workflow_id=wf, step="s", business_object="o", payload={"to": "a@example.test"})
        assert e.value.code == "schema_violation" and e.value.field == "/payload"
    with oncely.Client(URL or "", token="not-a-token") as nobody:
        with pytest.raises(oncely.Unauthorized):
            nobody.action_types()


def test_the_async_client():
    async def go():
        wf = f"case-{uuid.uuid4().hex}"
        async with oncely.AsyncClient(URL or "", token=os.environ["ONCELY_GATEWAY_TOKEN"]) as c:
            rs = await asyncio.gather(*[c.enqueue("ticket.create", workflow_id=wf, step="open", business_object="o-1", payload={"title": "t"}) for _ in range(5)])
            assert sum(isinstance(r, oncely.Enqueued) for r in rs) == 1
            assert sum(isinstance(r, oncely.Duplicate) for r in rs) == 4
            done = await c.wait(rs[0].key, timeout=60)
            assert done.status == "succeeded"

    asyncio.run(go())
