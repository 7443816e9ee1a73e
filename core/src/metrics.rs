//! Metric names (the only place they are spelled) and the Prometheus exporter.
//!
//! Labels are bounded: action type, provider, status, outcome, verdict, reason — never
//! keys, tenants or workflows. Histograms get explicit buckets, because without them the
//! exporter renders summaries and `histogram_quantile` panels stay empty.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::net::SocketAddr;

/// Intents recorded by producers, by `result` (enqueued, duplicate, conflict, failed).
pub const INTENTS_ENQUEUED: &str = "oncely_intents_enqueued_total";
/// Postgres failovers this process followed (a multi-host `DATABASE_URL` whose writable
/// host changed).
pub const DB_FAILOVERS: &str = "oncely_db_failovers_total";
/// Deliveries by `action_type` and `verdict` (claimed, duplicate, in_flight, unknown, conflict, invalid, requeued).
pub const DELIVERIES: &str = "oncely_deliveries_total";
/// Messages dead-lettered as invalid, by `reason`.
pub const INVALID_MESSAGES: &str = "oncely_invalid_messages_total";
/// Status transitions made by this process, by `action_type` and `status`.
pub const TRANSITIONS: &str = "oncely_transitions_total";
/// Provider call latency (seconds), by `provider` and `outcome`.
pub const PROVIDER_CALL_SECONDS: &str = "oncely_provider_call_seconds";
/// Calls a provider turned away at the door, by `provider` and `reason` (auth = 401/403,
/// tls_certificate, tls_handshake): fixing them takes a person, not a retry.
pub const PROVIDER_REFUSALS: &str = "oncely_provider_refusals_total";
/// Deliveries per claim statement.
pub const CLAIM_BATCH_SIZE: &str = "oncely_claim_batch_size";
/// Deliveries settled per ack frame (a `multiple` ack settles a run of them; `_count` =
/// ack frames, `_sum` = deliveries acked).
pub const ACK_BATCH_SIZE: &str = "oncely_ack_batch_size";
/// Intents per record statement (producers, the gateway: requests recorded together).
pub const RECORD_BATCH_SIZE: &str = "oncely_record_batch_size";
/// Journal statement latency (seconds), by `statement`.
pub const JOURNAL_STATEMENT_SECONDS: &str = "oncely_journal_statement_seconds";
/// Reconciler decisions, by `action_type` and `decision`.
pub const RECONCILE_DECISIONS: &str = "oncely_reconcile_decisions_total";
/// Reviews opened, by `action_type` and `reason` (a [`crate::review::ReviewReason`]
/// label, which also says its class: `still_pending` and `lookup_failing` are transient).
pub const REVIEWS_OPENED: &str = "oncely_reviews_opened_total";
/// Reviews closed without a person, by `reason` and `how` (`lookup`, `late_answer`,
/// `statement`). Counted by reconcilers from the journal, once per review across the fleet.
pub const REVIEWS_AUTO_CLOSED: &str = "oncely_reviews_auto_closed_total";
/// Reviews resolved by a person, by `reason` and `resolution` (`succeeded`, `failed`,
/// `retry`). Counted like [`REVIEWS_AUTO_CLOSED`].
pub const REVIEWS_RESOLVED: &str = "oncely_reviews_resolved_total";
/// Reviews open now (gauge, from the reconciler).
pub const REVIEWS_OPEN: &str = "oncely_reviews_open";
/// Reviews open now by `waiting_on` (`person`, `lookup`) (gauge, from the reconciler).
pub const REVIEWS_WAITING: &str = "oncely_reviews_waiting";
/// Age in seconds of the oldest open review, by `waiting_on` (`person`: only a person can
/// close it; `lookup`: still re-checked); 0 when there is none (gauge, from the reconciler).
pub const REVIEW_OLDEST_OPEN_SECONDS: &str = "oncely_review_oldest_open_age_seconds";
/// Sweeper actions, by `action`.
pub const SWEEPER_ACTIONS: &str = "oncely_sweeper_actions_total";
/// Publishes, by `kind` (intent, outcome, reconcile, dead_letter, republish) and `result` (confirmed, failed).
pub const PUBLISHES: &str = "oncely_publishes_total";
/// Time from an operation's creation to a terminal state (seconds), by `action_type` and `status`.
pub const TIME_TO_TERMINAL_SECONDS: &str = "oncely_time_to_terminal_seconds";
/// Operations by `status` (gauge, from the reconciler).
pub const OPERATIONS: &str = "oncely_operations";
/// Connection (re)establishments, by `kind` (amqp) and `result`.
pub const CONNECTIONS: &str = "oncely_connections_total";
/// Consumes of a queue that got no answer within the deadline or a `541 INTERNAL_ERROR`
/// (a quorum queue whose leader is lost, docs/operations.md), by `queue`.
pub const QUEUE_UNUSABLE: &str = "oncely_queue_unusable_total";

