//! Flow control in a worker or reconciler process: asking the fleet's budget for slots
//! before calling a provider, and telling it when the provider pushes back.
//!
//! Why here and not in the adapter: the budget is the fleet's (one row per provider in
//! the journal, core/src/journal/budget.rs), a claim batch asks for all its slots in one
//! statement, and the provider's own signals must slow *every* process down, not just the
//! one that heard them. An adapter only reads the signals ([`crate::provider::Pushback`]).
//!
//! A provider with a configured `rate_limit` takes slots for every batch. One without is
//! unlimited until it pushes back: the process reads its row at most every
//! [`STATE_TTL`] (cached), and takes slots only while the row says it is paused or has a
//! rate in force. So a fleet whose providers never push back pays one read per provider
//! every quarter second, not a statement per batch.
//!
//! Pushback is reported off the hot path: one task per provider sends what accumulated
//! (throttle count, longest wait, announced limit) in one statement, and again if more
//! arrived meanwhile — a burst of 429s is one or two statements, not one per answer.

use crate::provider::{Outcome, Pushback};
use oncely_core::config::Config;
use oncely_core::journal::budget::{BudgetState, DEFAULT_HORIZON, STATE_TTL};
use oncely_core::journal::{Journal, JournalError, Limit};
use oncely_core::metrics as m;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// When one request may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Call after waiting this long (zero: at once).
    Call(Duration),
    /// No slot within the horizon: defer it, due in this long.
    Defer(Duration),
}

/// The flow control of one process, for every configured provider.
#[derive(Debug, Default)]
pub struct Flow {
    providers: BTreeMap<String, Arc<ProviderFlow>>,
}

#[derive(Debug)]
struct ProviderFlow {
    name: String,
    limit: Option<Limit>,
    action_types: Vec<String>,
    /// `http_429` or `smtp_421`: the code its throttles usually carry.
    throttle_code: &'static str,
    /// The row as last read (unconfigured providers only), and when.
    cached: Mutex<Option<(Instant, BudgetState)>>,
    /// Successful calls in the current one-second window, for the rate first set when an
    /// unconfigured provider pushes back.
    window: Mutex<Window>,
    /// Pushback waiting to be reported.
    report: Mutex<Report>,
}

/// Successes counted in one-second windows: the current one, and the rate of the one
/// before it with when it ended.
#[derive(Debug)]
struct Window {
    start: Instant,
    count: u32,
    previous: Option<(Instant, f64)>,
}

#[derive(Debug, Default)]
struct Report {
    sending: bool,
    throttles: u32,
    wait: Option<Duration>,
    limit: Option<f64>,
}

impl Flow {
    /// Flow control for the providers `config` routes actions to.
    pub fn new(config: &Config) -> Self {
        let mut providers = BTreeMap::new();
        for (name, p) in &config.providers {
            let action_types: Vec<String> = config
                .actions
                .iter()
                .filter(|(_, a)| &a.provider == name)
                .map(|(t, _)| t.clone())
                .collect();
            let limit = p.rate_limit().map(|r| Limit {
                per_second: r.per_second,
                burst: r.burst(),
                max_in_flight: r.max_in_flight,
            });
            providers.insert(
                name.clone(),
                Arc::new(ProviderFlow {
                    name: name.clone(),
                    limit,
                    action_types,
                    throttle_code: if p.kind() == "smtp" {
                        "smtp_421"
                    } else {
                        "http_429"
                    },
                    cached: Mutex::new(None),
                    window: Mutex::new(Window {
                        start: Instant::now(),
                        count: 0,
                        previous: None,
                    }),
                    report: Mutex::new(Report::default()),
                }),
            );
        }
        Self { providers }
    }

