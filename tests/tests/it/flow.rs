//! Flow control end to end: a burst to a provider that rate-limits — a real one (nginx's
//! `limit_req` in front of the sandbox) and the sandbox's own `rate_limits` fault — through
//! real worker and reconciler processes. What must hold whatever the machine's speed:
//! every action succeeds once (never zero times because the provider said "slow down"),
//! a throttled attempt is deferred and not spent, a `Retry-After` pauses the provider for
//! the whole fleet, and `max_defer` ends a deferral as `failed_final` without a send.
//! How fast a burst drains is the bench's to show (`oncely-bench --throttled`), not a
//! test's.

use oncely_core::Intent;
use oncely_core::config::{ProviderConfig, RateLimitConfig};
use oncely_sandbox::{Faults, Provider, RateLimitFault};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, next_outcome};
use oncely_tests::rate_limiter::RateLimiter;
use serde_json::json;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

fn email(n: usize) -> Intent {
    Intent::from_json(json!({
        "action_type": "email.send", "workflow_id": format!("flow-{n}"), "step": "notify",
        "business_object": format!("applicant-{n}"), "revision": 1,
        "payload": {"to": format!("user-{n}@example.test"), "subject": "Approved", "body": "Yes."}
    }))
    .expect("intent")
}

fn mail_limit(config: &mut oncely_core::config::Config, limit: Option<RateLimitConfig>) {
    match config.providers.get_mut("mail") {
        Some(ProviderConfig::Http(mail)) => mail.rate_limit = limit,
        _ => panic!("the built-in config has an http provider `mail`"),
    }
}

async fn enqueue(fleet: &Fleet, intents: Vec<Intent>) {
    let n = intents.len();
    let new = fleet.enqueue_from_two(intents, Vec::new()).await;
    assert_eq!(new, n, "every intent is new");
}

async fn wait_terminal(fleet: &Fleet, n: i64) {
    eventually("every operation terminal", DEADLINE, || async {
        (fleet.count("succeeded").await + fleet.count("failed_final").await == n).then_some(())
    })
    .await;
}

/// `(key, attempt_count, throttled_attempts)` of every operation.
async fn attempts(fleet: &Fleet) -> Vec<(String, i32, i32)> {
    sqlx::query_as(
        "SELECT idempotency_key, attempt_count, throttled_attempts FROM agent_operations",
    )
    .fetch_all(&fleet.db.pool)
    .await
    .expect("attempts")
}

/// A fleet (fast reconciler) whose `mail` provider is the sandbox behind nginx's
/// `limit_req` (25 r/s, burst 5, `Retry-After: 1`), with `limit` configured for it.
async fn behind_nginx(limit: Option<RateLimitConfig>) -> (Fleet, RateLimiter) {
    let mut fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let nginx = RateLimiter::start(&fleet.sandbox.base_url(), 25, 5, 1).await;
    let front = nginx.base_url.clone();
    fleet.reconfigure(|c| {
        if let Some(ProviderConfig::Http(mail)) = c.providers.get_mut("mail") {
            mail.base_url = front;
        }
        mail_limit(c, limit);
    });
    (fleet, nginx)
}