/// Throttled answers from providers (429, 503 with `Retry-After`, SMTP 421/45x), by
/// `provider` and `code`: nothing was sent, the attempt was deferred.
pub const PROVIDER_THROTTLES: &str = "oncely_provider_throttles_total";
/// Operations moved to `deferred`, by `provider` and `reason` (`throttled`: the provider
/// said so; `no_budget`: the fleet's budget had no slot for it within the horizon).
pub const DEFERRALS: &str = "oncely_deferrals_total";
/// Deferred operations given up after `max_defer` (`deferred_too_long`), by `action_type`.
pub const DEFERRED_GIVEN_UP: &str = "oncely_deferred_given_up_total";
/// The rate in force for a provider (requests/s across the fleet), by `provider`; NaN
/// while unlimited. Set by the reconciler every sweep. Beside it,
/// [`PROVIDER_RATE_CONFIGURED`].
pub const PROVIDER_RATE: &str = "oncely_provider_rate_per_second";
/// The configured rate of a provider (`[providers.NAME.rate_limit] per_second`; NaN when
/// none is configured).
pub const PROVIDER_RATE_CONFIGURED: &str = "oncely_provider_rate_configured_per_second";
/// Seconds a provider is still paused for (its `Retry-After`), by `provider`.
pub const PROVIDER_PAUSED_SECONDS: &str = "oncely_provider_paused_seconds";
/// Operations waiting in `deferred`, by `provider`, counted by the sweeper.
pub const DEFERRED_BACKLOG: &str = "oncely_deferred_backlog";
/// How long the oldest deferred operation of a `provider` has been waiting since it was
/// first deferred.
pub const DEFERRED_OLDEST_AGE: &str = "oncely_deferred_oldest_age_seconds";
/// Decisions before the send (docs/approvals.md), by `action_type` and `decision`:
/// `held`, `approved`, `rejected`, `cancelled`, `expired` (a `rejected` by its deadline
/// counts as `rejected`; [`TRANSITIONS`] has the statuses).
pub const CONTROL_DECISIONS: &str = "oncely_control_decisions_total";
/// Operations waiting for approval, by `action_type`, counted by the sweeper.
pub const HELD: &str = "oncely_held_for_approval";
/// How long the oldest operation of an `action_type` has been waiting for approval.
pub const HELD_OLDEST_AGE: &str = "oncely_held_oldest_age_seconds";
/// Time a won claim waited for its slot in the provider's budget before the call.
pub const SLOT_WAIT_SECONDS: &str = "oncely_slot_wait_seconds";

/// Submits the gateway refused with 429 over a quota, by `scope` (`token`, `tenant`).
pub const GATEWAY_QUOTA_REFUSALS: &str = "oncely_gateway_quota_refusals_total";

/// Gateway requests, by `route`, `method` and `status`.
pub const GATEWAY_REQUESTS: &str = "oncely_gateway_requests_total";
/// Gateway request latency, by `route` and `method`.
pub const GATEWAY_REQUEST_SECONDS: &str = "oncely_gateway_request_seconds";
/// Long-polls (`?wait=`, MCP `action_wait`) the gateway holds open now.
pub const GATEWAY_LONG_POLLS_OPEN: &str = "oncely_gateway_long_polls_open";

/// Latency buckets (seconds): 1 ms … 60 s.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Batch-size buckets.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

fn builder() -> Result<PrometheusBuilder, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .and_then(|b| {
            // oncely_claim_batch_size, oncely_ack_batch_size, oncely_record_batch_size.
            b.set_buckets_for_metric(Matcher::Suffix("_batch_size".into()), BATCH_BUCKETS)
        })
        .map_err(|e| e.to_string())
}

