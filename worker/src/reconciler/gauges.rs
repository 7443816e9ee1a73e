//! The sweeper's gauges: the backlog by status, the open reviews, the providers' flow
//! state, and the terminal totals (counted on their own timer: they read the whole
//! journal).

use super::sweeper::Bounds;
use super::*;

/// The count of the terminal statuses for their gauges: it reads the whole journal
/// (seconds at tens of millions of operations), so it runs every `totals_interval`
/// (never when zero), beside the sweeps, never inside one — a pass must not wait for it.
pub(super) struct Totals {
    every: std::time::Duration,
    due: Option<tokio::time::Instant>,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Totals {
    pub(super) fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            due: (!every.is_zero()).then(tokio::time::Instant::now),
            running: None,
        }
    }

    /// Start the count if it is due and the last one has ended.
    pub(super) fn start_if_due(&mut self, ctx: &Context) {
        if self.running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.running = None;
        let now = tokio::time::Instant::now();
        if self.due.is_none_or(|due| now < due) {
            return;
        }
        self.due = Some(now + self.every);
        let journal = ctx.journal.clone();
        self.running = Some(tokio::spawn(async move {
            let started = std::time::Instant::now();
            match journal.status_counts().await {
                Ok(counts) => {
                    set_status_gauges(counts, |s| s.is_terminal());
                    tracing::debug!(
                        seconds = started.elapsed().as_secs_f64(),
                        "counted the operations by status"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "counting the operations by status failed; next interval")
                }
            }
        }));
    }
}

impl Drop for Totals {
    fn drop(&mut self) {
        if let Some(t) = self.running.take() {
            t.abort();
        }
    }
}

/// Set `oncely_operations{status}` of each status `which` picks from `counts`, 0 for one
/// that has no operations (absent from `counts`), or it would keep its last value.
fn set_status_gauges(counts: Vec<(String, i64)>, which: impl Fn(&Status) -> bool) {
    let counts: std::collections::HashMap<String, i64> = counts.into_iter().collect();
    for s in Status::ALL.iter().filter(|s| which(s)) {
        metrics::gauge!(m::OPERATIONS, "status" => s.as_str())
            .set(counts.get(s.as_str()).copied().unwrap_or(0) as f64);
    }
}

/// Per provider: the deferred backlog and its oldest's age, the rate in force and the
/// configured one, the pause left — what the dashboard's "Rate limits" row and the
/// alert "backlog will not drain" read.
async fn set_flow_gauges(ctx: &Context) -> anyhow::Result<()> {
    let mut backlog: std::collections::BTreeMap<&str, (i64, f64)> = ctx
        .flow
        .routes()
        .map(|(provider, _, _)| (provider, (0, 0.0)))
        .collect();
    for (action_type, n, age) in ctx.journal.deferred_backlog().await? {
        let provider = ctx
            .config
            .actions
            .get(&action_type)
            .map_or("", |p| p.provider.as_str());
        if let Some(entry) = backlog.get_mut(provider) {
            entry.0 += n;
            entry.1 = entry.1.max(age);
        }
    }
    for (provider, (n, age)) in backlog {
        metrics::gauge!(m::DEFERRED_BACKLOG, "provider" => provider.to_owned()).set(n as f64);
        metrics::gauge!(m::DEFERRED_OLDEST_AGE, "provider" => provider.to_owned()).set(age);
    }
    // Held for approval: every action type shows, at zero when none wait.
    let mut held: std::collections::BTreeMap<String, (i64, f64)> = ctx
        .config
        .actions
        .keys()
        .map(|a| (a.clone(), (0, 0.0)))
        .collect();
    for (action_type, n, age) in ctx.journal.held_backlog().await? {
        held.insert(action_type, (n, age));
    }
    for (action_type, (n, age)) in held {
        metrics::gauge!(m::HELD, "action_type" => action_type.clone()).set(n as f64);
        metrics::gauge!(m::HELD_OLDEST_AGE, "action_type" => action_type).set(age);
    }
    let now = chrono::Utc::now();
    for b in ctx.journal.budgets().await? {
        let p = b.provider.clone();
        match b.rate {
            Some(r) => metrics::gauge!(m::PROVIDER_RATE, "provider" => p.clone()).set(r),
            None => metrics::gauge!(m::PROVIDER_RATE, "provider" => p.clone()).set(f64::NAN),
        }
        metrics::gauge!(m::PROVIDER_RATE_CONFIGURED, "provider" => p.clone())
            .set(b.configured_rate.unwrap_or(f64::NAN));
        let paused = (b.paused_until - now).num_milliseconds().max(0) as f64 / 1000.0;
        metrics::gauge!(m::PROVIDER_PAUSED_SECONDS, "provider" => p).set(paused);
    }
    Ok(())
}

/// The backlog gauges. Every live status gets a value each sweep (0 too, or an emptied
/// status would keep its last one), counted on the live rows' own indexes, `planned` and
/// `executing` within the passes' windows ([`Since`]); the terminal statuses when
/// [`Totals`] says so.
pub(super) async fn set_gauges(
    ctx: &Context,
    totals: &mut Totals,
    since: &Bounds,
) -> anyhow::Result<()> {
    let now = std::time::Instant::now();
    let planned = since
        .planned
        .window(now)
        .map(|w| w + ctx.config.reconciler.republish_after);
    let live = ctx
        .journal
        .live_status_counts(planned, since.leases.window(now))
        .await?;
    set_status_gauges(live, |s| !s.is_terminal());
    set_flow_gauges(ctx).await?;
    totals.start_if_due(ctx);
    let open = ctx.journal.open_reviews().await?;
    metrics::gauge!(m::REVIEWS_OPEN).set((open.for_person + open.for_lookup) as f64);
    metrics::gauge!(m::REVIEWS_WAITING, "waiting_on" => "person").set(open.for_person as f64);
    metrics::gauge!(m::REVIEWS_WAITING, "waiting_on" => "lookup").set(open.for_lookup as f64);
    metrics::gauge!(m::REVIEW_OLDEST_OPEN_SECONDS, "waiting_on" => "person")
        .set(open.oldest_for_person_secs);
    metrics::gauge!(m::REVIEW_OLDEST_OPEN_SECONDS, "waiting_on" => "lookup")
        .set(open.oldest_for_lookup_secs);
    Ok(())
}
