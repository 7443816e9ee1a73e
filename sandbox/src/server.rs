//! The HTTP surface: provider endpoints, control endpoints, health.
//!
//! Why a thin layer: all decisions live in [`crate::state`]; this file only
//! turns requests into calls and results into the exact status codes and
//! JSON bodies clients are written against (see `docs/sandbox.md`). Request
//! bodies are never logged.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State as AxumState};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::conn::{ConnSignal, shutdown_requested};
use crate::effects::EffectCount;
use crate::faults::Faults;
use crate::provider::Provider;
use crate::state::{Begin, Finish, Lookup, LookupBy, State};
use crate::store::{SavedResponse, body_hash};

/// Header carrying the idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Header set to `true` on replayed responses.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

#[derive(Debug, Clone)]
pub(crate) struct App {
    pub state: Arc<State>,
    pub shutdown: watch::Receiver<bool>,
}

pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/{resource}", post(execute).get(lookup))
        .route("/control/faults", get(get_faults).put(put_faults))
        .route("/control/effects", get(effects))
        .route("/control/stats", get(stats))
        .route("/control/reset", post(reset))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no_route") })
        .with_state(app)
}

fn error(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({ "error": code }))).into_response()
}

fn error_msg(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "error": code, "message": message }))).into_response()
}

fn saved(r: SavedResponse) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(r.body)).into_response()
}

/// 429 with `Retry-After` (a `rate_limits` fault): nothing was done.
fn rate_limited(retry_after: u64) -> Response {
    let mut resp = error(StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    resp.headers_mut()
        .insert("retry-after", HeaderValue::from(retry_after));
    resp
}

fn unknown_resource() -> Response {
    error_msg(
        StatusCode::NOT_FOUND,
        "unknown_resource",
        "known resources: emails, tickets, payment-orders",
    )
}

async fn execute(
    AxumState(app): AxumState<App>,
    Path(resource): Path<String>,
    Extension(conn): Extension<ConnSignal>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !app.state.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let Some(provider) = Provider::from_resource(&resource) else {
        return unknown_resource();
    };
    if let Some(retry_after) = app.state.throttle(provider) {
        return rate_limited(retry_after);
    }
    let Some(key) = headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return error(StatusCode::BAD_REQUEST, "missing_idempotency_key");
    };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return error(StatusCode::BAD_REQUEST, "invalid_json"),
    };
    if !matches!(
        body.get("business_reference"),
        None | Some(Value::Null | Value::String(_))
    ) {
        return error_msg(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "business_reference must be a string",
        );
    }
    let hash = body_hash(&body);
    let ticket = match app.state.begin(provider, &key, &body, &hash) {
        Begin::Conflict => {
            tracing::info!(%provider, %key, "422 idempotency key reused with another body");
            return error(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused");
        }
        Begin::InFlight => {
            tracing::info!(%provider, %key, "409 request in progress");
            return error(StatusCode::CONFLICT, "request_in_progress");
        }
        Begin::Replay(r) => {
            tracing::info!(%provider, %key, status = r.status, "replay");
            let mut resp = saved(r);
            resp.headers_mut()
                .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
            return resp;
        }
        Begin::Admitted(ticket) => ticket,
    };
    // The provider's work runs in its own task: it completes (and its effect
    // counts) even if the client goes away while it is in progress.
    let state = app.state.clone();
    let work = tokio::spawn(async move {
        tokio::time::sleep(ticket.delay).await;
        let finish = state.finish(&ticket);
        let outcome = match &finish {
            Finish::Respond(r) => format!("answered {}", r.status),
            Finish::Timeout(hold) => format!("committed, holding {hold:?} then closing"),
            Finish::Reset => "committed, resetting the connection".to_owned(),
        };
        tracing::info!(provider = %ticket.provider, key = %ticket.key, %outcome, "execute");
        finish
    });
    match work.await {
        Ok(Finish::Respond(r)) => saved(r),
        Ok(Finish::Timeout(hold)) => {
            let mut shutdown = app.shutdown.clone();
            tokio::select! {
                () = tokio::time::sleep(hold) => {}
                () = shutdown_requested(&mut shutdown) => {}
            }
            conn.close();
            std::future::pending().await
        }
        Ok(Finish::Reset) => {
            conn.reset();
            std::future::pending().await
        }
        Err(e) => {
            tracing::error!(error = %e, "execute task failed");
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal")
        }
    }
}

#[derive(Debug, Deserialize)]
struct LookupQuery {
    idempotency_key: Option<String>,
    reference: Option<String>,
}

async fn lookup(
    AxumState(app): AxumState<App>,
    Path(resource): Path<String>,
    Query(q): Query<LookupQuery>,
    headers: HeaderMap,
) -> Response {
    if !app.state.authorized(&headers) {
        return error(StatusCode::UNAUTHORIZED, "unauthorized");
    }
    let Some(provider) = Provider::from_resource(&resource) else {
        return unknown_resource();
    };
    if let Some(retry_after) = app.state.throttle(provider) {
        return rate_limited(retry_after);
    }
    let by = match (&q.idempotency_key, &q.reference) {
        (Some(key), None) => LookupBy::Key(key),
        (None, Some(reference)) => LookupBy::Reference(reference),
        _ => {
            return error_msg(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                "give exactly one of idempotency_key or reference",
            );
        }
    };
    match app.state.lookup(provider, by) {
        Lookup::Disabled => error(StatusCode::SERVICE_UNAVAILABLE, "lookup_unavailable"),
        Lookup::NotFound => error(StatusCode::NOT_FOUND, "not_found"),
        Lookup::Found(view) => (StatusCode::OK, Json(view)).into_response(),
    }
}

async fn get_faults(AxumState(app): AxumState<App>) -> Json<Faults> {
    Json(app.state.faults())
}

async fn put_faults(AxumState(app): AxumState<App>, body: Bytes) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error_msg(StatusCode::BAD_REQUEST, "invalid_json", &e.to_string()),
    };
    let installed = Faults::from_json(&value).and_then(|faults| {
        app.state.set_faults(faults.clone())?;
        Ok(faults)
    });
    match installed {
        Ok(faults) => {
            tracing::info!(
                seed = faults.seed,
                rules = faults.rules.len(),
                "faults installed"
            );
            (StatusCode::OK, Json(faults)).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_faults", "field": e.field, "message": e.to_string()})),
        )
            .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct EffectsQuery {
    key: Option<String>,
}

async fn effects(AxumState(app): AxumState<App>, Query(q): Query<EffectsQuery>) -> Response {
    match q.key {
        Some(key) => {
            let count = app.state.effect_count(&key);
            Json(EffectCount { key, count }).into_response()
        }
        None => Json(app.state.effects()).into_response(),
    }
}

async fn stats(AxumState(app): AxumState<App>) -> Response {
    Json(app.state.stats()).into_response()
}

async fn reset(AxumState(app): AxumState<App>) -> Response {
    app.state.reset();
    tracing::info!("reset");
    Json(json!({"ok": true})).into_response()
}
