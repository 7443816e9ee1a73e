//! The client's optional `Idempotency-Key` header, as the IETF draft *The Idempotency-Key
//! HTTP Header Field* describes it, on top of oncely's own key.
//!
//! oncely's key is derived from the business identity, so repeating a request is already
//! safe without the header. The header adds the draft's two promises, per tenant:
//! - the same header value with a *different* request (another identity or payload) is
//!   refused with `422` (`idempotency_key_reused`), nothing recorded;
//! - while the first request with a value is still being recorded, another one with the
//!   same value gets `409` (`request_in_progress`).
//!
//! A row left `recording` by a gateway that died mid-request is taken over by the same
//! request after [`ABANDONED_AFTER`]; rows are deleted after the TTL
//! (`--client-key-ttl`).

use oncely_core::Db;
use std::time::Duration;

/// A `recording` row older than this belongs to a request that will never finish.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(30);
/// Longest accepted header value.
pub const MAX_LEN: usize = 255;

/// What the header allows.
#[derive(Debug, PartialEq, Eq)]
pub enum Begin {
    /// Go on (first use, a repeat of a recorded request, or a takeover).
    Proceed {
        /// Whether this request holds the `recording` row (and must finish or abort it).
        owner: bool,
    },
    /// The first request with this value is still being recorded.
    InProgress,
    /// The value was used for another request.
    Reused,
}

/// The fingerprint of a request: its derived key and payload hash.
pub fn fingerprint(key: &str, payload_hash: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(
        format!("{key}\n{payload_hash}").as_bytes(),
    ))
}

/// Claim the header value for this request, whose fingerprints (one per secret of the
/// key ring, the current one first) are `fingerprints`.
pub async fn begin(
    pool: &Db,
    tenant: &str,
    client_key: &str,
    fingerprints: &[String],
) -> Result<Begin, sqlx::Error> {
    let fingerprint = fingerprints.first().map_or("", String::as_str);
    let took: Option<bool> = sqlx::query_scalar(
        "INSERT INTO gateway_requests (tenant, client_key, fingerprint, state) \
         VALUES ($1, $2, $3, 'recording') \
         ON CONFLICT (tenant, client_key) DO UPDATE SET created_at = now() \
           WHERE gateway_requests.state = 'recording' \
             AND gateway_requests.fingerprint = EXCLUDED.fingerprint \
             AND gateway_requests.created_at < now() - make_interval(secs => $4) \
         RETURNING true",
    )
    .bind(tenant)
    .bind(client_key)
    .bind(fingerprint)
    .bind(ABANDONED_AFTER.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    if took.is_some() {
        return Ok(Begin::Proceed { owner: true });
    }
    let row: Option<(String, String)> = sqlx::query_as(
        "SELECT fingerprint, state FROM gateway_requests WHERE tenant = $1 AND client_key = $2",
    )
    .bind(tenant)
    .bind(client_key)
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        // Deleted by the TTL between the two statements: as good as new, not held.
        None => Begin::Proceed { owner: false },
        Some((f, _)) if !fingerprints.contains(&f) => Begin::Reused,
        Some((_, state)) if state == "recording" => Begin::InProgress,
        Some(_) => Begin::Proceed { owner: false },
    })
}

/// The request was recorded (new, duplicate or conflict): later repeats proceed.
pub async fn finish(
    pool: &Db,
    tenant: &str,
    client_key: &str,
    key: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE gateway_requests SET state = 'recorded', idempotency_key = $3 \
         WHERE tenant = $1 AND client_key = $2",
    )
    .bind(tenant)
    .bind(client_key)
    .bind(key)
    .execute(pool)
    .await?;
    Ok(())
}

/// The request failed before anything was recorded: free the value for a retry.
pub async fn abort(pool: &Db, tenant: &str, client_key: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM gateway_requests WHERE tenant = $1 AND client_key = $2 AND state = 'recording'",
    )
    .bind(tenant)
    .bind(client_key)
    .execute(pool)
    .await?;
    Ok(())
}

/// Delete header values older than `ttl`; returns how many.
pub async fn expire(pool: &Db, ttl: Duration) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM gateway_requests WHERE created_at < now() - make_interval(secs => $1)",
    )
    .bind(ttl.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}
