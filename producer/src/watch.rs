//! Waiting for an operation to finish, driven by the outcomes exchange.
//!
//! One exclusive, auto-deleted queue per process is bound to `<prefix>.outcomes` with `#`;
//! every event wakes whoever waits on its key, and the waiter then reads the journal (the
//! truth — events are notifications). A waiter subscribes *before* its first read, so an
//! event between the read and the wait is not missed. Events are published without
//! `mandatory` and some settlements publish none (a statement import), so a waiter also
//! reads the journal again every [`FALLBACK_READ`] — a safety net, not the driver: the
//! common case returns on the event within milliseconds.

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use oncely_core::IdempotencyKey;
use oncely_core::journal::{Journal, JournalError, Operation};
use oncely_core::topology::Topology;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How often a waiter reads the journal even without an event.
pub const FALLBACK_READ: Duration = Duration::from_secs(5);
/// … and how often while the outcomes consumer is down.
const FALLBACK_READ_DEGRADED: Duration = Duration::from_millis(500);

/// Wakes waiters when an outcome event names their key (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct OutcomeWatcher {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    waiters: Mutex<HashMap<String, watch::Sender<u64>>>,
    live: AtomicBool,
}

/// A subscription to one key's events; unsubscribes when dropped.
#[derive(Debug)]
pub struct Subscription {
    key: String,
    rx: watch::Receiver<u64>,
    inner: Arc<Inner>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut map = self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(&self.key)
            && tx.receiver_count() <= 1
        {
            map.remove(&self.key);
        }
    }
}

impl OutcomeWatcher {
    /// Start consuming outcome events on a channel of `conn`.
    pub async fn start(
        conn: &lapin::Connection,
        topology: &Topology,
    ) -> Result<Self, lapin::Error> {
        let channel = conn.create_channel().await?;
        let queue = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                queue.name().as_str().into(),
                topology.outcomes_exchange().as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        // Notifications on a private queue that dies with the process: acknowledging on
        // delivery loses nothing (the journal is the truth).
        let mut consumer = channel
            .basic_consume(
                queue.name().as_str().into(),
                "oncely-outcome-watcher".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    exclusive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let watcher = Self::default();
        watcher.inner.live.store(true, Ordering::Relaxed);
        let inner = watcher.inner.clone();
        tokio::spawn(async move {
            let _channel = channel;
            while let Some(Ok(delivery)) = consumer.next().await {
                if let Some(key) = event_key(&delivery.data) {
                    inner.wake(&key);
                }
            }
            inner.live.store(false, Ordering::Relaxed);
            tracing::warn!("the outcomes consumer stopped; waits fall back to reading the journal");
        });
        Ok(watcher)
    }

    /// Whether the outcomes consumer is running.
    pub fn is_live(&self) -> bool {
        self.inner.live.load(Ordering::Relaxed)
    }

    /// Subscribe to a key's events (before reading the journal).
    pub fn subscribe(&self, key: &str) -> Subscription {
        let mut map = self.inner.waiters.lock().unwrap_or_else(|p| p.into_inner());
        let rx = map
            .entry(key.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Subscription {
            key: key.to_owned(),
            rx,
            inner: self.inner.clone(),
        }
    }

    /// Wait until the operation for `key` is terminal, or `timeout` passes; returns the
    /// row as last read (`None` if there is no such operation).
    pub async fn wait(
        &self,
        journal: &Journal,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>, JournalError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut sub = self.subscribe(key.as_str());
        loop {
            let op = journal.get_without_payload(key).await?;
            match &op {
                Some(o) if !o.status.is_terminal() => {}
                _ => return Ok(op),
            }
            let read_again = if self.is_live() {
                FALLBACK_READ
            } else {
                FALLBACK_READ_DEGRADED
            };
            let next = (tokio::time::Instant::now() + read_again).min(deadline);
            tokio::select! {
                changed = sub.rx.changed() => {
                    if changed.is_err() {
                        // Cannot happen while we hold the subscription; read again anyway.
                        tokio::time::sleep_until(next).await;
                    }
                }
                _ = tokio::time::sleep_until(next) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return journal.get_without_payload(key).await;
            }
        }
    }
}

impl Inner {
    fn wake(&self, key: &str) {
        let map = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// The key an outcome event names.
fn event_key(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Event {
        idempotency_key: String,
    }
    serde_json::from_slice::<Event>(body)
        .ok()
        .map(|e| e.idempotency_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_key() {
        let body =
            br#"{"schema":"oncely.outcome.v1","idempotency_key":"v1:abc","status":"succeeded"}"#;
        assert_eq!(event_key(body).as_deref(), Some("v1:abc"));
        assert_eq!(event_key(b"not json"), None);
    }

    #[tokio::test]
    async fn a_wake_reaches_every_subscriber_of_the_key_and_only_them() {
        let w = OutcomeWatcher::default();
        let mut a = w.subscribe("k1");
        let mut b = w.subscribe("k1");
        let c = w.subscribe("k2");
        w.inner.wake("k1");
        assert!(a.rx.has_changed().expect("open"));
        assert!(b.rx.has_changed().expect("open"));
        assert!(!c.rx.has_changed().expect("open"));
        a.rx.mark_unchanged();
        b.rx.mark_unchanged();
        drop(a);
        assert!(w.inner.waiters.lock().expect("lock").contains_key("k1"));
        drop(b);
        drop(c);
        assert!(w.inner.waiters.lock().expect("lock").is_empty());
    }
}
