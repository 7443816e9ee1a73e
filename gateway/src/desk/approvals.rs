//! The desk's approvals: actions held by an approval rule (`awaiting_approval`,
//! docs/approvals.md), listed for every reviewer of their tenants, opened with their
//! payload and decided — approve or reject — by reviewers with the `approve` right
//! ([`super::auth`]).
//!
//! Least privilege: the desk's role reads no payload column. The payload a person must
//! see to decide comes from `oncely_held_payload(key)`, a `SECURITY DEFINER` function
//! (migration 20261215000002_held_payload_for_approvers.sql) that returns it only while
//! the action is held, and only to the roles granted `EXECUTE` (the desk's,
//! [`oncely_core::roles::grants::HELD_PAYLOAD`]). The desk calls it only for a reviewer
//! with the `approve` right who sees the action's tenant, and never logs what it returns.
//! A sealed payload is opened with the desk's data keys (`ONCELY_DATA_KEYS_FILE`); a desk
//! without them says so instead of showing it.
//!
//! A decision is [`oncely_core::Journal::decide_approval`] with the reviewer's id as the
//! approver and their tenants; its answer goes through [`crate::service::decision`],
//! the same as the API's (metrics, the outcome event of a rejection).

use super::auth::Reviewer;
use super::{Desk, MAX_NOTE_CHARS, St, Who, dash, message, render, same_origin, session, time};
use askama::Template;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use oncely_core::journal::{Approval, Decided, Operation, PayloadUnavailable};
use oncely_core::{IdempotencyKey, Status};
use serde::Deserialize;

/// Most held actions the list shows (the oldest first).
pub const HELD_LIMIT: i64 = 200;

struct HeldRow {
    key: String,
    short_key: String,
    action_type: String,
    provider: String,
    tenant: String,
    rule: String,
    approvals: i64,
    needed: i16,
    deadline: String,
    requested_by: String,
    created_at: String,
    age: String,
}

#[derive(Template)]
#[template(path = "desk/approvals.html")]
struct HeldListPage {
    who: Option<Who>,
    rows: Vec<HeldRow>,
    limited: bool,
    approve: bool,
}

struct ApprovalRow {
    approver: String,
    decision: String,
    note: String,
    at: String,
}

#[derive(Template)]
#[template(path = "desk/held.html")]
struct HeldPage {
    who: Option<Who>,
    csrf: String,
    key: String,
    status: String,
    held: bool,
    action_type: String,
    provider: String,
    tenant: String,
    workflow_id: String,
    step: String,
    business_object: String,
    revision: i64,
    rule: String,
    approvals: usize,
    needed: i16,
    deadline: String,
    requested_by: String,
    not_before: String,
    expires_at: String,
    created_at: String,
    /// May see the payload and decide (the `approve` right).
    approver: bool,
    /// The payload, pretty-printed (approvers only, while held).
    payload: String,
    /// Why the payload is not shown, for an approver.
    payload_problem: String,
    decisions: Vec<ApprovalRow>,
    can_decide: bool,
    decided: String,
    more: i64,
    error: String,
    form_note: String,
}

/// One held action in the list (no payload).
#[derive(sqlx::FromRow)]
struct Held {
    idempotency_key: String,
    action_type: String,
    tenant: Option<String>,
    hold_rule: Option<String>,
    approvals_needed: i16,
    approval_deadline: Option<DateTime<Utc>>,
    requested_by: Option<String>,
    created_at: DateTime<Utc>,
    read_at: DateTime<Utc>,
    approvals: i64,
}

/// The held actions of `tenants` (`None`: all), the oldest first, without payloads, with
/// the approvals each has so far.
async fn held(
    desk: &Desk,
    tenants: Option<&[String]>,
    limit: i64,
) -> Result<Vec<Held>, sqlx::Error> {
    sqlx::query_as(
        "SELECT o.idempotency_key, o.action_type, o.tenant, o.hold_rule, o.approvals_needed, \
             o.approval_deadline, o.requested_by, o.created_at, now() AS read_at, \
             (SELECT count(*) FROM operation_approvals a \
              WHERE a.idempotency_key = o.idempotency_key AND a.decision = 'approve') AS approvals \
         FROM agent_operations o \
         WHERE o.status = 'awaiting_approval' AND ($1::text[] IS NULL OR coalesce(o.tenant, '') = ANY($1)) \
         ORDER BY o.created_at LIMIT $2",
    )
    .bind(tenants)
    .bind(limit)
    .fetch_all(desk.journal.pool())
    .await
}

