//! The review desk: a web page where people decide what automation could not.
//!
//! Served by `oncely-gateway serve` under `/desk` when `--desk-reviewers-file` is given.
//! Server-rendered HTML (askama templates compiled into the binary, no JavaScript at
//! all), usable on a phone. A reviewer signs in with a token from the reviewers file
//! ([`auth`]), sees the open reviews (filters: action type, provider, tenant, age, who
//! they wait for), opens one operation — its timeline, the review's evidence, the saved
//! result — and, with the `decide` role, records one of three decisions with a required
//! note: `succeeded` with the provider's id, `failed`, or `retry` once. A decision is
//! [`oncely_core::Journal::resolve_review`], the same audited transaction as
//! `oncely-worker admin review resolve`; the reconciler that counts the closing publishes
//! the operation's outcome event.
//!
//! The desk connects to Postgres with its own pool (`--desk-database-url`, default the
//! gateway's `DATABASE_URL`) and checks at start that the role holds what
//! [`oncely_core::roles::Process::Desk`] needs: read reviews and operations (never a
//! payload) and resolve reviews — nothing the agents' API needs, and nothing more.
//!
//! It also lists the actions held for approval (`awaiting_approval`, [`approvals`]): every
//! reviewer sees them for their tenants; a reviewer with the `approve` right sees what
//! each would send (through the one function that returns a held action's payload, and
//! only while it is held) and approves or rejects it.

pub mod approvals;
pub mod auth;
mod signin;

use signin::{cross_site, login, login_page, logout, same_origin, session, who};

use askama::Template;
use auth::{DeskRole, Reviewer, Reviewers, Sessions};
use axum::Router;
use axum::extract::{DefaultBodyLimit, Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use oncely_core::IdempotencyKey;
use oncely_core::config::{Config, parse_duration};
use oncely_core::journal::Journal;
use oncely_core::journal::{DeskFilter, Event, Operation, Resolution, ResolveError, Review};
use oncely_core::roles::Process;
use serde::Deserialize;
use std::sync::Arc;

/// Most rows the list shows (the oldest first; filters narrow it).
pub const LIST_LIMIT: i64 = 200;
/// Longest note accepted, in characters.
pub const MAX_NOTE_CHARS: usize = 2000;

/// The desk's state.
#[derive(Debug)]
pub struct Desk {
    journal: Journal,
    reviewers: Reviewers,
    sessions: Sessions,
    secure_cookie: bool,
    /// Configured action types with their provider, sorted.
    actions: Vec<(String, String)>,
    /// The gateway's service, once attached ([`Desk::attach`]): its producer publishes a
    /// rejection's outcome event.
    service: std::sync::OnceLock<Arc<crate::service::Service>>,
}

/// How the desk is set up (from `oncely-gateway serve`'s options).
#[derive(Debug)]
pub struct DeskSettings {
    /// Postgres for the desk's own pool.
    pub database_url: String,
    /// Who may sign in.
    pub reviewers: Reviewers,
    /// Session signing and lifetime.
    pub sessions: Sessions,
    /// Mark the cookie `Secure` (off only for plain-HTTP set-ups such as tests).
    pub secure_cookie: bool,
}

impl Desk {
    /// Connect the desk's pool (checking its role's grants and the schema version).
    pub async fn connect(config: &Config, settings: DeskSettings) -> anyhow::Result<Arc<Self>> {
        let pool = oncely_core::db::connect_checked_as(
            &settings.database_url,
            &oncely_core::db::PoolSettings {
                max_connections: 4,
                ..oncely_core::db::PoolSettings::for_config(config)
            },
            Process::Desk,
        )
        .await
        .map_err(|e| anyhow::anyhow!("review desk: {e}"))?;
        // Held actions' payloads may be sealed: opened with these, shown to approvers.
        let data_keys = oncely_core::sealing::DataKeys::from_env()
            .map_err(|e| anyhow::anyhow!("review desk: {e}"))?;
        Ok(Arc::new(Self {
            journal: Journal::on(pool).with_data_keys(data_keys),
            reviewers: settings.reviewers,
            sessions: settings.sessions,
            secure_cookie: settings.secure_cookie,
            actions: config
                .actions
                .iter()
                .map(|(a, p)| (a.clone(), p.provider.clone()))
                .collect(),
            service: std::sync::OnceLock::new(),
        }))
    }

    /// Attach the gateway's service (once; later calls are ignored): the desk's approval
    /// decisions then go through [`crate::service::decision`] like the API's.
    pub fn attach(&self, service: Arc<crate::service::Service>) {
        let _ = self.service.set(service);
    }

    fn provider_of(&self, action_type: &str) -> &str {
        self.actions
            .iter()
            .find(|(a, _)| a == action_type)
            .map_or("-", |(_, p)| p.as_str())
    }
}

/// The desk's routes (under `/desk`).
pub fn router(desk: Arc<Desk>) -> Router {
    let secure = desk.secure_cookie;
    let router = Router::new()
        .route("/desk", get(|| async { Redirect::to("/desk/reviews") }))
        .route("/desk/", get(|| async { Redirect::to("/desk/reviews") }))
        .route("/desk/desk.css", get(css))
        .route("/desk/login", get(login_page).post(login))
        .route("/desk/logout", post(logout))
        .route("/desk/reviews", get(list))
        .route("/desk/operations/{key}", get(operation))
        .route("/desk/operations/{key}/decide", post(decide))
        .route("/desk/approvals", get(approvals::list))
        .route("/desk/approvals/{key}", get(approvals::detail))
        .route("/desk/approvals/{key}/decide", post(approvals::decide))
        .layer(DefaultBodyLimit::max(32 * 1024))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(desk);
    // Served over HTTPS (directly or behind a proxy: the `Secure` cookie says so): tell
    // browsers never to use plain HTTP for this host again (a year; RFC 6797).
    if secure {
        router.layer(axum::middleware::map_response(hsts))
    } else {
        router
    }
}

async fn hsts(mut r: Response) -> Response {
    r.headers_mut().insert(
        header::STRICT_TRANSPORT_SECURITY,
        HeaderValue::from_static("max-age=31536000"),
    );
    r
}

type St = State<Arc<Desk>>;

/// No framing, no scripts, no third-party anything, nothing cached, no referrer.
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        include_str!("../../templates/desk/desk.css"),
    )
        .into_response()
}