/// A burst through nginx's `limit_req`, with the limit configured a little below the
/// provider's (as an operator would): every action succeeds once, with few 429s, and no
/// throttled attempt counts against `max_attempts`.
async fn burst_through_nginx(workers: usize) {
    let limit = RateLimitConfig {
        burst: Some(3),
        ..RateLimitConfig::per_second(20.0)
    };
    let (fleet, nginx) = behind_nginx(Some(limit)).await;
    let procs: Vec<_> = (0..workers)
        .map(|_| fleet.worker())
        .chain([fleet.reconciler()])
        .collect();
    let n = 120;
    enqueue(&fleet, (0..n).map(email).collect()).await;
    wait_terminal(&fleet, n as i64).await;

    assert_eq!(
        fleet.count("succeeded").await,
        n as i64,
        "all of them happened"
    );
    let effects = fleet.sandbox.effects();
    assert_eq!(effects.total, n as u64, "one effect per key");
    assert_eq!(effects.duplicates().count(), 0);
    let refused = nginx.requests().iter().filter(|l| l.status == 429).count();
    assert!(
        refused * 10 < n,
        "{refused} of {n} requests refused 429: the fleet kept to the configured limit"
    );
    for (key, attempt, throttled) in attempts(&fleet).await {
        assert_eq!(
            attempt - throttled,
            1,
            "{key}: one attempt spent, throttles not counted"
        );
    }
    drop(procs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_a_real_rate_limiter_happens_once_each_with_two_workers() {
    burst_through_nginx(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_a_real_rate_limiter_happens_once_each_with_four_workers() {
    burst_through_nginx(4).await;
}

/// No limit configured: the fleet learns it from nginx's 429s. Every action still
/// succeeds once; every 429 was a deferral (an event `provider_throttled`), never a spent
/// attempt; the provider's row now carries a rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_configured_limit_the_429s_alone_pace_the_fleet() {
    let (fleet, nginx) = behind_nginx(None).await;
    let procs = [fleet.worker(), fleet.worker(), fleet.reconciler()];
    let n = 120;
    enqueue(&fleet, (0..n).map(email).collect()).await;
    wait_terminal(&fleet, n as i64).await;

    assert_eq!(fleet.count("succeeded").await, n as i64, "none given up");
    let effects = fleet.sandbox.effects();
    assert_eq!((effects.total, effects.duplicates().count()), (n as u64, 0));
    let refused = nginx.requests().iter().filter(|l| l.status == 429).count() as i64;
    assert!(refused > 0, "a burst of {n} at once must meet the limit");
    let deferrals: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM operation_events WHERE to_status = 'deferred' AND reason = 'provider_throttled'",
    )
    .fetch_one(&fleet.db.pool)
    .await
    .expect("events");
    assert_eq!(
        deferrals, refused,
        "each 429 deferred its attempt, with an event"
    );
    let spent: i64 =
        sqlx::query_scalar("SELECT sum(attempt_count - throttled_attempts) FROM agent_operations")
            .fetch_one(&fleet.db.pool)
            .await
            .expect("attempts");
    assert_eq!(
        spent, n as i64,
        "only the sends that went through were attempts"
    );
    let rate: Option<f64> =
        sqlx::query_scalar("SELECT rate FROM provider_budgets WHERE provider = 'mail'")
            .fetch_one(&fleet.db.pool)
            .await
            .expect("budget row");
    assert!(rate.is_some(), "the fleet learned a rate from the 429s");
    drop(procs);
}

/// `Retry-After: 30` on one worker's call pauses the provider for every worker: the
/// throttled operation is due in 30 s with its attempt not spent, and what arrives
/// meanwhile waits in the journal without reaching the provider.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_pauses_the_provider_for_the_whole_fleet() {
    let fleet = Fleet::new().await;
    fleet
        .sandbox
        .set_faults(Faults {
            rate_limits: vec![RateLimitFault {
                provider: Some(Provider::Mail),
                per_second: 0.001,
                burst: 1,
                retry_after_s: Some(30),
            }],
            ..Faults::default()
        })
        .expect("faults");
    let procs = [fleet.worker(), fleet.worker()];
    enqueue(&fleet, vec![email(0)]).await;
    eventually("the first email sent", DEADLINE, || async {
        (fleet.count("succeeded").await == 1).then_some(())
    })
    .await;
    enqueue(&fleet, vec![email(1)]).await;
    eventually("the second email deferred", DEADLINE, || async {
        (fleet.count("deferred").await == 1).then_some(())
    })
    .await;
    let (attempt, throttled, due_in, code): (i32, i32, f64, String) = sqlx::query_as(
        "SELECT attempt_count, throttled_attempts, extract(epoch FROM lease_until - now())::float8, last_error_code \
         FROM agent_operations WHERE status = 'deferred'",
    )
    .fetch_one(&fleet.db.pool)
    .await
    .expect("deferred row");
    assert_eq!(
        (attempt, throttled),
        (1, 1),
        "the throttled attempt is not spent"
    );
    assert_eq!(code, "throttled:http_429");
    assert!(
        (25.0..=30.5).contains(&due_in),
        "due when the provider said: {due_in} s"
    );
    let paused_for: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM paused_until - now())::float8 FROM provider_budgets WHERE provider = 'mail'",
    )
    .fetch_one(&fleet.db.pool)
    .await
    .expect("budget row");
    assert!(
        (25.0..=30.5).contains(&paused_for),
        "the fleet's pause: {paused_for} s"
    );
    // Every worker reads a provider's state at most STATE_TTL (250 ms) old: once the
    // pause is that old (the database's clock), none calls the provider before it ends.
    eventually("every worker has seen the pause", DEADLINE, || async {
        let age: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM now() - updated_at)::float8 FROM provider_budgets WHERE provider = 'mail'",
        )
        .fetch_one(&fleet.db.pool)
        .await
        .expect("budget row");
        (age > 0.5).then_some(())
    })
    .await;
    enqueue(&fleet, (2..8).map(email).collect()).await;
    eventually("the later emails deferred", DEADLINE, || async {
        (fleet.count("deferred").await == 7).then_some(())
    })
    .await;
    let stats = fleet.sandbox.stats();
    assert_eq!(
        (stats.executes.mail, stats.rate_limited_429),
        (1, 1),
        "nothing reached the provider during its pause"
    );
    let spent: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM agent_operations WHERE status = 'deferred' AND attempt_count - throttled_attempts = 0",
    )
    .fetch_one(&fleet.db.pool)
    .await
    .expect("attempts");
    assert_eq!(spent, 7, "no deferred operation spent an attempt");
    drop(procs);
}