/// The payload of held action `key` through `oncely_held_payload` (nothing unless it is
/// still held), opened with the desk's data keys. Never logged.
async fn held_payload(desk: &Desk, op: &Operation) -> Result<String, String> {
    type Row = (Option<serde_json::Value>, Option<Vec<u8>>, Option<String>);
    let row: Option<Row> = sqlx::query_as(
        "SELECT payload, payload_sealed, payload_key_id FROM oncely_held_payload($1)",
    )
    .bind(op.key.as_str())
    .fetch_optional(desk.journal.pool())
    .await
    .map_err(|e| {
        tracing::warn!(key = %op.key, error = %e, "review desk: reading a held payload failed");
        "The payload could not be read (the journal did not answer); try again.".to_owned()
    })?;
    let Some((payload, sealed, key_id)) = row else {
        return Err("No payload: the action is no longer held.".into());
    };
    let mut with = op.clone();
    with.payload = payload;
    with.sealed_payload = match (sealed, key_id) {
        (Some(bytes), Some(key_id)) => Some(oncely_core::sealing::Sealed { key_id, bytes }),
        _ => None,
    };
    match with.open_payload(desk.journal.data_keys()) {
        Ok(map) => serde_json::to_string_pretty(&serde_json::Value::Object(map))
            .map_err(|_| "The payload could not be shown.".into()),
        Err(PayloadUnavailable::NoKeys(_)) => {
            Err("payload sealed: this desk holds no data keys".into())
        }
        Err(e) => {
            tracing::warn!(key = %op.key, error = %e, "review desk: a held payload could not be opened");
            Err(format!("The payload could not be opened: {e}"))
        }
    }
}

pub(super) async fn list(State(desk): St, headers: HeaderMap) -> Response {
    let Some((value, reviewer)) = session(&desk, &headers) else {
        return Redirect::to("/desk/login").into_response();
    };
    let who = super::who(&desk, &value, &reviewer);
    let rows = match held(&desk, reviewer.tenants.as_deref(), HELD_LIMIT + 1).await {
        Ok(rows) => rows,
        Err(e) => return super::unavailable(Some(who), &e),
    };
    let limited = rows.len() as i64 > HELD_LIMIT;
    let rows = rows
        .into_iter()
        .take(HELD_LIMIT as usize)
        .map(|h| HeldRow {
            short_key: h.idempotency_key.chars().take(16).collect(),
            provider: desk.provider_of(&h.action_type).to_owned(),
            key: h.idempotency_key,
            action_type: h.action_type,
            tenant: h.tenant.unwrap_or_else(|| "(none)".into()),
            rule: dash(h.hold_rule.as_deref()),
            approvals: h.approvals,
            needed: h.approvals_needed,
            deadline: h.approval_deadline.map_or("-".into(), time),
            requested_by: dash(h.requested_by.as_deref()),
            created_at: time(h.created_at),
            age: super::age((h.read_at - h.created_at).num_seconds()),
        })
        .collect();
    render(
        StatusCode::OK,
        &HeldListPage {
            who: Some(who),
            rows,
            limited,
            approve: reviewer.approve,
        },
    )
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct HeldQuery {
    #[serde(default)]
    decided: String,
    #[serde(default)]
    more: i64,
}

/// What the decision form held.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ApprovalForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    note: String,
}

/// Check a decision form: approve or not, and the trimmed note (required to reject).
fn approval(f: &ApprovalForm) -> Result<(bool, Option<String>), String> {
    let note = f.note.trim();
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(format!(
            "The note is longer than {MAX_NOTE_CHARS} characters."
        ));
    }
    let note = (!note.is_empty()).then(|| note.to_owned());
    match f.decision.as_str() {
        "approve" => Ok((true, note)),
        "reject" if note.is_none() => Err(
            "A note is required to reject: say why it must not be sent (the agent and the audit trail see it)."
                .into(),
        ),
        "reject" => Ok((false, note)),
        _ => Err("Choose a decision: approve or reject.".into()),
    }
}