/// How often a handle's histograms are drained into their buckets when nobody scrapes.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Install the global recorder and return a handle that renders `/metrics` (for a
/// process that serves it on its own router, like the gateway). Call it inside a tokio
/// runtime: a task drains the histograms every few seconds, so an unscraped process does
/// not keep every sample (rendering drains them too, but nobody may ever scrape).
pub fn install_handle() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    let handle = builder()?.install_recorder().map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Install the global recorder and serve `/metrics` on `addr` (the exporter drains its
/// histograms itself). Without an address (or port 0) nothing is installed: the metric
/// calls are no-ops, and nothing keeps samples nobody will read.
pub fn install(addr: Option<SocketAddr>) -> Result<(), String> {
    match addr {
        Some(a) if a.port() != 0 => builder()?
            .with_http_listener(a)
            .install()
            .map_err(|e| format!("cannot serve metrics on {a}: {e}")),
        _ => Ok(()),
    }
}

/// The flow-control series of each provider, at 0 from the start (see [`init_series`]):
/// `(name, the code of its usual throttle)` — `http_429`, `smtp_421`.
pub fn init_provider_series(providers: &[(&str, &'static str)]) {
    use metrics::counter;
    for &(p, throttle) in providers {
        let p = p.to_owned();
        for reason in ["throttled", "no_budget"] {
            counter!(DEFERRALS, "provider" => p.clone(), "reason" => reason).increment(0);
        }
        counter!(PROVIDER_THROTTLES, "provider" => p.clone(), "code" => throttle).increment(0);
    }
}

/// Known label values, so counters exist (at 0) from the start: a rate over a series that
/// appears only at its first increment misses that increment, and a dashboard panel or
/// alert over a missing series shows "no data" instead of 0.
pub fn init_series(action_types: &[&str]) {
    use metrics::counter;
    for kind in ["intent", "outcome", "reconcile", "dead_letter", "republish"] {
        for result in ["confirmed", "failed"] {
            counter!(PUBLISHES, "kind" => kind, "result" => result).increment(0);
        }
    }
    for result in ["established", "lost"] {
        counter!(CONNECTIONS, "kind" => "amqp", "result" => result).increment(0);
    }
    for action in [
        "lease_expired",
        "republished_planned",
        "republished_retry",
        "unknown_rechecked",
        "review_rechecked",
        "republished_deferred",
    ] {
        counter!(SWEEPER_ACTIONS, "action" => action).increment(0);
    }
    for &a in action_types {
        let a = a.to_owned();
        for verdict in [
            "claimed",
            "duplicate",
            "in_flight",
            "lease_expired",
            "unknown",
            "not_due",
            "conflict",
            "invalid",
            "requeued",
            "deferred",
            "held",
            "expired",
        ] {
            counter!(DELIVERIES, "action_type" => a.clone(), "verdict" => verdict).increment(0);
        }
        for status in [
            "succeeded",
            "failed_final",
            "failed_retryable",
            "unknown",
            "deferred",
            "rejected",
            "cancelled",
            "expired",
        ] {
            counter!(TRANSITIONS, "action_type" => a.clone(), "status" => status).increment(0);
        }
        for decision in ["held", "approved", "rejected", "cancelled", "expired"] {
            counter!(CONTROL_DECISIONS, "action_type" => a.clone(), "decision" => decision)
                .increment(0);
        }
        counter!(DEFERRED_GIVEN_UP, "action_type" => a.clone()).increment(0);
        for decision in [
            "found_succeeded",
            "found_rejected",
            "retry_absent",
            "deferred",
            "review",
            "raced",
            "not_taken",
        ] {
            counter!(RECONCILE_DECISIONS, "action_type" => a.clone(), "decision" => decision)
                .increment(0);
        }
        for &reason in crate::review::ReviewReason::LABELS {
            counter!(REVIEWS_OPENED, "action_type" => a.clone(), "reason" => reason).increment(0);
        }
    }
    for &reason in crate::review::ReviewReason::LABELS {
        for how in ["lookup", "late_answer", "statement"] {
            counter!(REVIEWS_AUTO_CLOSED, "reason" => reason, "how" => how).increment(0);
        }
        for resolution in ["succeeded", "failed", "retry"] {
            counter!(REVIEWS_RESOLVED, "reason" => reason, "resolution" => resolution).increment(0);
        }
    }
}
