"""An MCP agent host none of us wrote: the official Python MCP SDK (PyPI `mcp`) against a
running oncely-gateway, over streamable HTTP (/mcp) and over stdio (`oncely-gateway mcp
--stdio`). Run by tests/tests/it/mcp.rs, which checks the effects at the sandbox.

Environment: ONCELY_MCP_URL, ONCELY_GATEWAY_TOKEN, ONCELY_GATEWAY_BIN, and for the stdio
server ONCELY_CONFIG, ONCELY_GATEWAY_TOKENS_FILE, ONCELY_KEY_SECRET.
Prints PASS/FAIL lines, then one JSON line {"keys": [...]} with every key it queued.
"""

import asyncio
import json
import os
import sys
import uuid

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

URL = os.environ["ONCELY_MCP_URL"]
TOKEN = os.environ["ONCELY_GATEWAY_TOKEN"]
passed = 0
failed = 0
queued_keys: list = []
cancelled_keys: list = []


def check(label: str, cond: bool, detail: str = "") -> None:
    global passed, failed
    if cond:
        passed += 1
        print(f"  PASS {label}")
    else:
        failed += 1
        print(f"  FAIL {label} {detail}")


def text_of(result) -> str:
    return "\n".join(c.text for c in result.content if getattr(c, "type", None) == "text")


def args(wf: str, **payload_overrides):
    payload = {"to": "bob@example.test", "subject": "Invoice 42"}
    payload.update(payload_overrides)
    return {"workflow_id": wf, "step": "notify-customer", "business_object": "invoice-42", "payload": payload}


async def scenario(client: Client, label: str) -> None:
    print(f"[{label}] protocol version {client.protocol_version}")
    tools = await client.list_tools()
    names = sorted(t.name for t in tools.tools)
    check(
        "list_tools: one tool per action type + status + wait + cancel",
        names == ["action_cancel", "action_status", "action_wait", "email_send", "payment_order_create", "ticket_create"],
        str(names),
    )
    email = next(t for t in tools.tools if t.name == "email_send")
    check("email_send's payload schema is the configured one", email.input_schema["properties"]["payload"]["required"] == ["to", "subject"], json.dumps(email.input_schema))

    # The same call five times in a row: one queued, four "already requested".
    wf = f"case-{uuid.uuid4().hex[:8]}"
    seq = [await client.call_tool("email_send", args(wf)) for _ in range(5)]
    texts = [text_of(r) for r in seq]
    print(f"  first: {texts[0]}\n  second: {texts[1]}")
    check("x5 sequential: 1 queued, 4 already requested", sum(t.startswith("queued:") for t in texts) == 1 and sum(t.startswith("already requested earlier") for t in texts) == 4, str(texts))
    key = seq[0].structured_content["key"]
    queued_keys.append(key)

    # Five at once (a model that timed out and re-called, in parallel).
    wf2 = f"case-{uuid.uuid4().hex[:8]}"
    conc = await asyncio.gather(*[client.call_tool("email_send", args(wf2)) for _ in range(5)])
    ctexts = [text_of(r) for r in conc]
    check("x5 concurrent: 1 queued, 4 already requested", sum(t.startswith("queued:") for t in ctexts) == 1 and sum(t.startswith("already requested earlier") for t in ctexts) == 4, str(ctexts))
    # Whichever of the five was first to record is the queued one.
    queued_keys.extend(r.structured_content["key"] for r in conc if text_of(r).startswith("queued:"))

    waited = await client.call_tool("action_wait", {"key": key, "timeout_seconds": 30})
    print(f"  action_wait: {text_of(waited)}")
    action = (waited.structured_content or {}).get("action", {})
    check("action_wait returns succeeded with the provider's result", not waited.is_error and action.get("status") == "succeeded" and isinstance(action.get("result"), dict), text_of(waited))
    status = await client.call_tool("action_status", {"key": key})
    check("action_status says succeeded", "status: succeeded" in text_of(status), text_of(status))
    again = await client.call_tool("email_send", args(wf))
    check("a repeat after success reports the result, not run again", text_of(again).startswith("already requested earlier") and "succeeded" in text_of(again), text_of(again))

    conflict = await client.call_tool("email_send", args(wf, subject="Invoice 42 (corrected)"))
    print(f"  different payload: {text_of(conflict)}")
    check("different payload: the refusal text", conflict.is_error and text_of(conflict).startswith("refused: the same action"), text_of(conflict))

    bad = await client.call_tool("email_send", {**args(wf), "payload": {"subject": "no recipient"}})
    check("schema violation: an error result naming the path", bad.is_error and "schema_violation" in text_of(bad), text_of(bad))
    # Scheduled far ahead, then cancelled before it could run: never sent (not in
    # queued_keys: the test expects no effect for it).
    later = await client.call_tool("email_send", {**args(f"{wf}-later"), "not_before": "2099-01-01T00:00:00Z"})
    check("not_before: scheduled, not queued", not later.is_error and text_of(later).startswith("scheduled:"), text_of(later))
    lkey = (later.structured_content or {}).get("key", "")
    cancelled = await client.call_tool("action_cancel", {"key": lkey})
    check("action_cancel before it ran: cancelled", not cancelled.is_error and text_of(cancelled).startswith("cancelled:"), text_of(cancelled))
    after = await client.call_tool("action_wait", {"key": lkey, "timeout_seconds": 1})
    check("action_wait after a cancel: cancelled, never sent", "status: cancelled" in text_of(after), text_of(after))
    late = await client.call_tool("action_cancel", {"key": key})
    check("action_cancel after it ran: too late, with the status", late.is_error and text_of(late).startswith("too late") and "succeeded" in text_of(late), text_of(late))
    cancelled_keys.append(lkey)
    nokey = await client.call_tool("action_status", {"key": "v1:nope"})
    check("unknown key: not_found", nokey.is_error and "not_found" in text_of(nokey), text_of(nokey))
    try:
        await client.call_tool("no_such_tool", {})
        check("unknown tool: an MCP error", False, "no exception")
    except MCPError as e:
        check("unknown tool: an MCP error", e.code == -32602, str(e.code))


async def unauthorized() -> None:
    print("[auth]")
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    hdrs = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    async with httpx2.AsyncClient() as h:
        r = await h.post(URL, json=init, headers=hdrs)
        check("no token: 401", r.status_code == 401, str(r.status_code))
        r = await h.post(URL, json=init, headers={**hdrs, "Authorization": "Bearer wrong"})
        check("bad token: 401", r.status_code == 401, str(r.status_code))


async def main() -> int:
    await unauthorized()
    for mode in ("auto", "legacy"):
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        async with http:
            async with Client(streamable_http_client(URL, http_client=http), mode=mode) as client:
                await scenario(client, f"streamable HTTP, mode={mode}")
    env = {k: os.environ[k] for k in ("ONCELY_CONFIG", "ONCELY_GATEWAY_TOKENS_FILE", "ONCELY_KEY_SECRET", "ONCELY_GATEWAY_TOKEN")}
    env["RUST_LOG"] = "warn"
    params = StdioServerParameters(command=os.environ["ONCELY_GATEWAY_BIN"], args=["mcp", "--stdio"], env=env)
    async with Client(params) as client:
        await scenario(client, "stdio")
    print(f"{passed} passed, {failed} failed")
    print(json.dumps({"keys": queued_keys, "cancelled": cancelled_keys}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