/// The held action (any status now: it may have been decided) if the reviewer sees its
/// tenant, with the decisions on it so far.
async fn load(
    desk: &Desk,
    reviewer: &Reviewer,
    key: &IdempotencyKey,
) -> Result<Option<(Operation, Vec<Approval>)>, oncely_core::journal::JournalError> {
    let Some(op) = desk.journal.get_without_payload(key).await? else {
        return Ok(None);
    };
    if !reviewer.sees(op.tenant.as_deref().unwrap_or("")) || op.hold_rule.is_none() {
        return Ok(None);
    }
    let approvals = desk.journal.approvals(key).await?;
    Ok(Some((op, approvals)))
}

fn not_found(who: Who) -> Response {
    message(
        StatusCode::NOT_FOUND,
        Some(who),
        "Not found",
        "No held action with that key (or not one of your tenants').",
        "/desk/approvals",
    )
}

struct Shown<'a> {
    decided: &'a str,
    more: i64,
    error: &'a str,
    note: &'a str,
}

async fn held_page(
    desk: &Desk,
    who: Who,
    reviewer: &Reviewer,
    (op, approvals): (Operation, Vec<Approval>),
    shown: Shown<'_>,
    status: StatusCode,
) -> Response {
    let held = op.status == Status::AwaitingApproval;
    let (payload, payload_problem) = if reviewer.approve && held {
        match held_payload(desk, &op).await {
            Ok(p) => (p, String::new()),
            Err(problem) => (String::new(), problem),
        }
    } else {
        (String::new(), String::new())
    };
    let page = HeldPage {
        csrf: who.csrf.clone(),
        who: Some(who),
        key: op.key.to_string(),
        status: op.status.as_str().to_owned(),
        held,
        provider: desk.provider_of(&op.action_type).to_owned(),
        action_type: op.action_type.clone(),
        tenant: op.tenant.clone().unwrap_or_else(|| "(none)".into()),
        workflow_id: op.workflow_id.clone(),
        step: op.step.clone(),
        business_object: op.business_object.clone(),
        revision: op.revision,
        rule: dash(op.hold_rule.as_deref()),
        approvals: approvals.iter().filter(|a| a.decision == "approve").count(),
        needed: op.approvals_needed,
        deadline: op.approval_deadline.map_or("-".into(), time),
        requested_by: dash(op.requested_by.as_deref()),
        not_before: op.not_before.map_or("-".into(), time),
        expires_at: op.expires_at.map_or("-".into(), time),
        created_at: time(op.created_at),
        approver: reviewer.approve,
        payload,
        payload_problem,
        decisions: approvals
            .iter()
            .map(|a| ApprovalRow {
                approver: a.approver.clone(),
                decision: a.decision.clone(),
                note: dash(a.note.as_deref()),
                at: time(a.at),
            })
            .collect(),
        can_decide: reviewer.approve && held,
        decided: shown.decided.to_owned(),
        more: shown.more,
        error: shown.error.to_owned(),
        form_note: shown.note.to_owned(),
    };
    render(status, &page)
}

pub(super) async fn detail(
    State(desk): St,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<HeldQuery>,
) -> Response {
    let Some((value, reviewer)) = session(&desk, &headers) else {
        return Redirect::to("/desk/login").into_response();
    };
    let who = super::who(&desk, &value, &reviewer);
    let Ok(key) = IdempotencyKey::parse(&key) else {
        return not_found(who);
    };
    match load(&desk, &reviewer, &key).await {
        Ok(Some(data)) => {
            let decided = match q.decided.as_str() {
                d @ ("approved" | "approval_recorded" | "rejected") => d,
                _ => "",
            };
            held_page(
                &desk,
                who,
                &reviewer,
                data,
                Shown {
                    decided,
                    more: q.more.clamp(0, 9),
                    error: "",
                    note: "",
                },
                StatusCode::OK,
            )
            .await
        }
        Ok(None) => not_found(who),
        Err(e) => super::unavailable(Some(who), &e),
    }
}

/// The journal's answer through the API's mapping (metrics; a rejection's outcome event).
async fn answer(
    desk: &Desk,
    decided: Decided,
    who: &str,
) -> Result<crate::service::Decision, crate::service::ApiError> {
    let producer = match desk.service.get() {
        Some(service) => Some(service.producer().await),
        None => {
            // A desk without the API (tests of the desk alone): the same answers, no event.
            tracing::warn!(
                "review desk: no gateway service attached; a rejection's outcome event is not published"
            );
            None
        }
    };
    crate::service::decision(producer.as_deref(), decided, who).await
}