    /// Write every provider's configured limit into its row (at start).
    pub async fn ensure(&self, journal: &Journal) -> Result<(), JournalError> {
        let limits: Vec<(String, Limit)> = self
            .providers
            .values()
            .map(|p| {
                let limit = p.limit.unwrap_or(Limit {
                    per_second: None,
                    burst: 1,
                    max_in_flight: None,
                });
                (p.name.clone(), limit)
            })
            .collect();
        journal.ensure_budgets(&limits).await
    }

    /// [`Flow::ensure`] through database trouble (as every journal call at start): a
    /// limit that cannot be written is logged, and the rows keep their last limit.
    pub async fn ensure_with_retry(&self, journal: &Journal) {
        if let Err(e) = crate::retry::journal("ensure_budgets", Duration::from_secs(30), || {
            self.ensure(journal)
        })
        .await
        {
            tracing::error!(error = %e, "could not write the providers' rate limits into the journal; the rows keep their last limits");
        }
    }

    /// The providers and their action types (the deferred pass meters each provider).
    pub fn routes(&self) -> impl Iterator<Item = (&str, &[String], Option<Limit>)> {
        self.providers
            .values()
            .map(|p| (p.name.as_str(), p.action_types.as_slice(), p.limit))
    }

    /// The providers and the code of their usual throttle, for the metrics' series.
    pub fn provider_series(&self) -> Vec<(&str, &'static str)> {
        self.providers
            .values()
            .map(|p| (p.name.as_str(), p.throttle_code))
            .collect()
    }

    /// Slots for `n` requests to `provider`, in order: the first are to be called (after
    /// their wait), the rest deferred.
    pub async fn plan(
        &self,
        journal: &Journal,
        provider: &str,
        n: usize,
    ) -> Result<Vec<Slot>, JournalError> {
        let Some(p) = self.providers.get(provider) else {
            return Ok(vec![Slot::Call(Duration::ZERO); n]);
        };
        if p.limit.is_none() && !p.state(journal).await?.limited() {
            return Ok(vec![Slot::Call(Duration::ZERO); n]);
        }
        let types: Vec<&str> = p.action_types.iter().map(String::as_str).collect();
        let grant = journal
            .take_slots(
                provider,
                &types,
                p.limit.and_then(|l| l.max_in_flight),
                n,
                DEFAULT_HORIZON,
            )
            .await?;
        Ok(grant
            .slots
            .into_iter()
            .map(Slot::Call)
            .chain(grant.deferred.into_iter().map(Slot::Defer))
            .collect())
    }

    /// What one call's answer says: count a success, and report a throttle or a limit
    /// the provider announced (in the background, to the whole fleet).
    pub fn observe(
        &self,
        journal: &Journal,
        provider: &str,
        outcome: &Outcome,
        pushback: &Pushback,
    ) {
        let Some(p) = self.providers.get(provider) else {
            return;
        };
        let throttled = match outcome {
            Outcome::Throttled { code, .. } => {
                metrics::counter!(m::PROVIDER_THROTTLES, "provider" => provider.to_owned(), "code" => code.clone())
                    .increment(1);
                true
            }
            Outcome::Succeeded { .. } => {
                p.count_success();
                false
            }
            _ => false,
        };
        if throttled || !pushback.is_empty() {
            p.report(journal, throttled, pushback);
        }
    }
}

impl Flow {
    /// What a lookup's answer says: a `429` pauses the provider for the fleet like an
    /// execute's (the lookup does not carry the answer's fields, so the default wait).
    pub fn observe_lookup(
        &self,
        journal: &Journal,
        provider: &str,
        remote: &crate::provider::Remote,
    ) {
        if let crate::provider::Remote::Failed { code } = remote
            && code == "http_429"
            && let Some(p) = self.providers.get(provider)
        {
            metrics::counter!(m::PROVIDER_THROTTLES, "provider" => provider.to_owned(), "code" => code.clone())
                .increment(1);
            p.report(journal, true, &Pushback::default());
        }
    }
}

