//! `--self-test`, the negative control: a check that never fails proves nothing. After
//! healing, with every process stopped, this forges one fault of each kind in the live
//! journal and sandbox; the run must then report them and fail. (The same cases, as
//! facts, are the unit tests of the pure checks.)

use super::http::http;
use crate::fleet::Fleet;
use serde_json::json;
use std::time::Duration;

/// `--self-test`: forge one duplicate, one unexpected effect, one mismatch and one lost
/// intent after healing, so the checks must find exactly those (a negative control).
pub(super) async fn forge(fleet: &Fleet) -> anyhow::Result<()> {
    let pool = &fleet.db.pool;
    let addr = fleet.sandbox.addr();
    let control = fleet.sandbox.control();
    // Unexpected: an effect for a key the journal has never seen.
    let stranger = format!("v1:{}", "0".repeat(64));
    http(
        addr,
        "POST",
        "/v1/emails",
        Some((&stranger, &json!({"self_test": "unexpected"}))),
    )
    .await?;
    let succeeded: Vec<String> = sqlx::query_scalar(
        "SELECT idempotency_key FROM agent_operations WHERE status = 'succeeded' AND action_type = 'email.send' \
         ORDER BY idempotency_key LIMIT 2",
    )
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(
        succeeded.len() == 2,
        "self-test: not enough succeeded emails"
    );
    // Duplicate: the provider forgets the key, then the same key is sent again.
    control
        .set_faults_json(&json!({"forget_keys_after_ms": 0}))
        .await?;
    tokio::time::sleep(Duration::from_millis(50)).await;
    http(
        addr,
        "POST",
        "/v1/emails",
        Some((&succeeded[0], &json!({"self_test": "duplicate"}))),
    )
    .await?;
    control.set_faults_json(&json!({})).await?;
    // Mismatch: the journal's provider id no longer matches the provider's record.
    sqlx::query("UPDATE agent_operations SET provider_operation_id = 'em_forged' WHERE idempotency_key = $1")
        .bind(&succeeded[1])
        .execute(pool)
        .await?;
    // Lost: an unknown whose review is closed without deciding anything.
    let closed = sqlx::query(
        "UPDATE operation_reviews SET resolution = 'failed', resolved_by = 'chaos-self-test', resolved_at = now() \
         WHERE id = (SELECT r.id FROM operation_reviews r JOIN agent_operations o USING (idempotency_key) \
                     WHERE r.resolved_at IS NULL AND o.status = 'unknown' ORDER BY r.id LIMIT 1)",
    )
    .execute(pool)
    .await?;
    eprintln!(
        "chaos: self-test forged an unexpected effect ({stranger}), a duplicate ({}), a mismatch ({}) and {} lost",
        succeeded[0],
        succeeded[1],
        closed.rows_affected()
    );
    Ok(())
}