pub(super) async fn decide(
    State(desk): St,
    headers: HeaderMap,
    Path(key): Path<String>,
    Form(f): Form<ApprovalForm>,
) -> Response {
    if !same_origin(&headers) {
        return super::cross_site();
    }
    let Some((value, reviewer)) = session(&desk, &headers) else {
        return message(
            StatusCode::UNAUTHORIZED,
            None,
            "Signed out",
            "Your session has ended; nothing was decided. Sign in and decide again.",
            "/desk/login",
        );
    };
    let who = super::who(&desk, &value, &reviewer);
    let back = format!("/desk/approvals/{key}");
    if !desk.sessions.csrf_ok(&value, &f.csrf) {
        tracing::warn!(reviewer = %reviewer.id, "review desk: approval with a bad CSRF token refused");
        return message(
            StatusCode::FORBIDDEN,
            Some(who),
            "Refused",
            "The form's CSRF token does not match your session; nothing was decided.",
            "/desk/approvals",
        );
    }
    if !reviewer.approve {
        tracing::warn!(reviewer = %reviewer.id, "review desk: approval by a reviewer without the approve right refused");
        return message(
            StatusCode::FORBIDDEN,
            Some(who),
            "Not allowed",
            "You may see held actions but not approve or reject them (the reviewers file grants approve = true); nothing was decided.",
            &back,
        );
    }
    let Ok(key) = IdempotencyKey::parse(&key) else {
        return not_found(who);
    };
    let data = match load(&desk, &reviewer, &key).await {
        Ok(Some(data)) => data,
        Ok(None) => return not_found(who),
        Err(e) => return super::unavailable(Some(who), &e),
    };
    let (approve, note) = match approval(&f) {
        Ok(d) => d,
        Err(problem) => {
            return held_page(
                &desk,
                who,
                &reviewer,
                data,
                Shown {
                    decided: "",
                    more: 0,
                    error: &problem,
                    note: &f.note,
                },
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .await;
        }
    };
    let decided = match desk
        .journal
        .decide_approval(
            &key,
            &reviewer.id,
            approve,
            note.as_deref(),
            reviewer.tenants.as_deref(),
        )
        .await
    {
        Ok(d) => d,
        Err(e) => return super::unavailable(Some(who), &e),
    };
    match answer(&desk, decided, &reviewer.id).await {
        Ok(d) => {
            tracing::info!(key = %key, reviewer = %reviewer.id, outcome = %d.outcome, "review desk: approval decision");
            let more = d
                .more_approvals_needed
                .map_or(String::new(), |m| format!("&more={m}"));
            Redirect::to(&format!("{back}?decided={}{more}", d.outcome)).into_response()
        }
        Err(e) => {
            tracing::info!(key = %key, reviewer = %reviewer.id, refusal = e.code, "review desk: approval decision refused");
            let (status, title, text) = match e.code {
                "own_request" => (
                    StatusCode::FORBIDDEN,
                    "Refused: your own request",
                    "You asked for this action, so you may not approve it: another person must. Nothing was recorded.",
                ),
                "already_decided" => (
                    StatusCode::CONFLICT,
                    "Refused: already decided",
                    "You already decided on this action. Four eyes means another person must approve it; nothing more was recorded.",
                ),
                "not_held" => (
                    StatusCode::CONFLICT,
                    "Refused: not held",
                    "This action is not awaiting approval any more (decided, cancelled or expired); nothing was changed by you.",
                ),
                "not_found" => return not_found(who),
                _ => {
                    return super::unavailable(Some(who), &e.message);
                }
            };
            message(status, Some(who), title, text, &back)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(decision: &str, note: &str) -> ApprovalForm {
        ApprovalForm {
            csrf: String::new(),
            decision: decision.into(),
            note: note.into(),
        }
    }

    #[test]
    fn a_rejection_needs_a_note_an_approval_does_not() {
        assert_eq!(approval(&form("approve", "  ")).expect("ok"), (true, None));
        assert_eq!(
            approval(&form("approve", " checked the invoice ")).expect("ok"),
            (true, Some("checked the invoice".into()))
        );
        assert!(
            approval(&form("reject", " "))
                .unwrap_err()
                .contains("note is required")
        );
        assert_eq!(
            approval(&form("reject", "no such supplier")).expect("ok"),
            (false, Some("no such supplier".into()))
        );
        assert!(
            approval(&form("maybe", "x"))
                .unwrap_err()
                .contains("Choose")
        );
        assert!(approval(&form("approve", &"x".repeat(MAX_NOTE_CHARS + 1))).is_err());
    }
}
