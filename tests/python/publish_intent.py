#!/usr/bin/env python3
"""Publish one oncely intent from Python with pika, following docs/envelope.md and
schemas/intent-envelope.v1.json only: canonical JSON, HMAC key, SHA-256 payload hash,
a persistent mandatory publish with confirms. Prints the idempotency key.

Env: ONCELY_KEY_SECRET, ONCELY_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f),
ONCELY_PREFIX (default "oncely").
"""
import hashlib
import hmac
import json
import os
import sys

import pika


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def make_idempotency_key(secret: bytes, identity: dict) -> str:
    return "v1:" + hmac.new(secret, canonical_json(identity), hashlib.sha256).hexdigest()


def main() -> int:
    secret = os.environ["ONCELY_KEY_SECRET"].encode("utf-8")
    url = os.environ.get("ONCELY_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f")
    prefix = os.environ.get("ONCELY_PREFIX", "oncely")
    identity = {
        "action_type": "email.send",
        "workflow_id": "case-1842",
        "step": "send_approval_notice",
        "business_object": "application-731",
        "revision": 2,
    }
    payload = {"to": "applicant@example.test", "subject": "Заявка одобрена", "body": "Ваша заявка одобрена."}
    envelope = dict(identity)
    envelope.update({
        "schema": "oncely.intent.v1",
        "tenant": None,
        "idempotency_key": make_idempotency_key(secret, identity),
        "payload": payload,
        "payload_hash": "sha256:" + hashlib.sha256(canonical_json(payload)).hexdigest(),
    })
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        exchange=f"{prefix}.actions",
        routing_key=identity["action_type"],
        body=json.dumps(envelope, ensure_ascii=False).encode("utf-8"),
        properties=pika.BasicProperties(delivery_mode=2, content_type="application/json"),
        mandatory=True,
    )  # raises UnroutableError / NackError on failure
    connection.close()
    print(envelope["idempotency_key"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