impl ProviderFlow {
    /// The row's state, read again when older than [`STATE_TTL`].
    async fn state(&self, journal: &Journal) -> Result<BudgetState, JournalError> {
        let now = Instant::now();
        if let Some((at, state)) = *self.cached.lock().unwrap_or_else(PoisonError::into_inner)
            && now.duration_since(at) < STATE_TTL
        {
            return Ok(state);
        }
        let state = journal
            .budget_state(&self.name)
            .await?
            .unwrap_or(BudgetState {
                rate: None,
                paused_for: Duration::ZERO,
            });
        *self.cached.lock().unwrap_or_else(PoisonError::into_inner) = Some((now, state));
        Ok(state)
    }

    fn count_success(&self) {
        let mut w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let elapsed = now.duration_since(w.start);
        if elapsed >= Duration::from_secs(1) {
            let rate = f64::from(w.count) / elapsed.as_secs_f64();
            w.previous = Some((now, rate));
            w.start = now;
            w.count = 0;
        }
        w.count += 1;
    }

    /// What this process achieved lately: the last whole window if it ended within the
    /// last second, or what the current one has seen so far (over at least a quarter
    /// second, so three early answers are not read as a huge rate).
    fn observed_rate(&self) -> Option<f64> {
        let w = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let current = f64::from(w.count) / now.duration_since(w.start).as_secs_f64().max(0.25);
        let previous = w
            .previous
            .filter(|(end, _)| now.duration_since(*end) < Duration::from_secs(1))
            .map_or(0.0, |(_, rate)| rate);
        let rate = previous.max(current);
        (rate > 0.0).then_some(rate)
    }

    /// Queue the pushback; start the reporting task unless one is running.
    fn report(self: &Arc<Self>, journal: &Journal, throttled: bool, pushback: &Pushback) {
        let start = {
            let mut r = self.report.lock().unwrap_or_else(PoisonError::into_inner);
            r.throttles += u32::from(throttled);
            if throttled {
                let wait = pushback
                    .wait
                    .unwrap_or(crate::decide::DEFAULT_THROTTLE_WAIT);
                r.wait = Some(r.wait.map_or(wait, |w| w.max(wait)));
            } else if let Some(wait) = pushback.wait {
                r.wait = Some(r.wait.map_or(wait, |w| w.max(wait)));
            }
            if let Some(limit) = pushback.limit_per_second {
                r.limit = Some(r.limit.map_or(limit, |l| l.min(limit)));
            }
            !std::mem::replace(&mut r.sending, true)
        };
        if start {
            let (me, journal) = (self.clone(), journal.clone());
            tokio::spawn(async move { me.send_reports(&journal).await });
        }
    }

    /// Send what accumulated until nothing is left.
    async fn send_reports(&self, journal: &Journal) {
        loop {
            let (throttles, wait, limit) = {
                let mut r = self.report.lock().unwrap_or_else(PoisonError::into_inner);
                if r.throttles == 0 && r.wait.is_none() && r.limit.is_none() {
                    r.sending = false;
                    return;
                }
                let taken = (r.throttles, r.wait.take(), r.limit.take());
                r.throttles = 0;
                taken
            };
            if let Some(limit) = limit
                && let Err(e) = journal.learned_rate(&self.name, limit).await
            {
                tracing::warn!(provider = %self.name, error = %e, "could not record the provider's announced limit");
            }
            if let Some(wait) = wait {
                let observed = (throttles > 0).then(|| self.observed_rate()).flatten();
                match journal
                    .throttled(&self.name, wait, observed, throttles)
                    .await
                {
                    Ok(()) => tracing::info!(
                        provider = %self.name,
                        throttles,
                        wait_ms = wait.as_millis() as u64,
                        "provider pushed back: paused for the fleet"
                    ),
                    Err(e) => {
                        tracing::warn!(provider = %self.name, error = %e, "could not record the provider's pushback")
                    }
                }
            }
            // Read the row again at the next plan: the pause applies here too at once.
            *self.cached.lock().unwrap_or_else(PoisonError::into_inner) = None;
        }
    }
}