// --- pages --------------------------------------------------------------------------

/// The signed-in bar of every page: who, the role, and the sign-out form's CSRF token.
struct Who {
    id: String,
    role: &'static str,
    /// Has the `approve` right.
    approve: bool,
    csrf: String,
}

#[derive(Template)]
#[template(path = "desk/login.html")]
struct LoginPage {
    who: Option<Who>,
    error: Option<String>,
}

#[derive(Template)]
#[template(path = "desk/message.html")]
struct MessagePage {
    who: Option<Who>,
    title: String,
    message: String,
    back: String,
}

struct Choice {
    value: String,
    label: String,
    selected: bool,
}

struct Row {
    key: String,
    short_key: String,
    action_type: String,
    provider: String,
    tenant: String,
    reason: String,
    class: &'static str,
    age: String,
    opened_at: String,
    rechecks: i32,
    last_lookup: String,
    waiting_on: &'static str,
}

#[derive(Template)]
#[template(path = "desk/list.html")]
struct ListPage {
    who: Option<Who>,
    action_types: Vec<Choice>,
    providers: Vec<Choice>,
    tenants: Vec<Choice>,
    ages: Vec<Choice>,
    waiting: Vec<Choice>,
    rows: Vec<Row>,
    limited: bool,
}

struct EventRow {
    at: String,
    from: String,
    to: String,
    attempt: i32,
    actor: String,
    reason: String,
    error_code: String,
    provider_operation_id: String,
}

struct LookupRow {
    at: String,
    answer: String,
    code: String,
}

struct ReviewBox {
    reason: String,
    class: &'static str,
    opened_at: String,
    opened_by: String,
    age: String,
    waiting_on: &'static str,
    rechecks: i32,
    policy: String,
    provider: String,
    honours_key: String,
    key_retention: String,
    attempts: i32,
    checks_before_review: i32,
    lookups: Vec<LookupRow>,
    resolution: String,
    resolved_by: String,
    resolved_at: String,
    note: String,
}

#[derive(Template)]
#[template(path = "desk/operation.html")]
struct OperationPage {
    who: Option<Who>,
    key: String,
    status: String,
    action_type: String,
    provider: String,
    tenant: String,
    workflow_id: String,
    step: String,
    business_object: String,
    revision: i64,
    attempt: i32,
    provider_operation_id: String,
    error_code: String,
    created_at: String,
    updated_at: String,
    result: String,
    open: Option<ReviewBox>,
    past: Vec<ReviewBox>,
    events: Vec<EventRow>,
    can_decide: bool,
    decided: String,
    error: String,
    form_decision: String,
    form_provider_operation_id: String,
    form_note: String,
    csrf: String,
}

