-- The gateway's client-supplied Idempotency-Key headers (IETF draft "The Idempotency-Key
-- HTTP Header Field"). oncely's own key is derived from the business identity, so this
-- table is only for the header's promises: a key reused with another request is refused
-- (422), and a second request while the first is still being recorded gets 409.
CREATE TABLE gateway_requests (
    tenant          text        NOT NULL,
    client_key      text        NOT NULL CHECK (length(client_key) BETWEEN 1 AND 255),
    -- sha256 of the derived key and the payload hash: "the same request".
    fingerprint     text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('recording', 'recorded')),
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, client_key)
);
CREATE INDEX gateway_requests_created_at ON gateway_requests (created_at);
COMMENT ON TABLE gateway_requests IS
    'Client Idempotency-Key headers seen by oncely-gateway; rows older than the gateway''s --client-key-ttl are deleted by it.';