/// Past its action type's `max_defer`, a deferred operation ends `failed_final` with
/// `deferred_too_long` and an outcome event — and was never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_defer_gives_up_without_a_send() {
    let fleet = Fleet::with(FleetOptions {
        reconciler: Some(FAST_RECONCILER),
        configure: Some(|c| {
            if let Some(p) = c.actions.get_mut("email.send") {
                p.max_defer = Duration::from_secs(2);
            }
        }),
        ..FleetOptions::default()
    })
    .await;
    fleet
        .sandbox
        .set_faults(Faults {
            rate_limits: vec![RateLimitFault {
                provider: Some(Provider::Mail),
                per_second: 0.001,
                burst: 1,
                retry_after_s: Some(60),
            }],
            ..Faults::default()
        })
        .expect("faults");
    let mut outcomes = fleet.listen_outcomes("email.send.failed_final").await;
    let procs = [fleet.worker(), fleet.reconciler()];
    enqueue(&fleet, vec![email(0), email(1)]).await;
    let (_, event) = next_outcome(&mut outcomes).await;
    assert_eq!(event["error_code"], "deferred_too_long", "{event}");
    let key = event["idempotency_key"].as_str().expect("key").to_owned();
    assert_eq!(fleet.sandbox.effects().count(&key), 0, "never sent");
    let (status, code, payload_gone): (String, String, bool) = sqlx::query_as(
        "SELECT status, last_error_code, payload IS NULL FROM agent_operations WHERE idempotency_key = $1",
    )
    .bind(&key)
    .fetch_one(&fleet.db.pool)
    .await
    .expect("row");
    assert_eq!(
        (status.as_str(), code.as_str(), payload_gone),
        ("failed_final", "deferred_too_long", true)
    );
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT reason FROM operation_events WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(&key)
    .fetch_all(&fleet.db.pool)
    .await
    .expect("events");
    assert_eq!(
        reasons.last().map(String::as_str),
        Some("deferred_too_long"),
        "{reasons:?}"
    );
    wait_terminal(&fleet, 2).await;
    drop(procs);
}

/// Two workers' takes share one budget: what the first took, the second cannot.
#[tokio::test]
async fn two_takes_share_one_budget() {
    let db = oncely_tests::TestDb::new().await;
    let journal = oncely_core::journal::Journal::new(db.pool.clone());
    let limit = oncely_core::journal::Limit {
        per_second: Some(10.0),
        burst: 2,
        max_in_flight: None,
    };
    journal
        .ensure_budgets(&[("mail".into(), limit)])
        .await
        .expect("ensure");
    let horizon = Duration::from_secs(1);
    let first = journal
        .take_slots("mail", &["email.send"], None, 20, horizon)
        .await
        .expect("take");
    // A full bucket: the burst at once, then one every 100 ms within the second.
    assert_eq!(first.slots.len(), 12, "{first:?}");
    assert_eq!(first.deferred.len(), 8);
    let second = journal
        .take_slots("mail", &["email.send"], None, 20, horizon)
        .await
        .expect("take");
    assert!(
        second.slots.len() <= 1,
        "the first took the second's slots: {second:?}"
    );
    assert!(
        second
            .deferred
            .iter()
            .all(|d| *d >= Duration::from_millis(900)),
        "due after the first take's slots: {second:?}"
    );
    // A throttle pauses everyone, whatever their bucket says.
    journal
        .throttled("mail", Duration::from_secs(30), None, 1)
        .await
        .expect("throttled");
    let paused = journal
        .take_slots("mail", &["email.send"], None, 3, horizon)
        .await
        .expect("take");
    assert!(paused.slots.is_empty(), "{paused:?}");
    assert!(
        paused
            .deferred
            .iter()
            .all(|d| *d >= Duration::from_secs(29))
    );
}