fn render<T: Template>(status: StatusCode, page: &T) -> Response {
    match page.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "desk template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "template error").into_response()
        }
    }
}

fn message(status: StatusCode, who: Option<Who>, title: &str, text: &str, back: &str) -> Response {
    render(
        status,
        &MessagePage {
            who,
            title: title.to_owned(),
            message: text.to_owned(),
            back: back.to_owned(),
        },
    )
}

fn unavailable(who: Option<Who>, e: &dyn std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "review desk: journal unavailable");
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        who,
        "Database unavailable",
        "The journal did not answer. Nothing was changed; try again in a moment.",
        "/desk/reviews",
    )
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// "42s", "5m", "3h 12m", "2d 4h".
fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

fn dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

fn waiting_on(r: &Review) -> &'static str {
    match (&r.resolution, r.recheck_at) {
        (Some(_), _) => "closed",
        (None, Some(_)) => "lookup",
        (None, None) => "person",
    }
}

fn review_box(r: &Review, now: DateTime<Utc>) -> ReviewBox {
    let e = &r.evidence.0;
    ReviewBox {
        reason: r.reason.clone(),
        class: r.reason().class().as_str(),
        opened_at: time(r.opened_at),
        opened_by: r.opened_by.clone(),
        age: age((now - r.opened_at).num_seconds()),
        waiting_on: waiting_on(r),
        rechecks: r.rechecks,
        policy: dash(e.policy.as_deref()),
        provider: dash(e.provider.as_deref()),
        honours_key: e
            .honours_key
            .map_or("-".into(), |h| if h { "yes" } else { "no" }.into()),
        key_retention: e
            .key_retention_secs
            .map_or("-".into(), |s| age(i64::try_from(s).unwrap_or(i64::MAX))),
        attempts: e.attempts,
        checks_before_review: e.checks_before_review,
        lookups: e
            .lookups
            .iter()
            .map(|l| LookupRow {
                at: time(l.at),
                answer: l.answer.clone(),
                code: dash(l.code.as_deref()),
            })
            .collect(),
        resolution: dash(r.resolution.as_deref()),
        resolved_by: dash(r.resolved_by.as_deref()),
        resolved_at: r.resolved_at.map_or("-".into(), time),
        note: dash(r.note.as_deref()),
    }
}

// --- the list -----------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
struct ListQuery {
    #[serde(default)]
    action_type: String,
    #[serde(default)]
    provider: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    age: String,
    #[serde(default)]
    waiting: String,
}

fn options(values: &[(&str, &str)], selected: &str) -> Vec<Choice> {
    values
        .iter()
        .map(|(v, l)| Choice {
            value: (*v).to_owned(),
            label: (*l).to_owned(),
            selected: *v == selected,
        })
        .collect()
}

