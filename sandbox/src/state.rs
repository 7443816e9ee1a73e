//! Everything the sandbox knows, behind one lock, and the execute protocol.
//!
//! Why one lock: an execute request touches the store, the fault generator,
//! the effect ledger and the stats, and the guarantees tests rely on (a seed
//! and a request order fix the fault decisions; an effect is counted exactly
//! when a record is committed) hold only if each step sees all of them at
//! once. The lock is a plain `std::sync::Mutex` and is never held across an
//! `.await`.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::effects::{Effects, Ledger};
use crate::faults::{FaultConfigError, FaultMode, Faults};
use crate::injector::{Decision, Injector, TlsFault};
use crate::provider::Provider;
use crate::stats::Stats;
use crate::store::{Arrival, Completion, RecordView, SavedResponse, Store};

/// The first step's verdict on an execute request.
#[derive(Debug)]
pub(crate) enum Begin {
    /// 422 `idempotency_key_reused`.
    Conflict,
    /// 409 `request_in_progress`.
    InFlight,
    /// Replay this saved answer.
    Replay(SavedResponse),
    /// New key, now in flight: wait `delay`, then call [`State::finish`].
    Admitted(Ticket),
}

/// An admitted request, carried from [`State::begin`] to [`State::finish`].
#[derive(Debug)]
pub(crate) struct Ticket {
    pub provider: Provider,
    pub key: String,
    ordinal: u64,
    pub delay: Duration,
    mode: Option<FaultMode>,
    status: u16,
    pub hold: Duration,
}

/// How an admitted request must be answered.
#[derive(Debug, PartialEq)]
pub(crate) enum Finish {
    /// Send this response.
    Respond(SavedResponse),
    /// Committed; hold the request this long, then close without answering.
    Timeout(Duration),
    /// Committed; drop the connection abruptly without answering.
    Reset,
}

/// The answer to a lookup.
#[derive(Debug, PartialEq)]
pub(crate) enum Lookup {
    Disabled,
    NotFound,
    Found(RecordView),
}