async fn list(State(desk): St, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    let Some((value, reviewer)) = session(&desk, &headers) else {
        return Redirect::to("/desk/login").into_response();
    };
    let who = who(&desk, &value, &reviewer);
    // Action types: the one chosen, and/or those of the provider chosen.
    let action_types: Option<Vec<String>> = (!q.action_type.is_empty() || !q.provider.is_empty())
        .then(|| {
            desk.actions
                .iter()
                .filter(|(a, p)| {
                    (q.action_type.is_empty() || *a == q.action_type)
                        && (q.provider.is_empty() || *p == q.provider)
                })
                .map(|(a, _)| a.clone())
                .collect()
        });
    // Tenants: those the reviewer may see, narrowed to the one chosen. The list shows
    // "(none)" for operations without a tenant; its value is "-".
    let chosen = match q.tenant.as_str() {
        "" => None,
        "-" => Some(String::new()),
        t => Some(t.to_owned()),
    };
    let tenants = match (&reviewer.tenants, chosen) {
        (None, None) => None,
        (None, Some(t)) => Some(vec![t]),
        (Some(allowed), None) => Some(allowed.clone()),
        (Some(allowed), Some(t)) => Some(allowed.iter().filter(|a| **a == t).cloned().collect()),
    };
    let older_than = match q.age.as_str() {
        "" => None,
        a => match parse_duration(a) {
            Ok(d) => Some(d),
            Err(e) => {
                return message(
                    StatusCode::BAD_REQUEST,
                    Some(who),
                    "Bad filter",
                    &format!("age: {e}"),
                    "/desk/reviews",
                );
            }
        },
    };
    let for_person = match q.waiting.as_str() {
        "" | "person" => Some(true),
        "lookup" => Some(false),
        _ => None,
    };
    let filter = DeskFilter {
        action_types,
        tenants,
        older_than,
        for_person,
        limit: LIST_LIMIT + 1,
    };
    let (rows, tenant_values) = match tokio::try_join!(
        desk.journal.desk_reviews(&filter),
        desk.journal.desk_tenants(reviewer.tenants.as_deref())
    ) {
        Ok(x) => x,
        Err(e) => return unavailable(Some(who), &e),
    };
    let limited = rows.len() as i64 > LIST_LIMIT;
    let rows: Vec<Row> = rows
        .into_iter()
        .take(LIST_LIMIT as usize)
        .map(|d| {
            let last = d.review.evidence.0.lookups.last();
            Row {
                short_key: d.review.idempotency_key.chars().take(16).collect(),
                key: d.review.idempotency_key.clone(),
                provider: desk.provider_of(&d.action_type).to_owned(),
                action_type: d.action_type,
                tenant: d.tenant.unwrap_or_else(|| "(none)".into()),
                reason: d.review.reason.clone(),
                class: d.review.reason().class().as_str(),
                age: age((d.read_at - d.review.opened_at).num_seconds()),
                opened_at: time(d.review.opened_at),
                rechecks: d.review.rechecks,
                last_lookup: last.map_or("-".into(), |l| match &l.code {
                    Some(c) => format!("{} ({c})", l.answer),
                    None => l.answer.clone(),
                }),
                waiting_on: waiting_on(&d.review),
            }
        })
        .collect();
    let mut at: Vec<(&str, &str)> = vec![("", "any action type")];
    at.extend(desk.actions.iter().map(|(a, _)| (a.as_str(), a.as_str())));
    let mut providers: Vec<&str> = desk.actions.iter().map(|(_, p)| p.as_str()).collect();
    providers.sort_unstable();
    providers.dedup();
    let mut pv: Vec<(&str, &str)> = vec![("", "any provider")];
    pv.extend(providers.iter().map(|p| (*p, *p)));
    let mut tv: Vec<(&str, &str)> = vec![("", "any tenant")];
    tv.extend(tenant_values.iter().map(|t| {
        if t.is_empty() {
            ("-", "(none)")
        } else {
            (t.as_str(), t.as_str())
        }
    }));
    let page = ListPage {
        who: Some(who),
        action_types: options(&at, &q.action_type),
        providers: options(&pv, &q.provider),
        tenants: options(&tv, &q.tenant),
        ages: options(
            &[
                ("", "any age"),
                ("5m", "older than 5 minutes"),
                ("1h", "older than 1 hour"),
                ("1d", "older than 1 day"),
            ],
            &q.age,
        ),
        waiting: options(
            &[
                ("person", "waiting for a person"),
                ("lookup", "still being looked up"),
                ("any", "all open"),
            ],
            if q.waiting.is_empty() {
                "person"
            } else {
                &q.waiting
            },
        ),
        rows,
        limited,
    };
    render(StatusCode::OK, &page)
}

// --- one operation ------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
struct OperationQuery {
    #[serde(default)]
    decided: String,
}

/// What the decision form held, to show it again with an error.
#[derive(Debug, Default, Deserialize)]
struct DecideForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    provider_operation_id: String,
    #[serde(default)]
    note: String,
}

/// Load what the operation page shows; `None` when there is no such operation or the
/// reviewer may not see its tenant (both a 404: the desk does not confirm keys).
async fn load(
    desk: &Desk,
    reviewer: &Reviewer,
    key: &IdempotencyKey,
) -> Result<Option<(Operation, Vec<Event>, Vec<Review>)>, oncely_core::journal::JournalError> {
    let Some(op) = desk.journal.get_without_payload(key).await? else {
        return Ok(None);
    };
    if !reviewer.sees(op.tenant.as_deref().unwrap_or("")) {
        return Ok(None);
    }
    let (events, reviews) =
        tokio::try_join!(desk.journal.events(key), desk.journal.reviews_of(key))?;
    Ok(Some((op, events, reviews)))
}

fn not_found(who: Who) -> Response {
    message(
        StatusCode::NOT_FOUND,
        Some(who),
        "Not found",
        "No operation with that key (or not one of your tenants').",
        "/desk/reviews",
    )
}

#[allow(clippy::too_many_arguments)]
fn operation_page(
    desk: &Desk,
    who: Who,
    reviewer: &Reviewer,
    (op, events, reviews): (Operation, Vec<Event>, Vec<Review>),
    decided: &str,
    error: &str,
    form: &DecideForm,
    status: StatusCode,
) -> Response {
    let now = op.read_at;
    let (open, past): (Vec<&Review>, Vec<&Review>) =
        reviews.iter().partition(|r| r.resolved_at.is_none());
    let open = open.first().map(|r| review_box(r, now));
    let can_decide = reviewer.role == DeskRole::Decide
        && open.is_some()
        && op.status == oncely_core::Status::Unknown;
    let page = OperationPage {
        csrf: who.csrf.clone(),
        who: Some(who),
        key: op.key.to_string(),
        status: op.status.as_str().to_owned(),
        provider: desk.provider_of(&op.action_type).to_owned(),
        action_type: op.action_type.clone(),
        tenant: op.tenant.clone().unwrap_or_else(|| "(none)".into()),
        workflow_id: op.workflow_id.clone(),
        step: op.step.clone(),
        business_object: op.business_object.clone(),
        revision: op.revision,
        attempt: op.attempt_count,
        provider_operation_id: dash(op.provider_operation_id.as_deref()),
        error_code: dash(op.last_error_code.as_deref()),
        created_at: time(op.created_at),
        updated_at: time(op.updated_at),
        result: op
            .result_json
            .as_ref()
            .and_then(|r| serde_json::to_string_pretty(r).ok())
            .unwrap_or_default(),
        open,
        past: past.iter().rev().map(|r| review_box(r, now)).collect(),
        events: events
            .iter()
            .map(|e| EventRow {
                at: time(e.at),
                from: dash(e.from_status.as_deref()),
                to: e.to_status.clone(),
                attempt: e.attempt,
                actor: e.actor.clone(),
                reason: e.reason.clone(),
                error_code: dash(e.error_code.as_deref()),
                provider_operation_id: dash(e.provider_operation_id.as_deref()),
            })
            .collect(),
        can_decide,
        decided: decided.to_owned(),
        error: error.to_owned(),
        form_decision: form.decision.clone(),
        form_provider_operation_id: form.provider_operation_id.clone(),
        form_note: form.note.clone(),
    };
    render(status, &page)
}

async fn operation(
    State(desk): St,
    headers: HeaderMap,
    Path(key): Path<String>,
    Query(q): Query<OperationQuery>,
) -> Response {
    let Some((value, reviewer)) = session(&desk, &headers) else {
        return Redirect::to("/desk/login").into_response();
    };
    let who = who(&desk, &value, &reviewer);
    let Ok(key) = IdempotencyKey::parse(&key) else {
        return not_found(who);
    };
    match load(&desk, &reviewer, &key).await {
        Ok(Some(data)) => {
            let decided = match q.decided.as_str() {
                d @ ("succeeded" | "failed" | "retry") => d,
                _ => "",
            };
            operation_page(
                &desk,
                who,
                &reviewer,
                data,
                decided,
                "",
                &DecideForm::default(),
                StatusCode::OK,
            )
        }
        Ok(None) => not_found(who),
        Err(e) => unavailable(Some(who), &e),
    }
}

/// Check a decision form; the resolution and the trimmed note, or what is wrong.
fn decision(f: &DecideForm) -> Result<(Resolution, String), String> {
    let note = f.note.trim();
    if note.is_empty() {
        return Err("A note is required: say what the decision rests on (a statement line, a call with the provider, …).".into());
    }
    if note.chars().count() > MAX_NOTE_CHARS {
        return Err(format!(
            "The note is longer than {MAX_NOTE_CHARS} characters."
        ));
    }
    let pid = f.provider_operation_id.trim();
    let resolution = match (f.decision.as_str(), pid) {
        ("succeeded", "") => {
            return Err("\"Succeeded\" needs the provider's id of the effect.".into());
        }
        ("succeeded", id) => Resolution::Succeeded {
            provider_operation_id: id.to_owned(),
        },
        ("failed" | "retry", id) if !id.is_empty() => {
            return Err("A provider id only goes with \"succeeded\".".into());
        }
        ("failed", _) => Resolution::Failed,
        ("retry", _) => Resolution::Retry,
        _ => return Err("Choose a decision: succeeded, failed or retry.".into()),
    };
    Ok((resolution, note.to_owned()))
}