/// What to look a record up by.
#[derive(Debug)]
pub(crate) enum LookupBy<'a> {
    Key(&'a str),
    Reference(&'a str),
}

#[derive(Debug)]
struct Inner {
    stores: [Store; 3],
    ledger: Ledger,
    stats: Stats,
    injector: Injector,
    /// Per provider, the rate limit's theoretical arrival time (GCRA).
    limited_until: [Option<Instant>; 3],
}

/// The sandbox's whole state.
#[derive(Debug)]
pub(crate) struct State {
    inner: Mutex<Inner>,
    /// A header every provider request must carry (name in lower case, value).
    required_header: Mutex<Option<(String, String)>>,
}

fn unavailable(status: u16) -> SavedResponse {
    SavedResponse {
        status,
        body: json!({"error": "unavailable"}),
    }
}

impl State {
    pub fn new() -> Self {
        State {
            inner: Mutex::new(Inner {
                stores: Provider::ALL.map(Store::new),
                ledger: Ledger::default(),
                stats: Stats::default(),
                injector: Injector::new(Faults::default()),
                limited_until: [None; 3],
            }),
            required_header: Mutex::new(None),
        }
    }

    /// From now on, provider requests without `name: value` are answered 401.
    pub fn require_header(&self, name: &str, value: &str) {
        let mut required = self
            .required_header
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *required = Some((name.to_ascii_lowercase(), value.to_owned()));
    }

    /// Whether a provider request's headers pass [`State::require_header`] (counted
    /// in the stats when they do not).
    pub fn authorized(&self, headers: &axum::http::HeaderMap) -> bool {
        let required = self
            .required_header
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some((name, value)) = required else {
            return true;
        };
        let ok = headers
            .get(&name)
            .is_some_and(|v| v.as_bytes() == value.as_bytes());
        if !ok {
            self.lock().stats.unauthorized_401 += 1;
        }
        ok
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the data half-written in
        // a way that matters to a test double; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A `rate_limits` fault: `Some(retry_after_secs)` when this request to `provider`
    /// is over the limit (answer 429, do nothing), counted; `None` when it may go on
    /// (and it has spent its place in the bucket).
    pub fn throttle(&self, provider: Provider) -> Option<u64> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let limit = inner
            .injector
            .faults()
            .rate_limits
            .iter()
            .find(|l| l.provider.is_none_or(|p| p == provider))
            .copied()?;
        let now = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / limit.per_second);
        let tolerance = interval * (limit.burst - 1);
        let tat = inner.limited_until[provider.index()].map_or(now, |t| t.max(now));
        if tat > now + tolerance {
            inner.stats.rate_limited_429 += 1;
            let free_in = (tat - tolerance).saturating_duration_since(now);
            let secs = limit
                .retry_after_s
                .unwrap_or_else(|| free_in.as_secs() + u64::from(free_in.subsec_nanos() > 0));
            return Some(secs.max(1));
        }
        inner.limited_until[provider.index()] = Some(tat + interval);
        None
    }

    /// Step one of an execute request: classify it; a new key is marked in
    /// flight and its fault is decided now, in arrival order.
    pub fn begin(&self, provider: Provider, key: &str, body: &Value, body_hash: &str) -> Begin {
        let reference = body.get("business_reference").and_then(Value::as_str);
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.stats.execute(provider);
        let forget = inner.injector.forget_after();
        let store = &mut inner.stores[provider.index()];
        match store.arrive(key, body_hash, reference, Instant::now(), forget) {
            Arrival::Conflict => {
                inner.stats.conflicts_422 += 1;
                Begin::Conflict
            }
            Arrival::InFlight => {
                inner.stats.in_flight_409 += 1;
                Begin::InFlight
            }
            Arrival::Replay(saved) => {
                inner.stats.replays += 1;
                Begin::Replay(saved)
            }
            Arrival::Admitted(ordinal) => {
                let Decision { delay, rule } = inner.injector.decide(provider, key);
                if let Some(rule) = &rule {
                    inner.stats.fault(rule.mode);
                }
                Begin::Admitted(Ticket {
                    provider,
                    key: key.to_owned(),
                    ordinal,
                    delay,
                    mode: rule.as_ref().map(|r| r.mode),
                    status: rule.as_ref().map_or(503, |r| r.status),
                    hold: Duration::from_millis(rule.as_ref().map_or(0, |r| r.hold_ms)),
                })
            }
        }
    }

    /// Step two, after the ticket's delay: apply the decided fault or commit.
    pub fn finish(&self, ticket: &Ticket) -> Finish {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let store = &mut inner.stores[ticket.provider.index()];
        let now = Instant::now();
        let completion = match ticket.mode {
            Some(FaultMode::ErrorBeforeCommit) => {
                store.release(&ticket.key, ticket.ordinal);
                return Finish::Respond(unavailable(ticket.status));
            }
            Some(FaultMode::Reject) => Completion::Rejected,
            _ => Completion::Succeeded,
        };
        let Some(saved) = store.complete(&ticket.key, ticket.ordinal, completion, now) else {
            // Wiped by /control/reset while in flight: leave no trace.
            return Finish::Respond(unavailable(503));
        };
        if completion == Completion::Succeeded {
            inner.ledger.record(ticket.provider, &ticket.key);
        }
        match ticket.mode {
            Some(FaultMode::AcceptThenTimeout) => Finish::Timeout(ticket.hold),
            Some(FaultMode::AcceptThenReset) => Finish::Reset,
            _ => Finish::Respond(saved),
        }
    }

    pub fn lookup(&self, provider: Provider, by: LookupBy<'_>) -> Lookup {
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.stats.lookups += 1;
        if inner.injector.lookup_disabled(provider) {
            inner.stats.faults.lookup_disabled += 1;
            return Lookup::Disabled;
        }
        let forget = inner.injector.forget_after();
        let store = &mut inner.stores[provider.index()];
        let now = Instant::now();
        let found = match by {
            LookupBy::Key(key) => store.by_key(key, now, forget),
            LookupBy::Reference(reference) => store.by_reference(reference, now, forget),
        };
        found.map_or(Lookup::NotFound, Lookup::Found)
    }

    /// The fault for one new connection on the TLS listener, counted.
    pub fn tls_fault(&self) -> Option<TlsFault> {
        let mut inner = self.lock();
        let fault = inner.injector.tls_fault();
        match fault {
            Some(TlsFault::Drop) => inner.stats.faults.tls_dropped += 1,
            Some(TlsFault::Stall) => inner.stats.faults.tls_stalled += 1,
            None => {}
        }
        fault
    }

    pub fn faults(&self) -> Faults {
        self.lock().injector.faults().clone()
    }

    /// Installs a config and re-seeds the generator (rule use counts restart).
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultConfigError> {
        faults.validate()?;
        let mut inner = self.lock();
        inner.injector = Injector::new(faults);
        inner.limited_until = [None; 3];
        Ok(())
    }

    pub fn effects(&self) -> Effects {
        self.lock().ledger.snapshot()
    }

    pub fn distinct_effect_keys(&self) -> usize {
        self.lock().ledger.distinct_keys()
    }

    pub fn effect_count(&self, key: &str) -> u64 {
        self.lock().ledger.count(key)
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats
    }

    /// Clears records, effects, stats and faults.
    pub fn reset(&self) {
        let mut inner = self.lock();
        for store in &mut inner.stores {
            store.clear();
        }
        inner.ledger = Ledger::default();
        inner.stats = Stats::default();
        inner.injector = Injector::new(Faults::default());
        inner.limited_until = [None; 3];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::FaultRule;
    use crate::store::body_hash;

    fn begin(s: &State, key: &str, body: &Value) -> Begin {
        s.begin(Provider::Bank, key, body, &body_hash(body))
    }

    #[test]
    fn a_rate_limit_lets_the_burst_through_then_answers_retry_after() {
        let s = State::new();
        s.set_faults(Faults {
            rate_limits: vec![crate::faults::RateLimitFault {
                provider: Some(Provider::Mail),
                per_second: 2.0,
                burst: 3,
                retry_after_s: None,
            }],
            ..Faults::default()
        })
        .unwrap();
        let answers: Vec<Option<u64>> = (0..5).map(|_| s.throttle(Provider::Mail)).collect();
        assert_eq!(answers, [None, None, None, Some(1), Some(1)]);
        assert_eq!(s.stats().rate_limited_429, 2);
        assert_eq!(s.throttle(Provider::Bank), None, "only the mail provider");
    }

    #[test]
    fn reject_is_stored_and_replayed_without_effect() {
        let s = State::new();
        s.set_faults(Faults {
            rules: vec![FaultRule::new(FaultMode::Reject).times(1)],
            ..Faults::default()
        })
        .unwrap();
        let body = json!({"amount": 1});
        let Begin::Admitted(t) = begin(&s, "k", &body) else {
            panic!()
        };
        let Finish::Respond(r) = s.finish(&t) else {
            panic!()
        };
        assert_eq!(r.status, 422);
        assert!(matches!(begin(&s, "k", &body), Begin::Replay(ref x) if *x == r));
        assert_eq!(s.effect_count("k"), 0);
        let Lookup::Found(v) = s.lookup(Provider::Bank, LookupBy::Key("k")) else {
            panic!()
        };
        assert_eq!(v.status, crate::store::RecordStatus::Rejected);
        assert_eq!(s.stats().faults.reject, 1);
    }

    #[test]
    fn reset_during_flight_leaves_no_trace() {
        let s = State::new();
        let body = json!({});
        let Begin::Admitted(t) = begin(&s, "k", &body) else {
            panic!()
        };
        s.reset();
        assert_eq!(s.finish(&t), Finish::Respond(unavailable(503)));
        assert_eq!(s.effects(), Effects::default());
        assert!(matches!(begin(&s, "k", &body), Begin::Admitted(_)));
    }
}