async fn decide(
    State(desk): St,
    headers: HeaderMap,
    Path(key): Path<String>,
    Form(f): Form<DecideForm>,
) -> Response {
    if !same_origin(&headers) {
        return cross_site();
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
    let who = who(&desk, &value, &reviewer);
    if !desk.sessions.csrf_ok(&value, &f.csrf) {
        tracing::warn!(reviewer = %reviewer.id, "review desk: decision with a bad CSRF token refused");
        return message(
            StatusCode::FORBIDDEN,
            Some(who),
            "Refused",
            "The form's CSRF token does not match your session; nothing was decided.",
            "/desk/reviews",
        );
    }
    if reviewer.role != DeskRole::Decide {
        tracing::warn!(reviewer = %reviewer.id, "review desk: decision by a reviewer without the decide role refused");
        return message(
            StatusCode::FORBIDDEN,
            Some(who),
            "Not allowed",
            &format!(
                "Your role ({}) may read reviews but not decide them; nothing was decided.",
                reviewer.role.as_str()
            ),
            &format!("/desk/operations/{key}"),
        );
    }
    let Ok(key) = IdempotencyKey::parse(&key) else {
        return not_found(who);
    };
    let data = match load(&desk, &reviewer, &key).await {
        Ok(Some(data)) => data,
        Ok(None) => return not_found(who),
        Err(e) => return unavailable(Some(who), &e),
    };
    let (resolution, note) = match decision(&f) {
        Ok(d) => d,
        Err(problem) => {
            return operation_page(
                &desk,
                who,
                &reviewer,
                data,
                "",
                &problem,
                &f,
                StatusCode::UNPROCESSABLE_ENTITY,
            );
        }
    };
    match desk
        .journal
        .resolve_review(&key, &resolution, &reviewer.id, Some(&note))
        .await
    {
        Ok(op) => {
            tracing::info!(key = %key, reviewer = %reviewer.id, decision = %f.decision, status = %op.status, "review desk: decided");
            Redirect::to(&format!("/desk/operations/{key}?decided={}", f.decision)).into_response()
        }
        Err(e @ (ResolveError::NoOpenReview(_) | ResolveError::NotUnknown { .. })) => message(
            StatusCode::CONFLICT,
            Some(who),
            "Already settled",
            &format!("{e}. Someone (or something) decided first; nothing was changed by you."),
            &format!("/desk/operations/{key}"),
        ),
        Err(ResolveError::Journal(e)) => unavailable(Some(who), &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(decision: &str, pid: &str, note: &str) -> DecideForm {
        DecideForm {
            csrf: String::new(),
            decision: decision.into(),
            provider_operation_id: pid.into(),
            note: note.into(),
        }
    }

    #[test]
    fn decisions_need_a_note_and_the_right_fields() {
        assert!(
            decision(&form("succeeded", "pay_1", "  "))
                .unwrap_err()
                .contains("note is required")
        );
        assert!(
            decision(&form("succeeded", "", "seen"))
                .unwrap_err()
                .contains("provider's id")
        );
        assert!(
            decision(&form("failed", "pay_1", "seen"))
                .unwrap_err()
                .contains("only goes with")
        );
        assert!(
            decision(&form("maybe", "", "seen"))
                .unwrap_err()
                .contains("Choose")
        );
        assert!(decision(&form("failed", "", &"x".repeat(MAX_NOTE_CHARS + 1))).is_err());
        assert_eq!(
            decision(&form("succeeded", " pay_1 ", " in the statement ")).expect("ok"),
            (
                Resolution::Succeeded {
                    provider_operation_id: "pay_1".into()
                },
                "in the statement".into()
            )
        );
        assert_eq!(
            decision(&form("retry", "", "n")).expect("ok").0,
            Resolution::Retry
        );
    }

    #[test]
    fn posts_from_other_sites_are_refused() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("desk.example:8080"));
        assert!(
            same_origin(&h),
            "no Origin, no Sec-Fetch-Site: a non-browser client"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://desk.example:8080"),
        );
        assert!(same_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!same_origin(&h));
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(!same_origin(&h));
    }

    #[test]
    fn ages_read_like_people_say_them() {
        assert_eq!(age(42), "42s");
        assert_eq!(age(300), "5m");
        assert_eq!(age(3 * 3600 + 12 * 60), "3h 12m");
        assert_eq!(age(2 * 86400 + 4 * 3600), "2d 4h");
        assert_eq!(age(-5), "0s");
    }
}
