//! The producer SDK: record, then publish with confirms (pipelined in bulk).

pub use oncely_core::approval::Asked;
use oncely_core::config::Config;
use oncely_core::intent::EnvelopeError;
use oncely_core::journal::{Journal, JournalError, Operation, Recorded};
use oncely_core::metrics as m;
use oncely_core::publish::{Message, Pending, PublishError, PublishOptions, Publisher};
use oncely_core::roles::Process;
use oncely_core::topology::{self, Topology};
use oncely_core::{DataKeys, Envelope, IdempotencyKey, Intent, KeyRing, Status};
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::time::Duration;

/// Most intents recorded per journal statement in bulk paths.
const RECORD_CHUNK: usize = 500;

/// What enqueueing one intent did.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Enqueued {
    /// Recorded (and published, when `planned`).
    Enqueued {
        /// The key.
        key: IdempotencyKey,
        /// `planned` (published), `awaiting_approval` (held by an approval rule: published
        /// once approved) or `deferred` (scheduled: published when due).
        status: Status,
    },
    /// The same intent was enqueued before; this is where it stands.
    Duplicate {
        /// The key.
        key: IdempotencyKey,
        /// Its status now.
        status: Status,
        /// The saved result, when it succeeded.
        result: Option<Value>,
        /// The provider's id, when it succeeded.
        provider_operation_id: Option<String>,
    },
    /// The key exists with another payload or action type: refused.
    Conflict {
        /// The key.
        key: IdempotencyKey,
        /// The payload hash the journal holds for it.
        existing_payload_hash: String,
    },
}

/// Why an intent could not be enqueued.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The intent is invalid (fix it; retrying will not help).
    #[error("invalid intent: {0}")]
    Invalid(#[from] EnvelopeError),
    /// The journal failed (see `is_retryable`).
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Recorded, but the publish failed: the sweeper will republish it; retrying the
    /// enqueue is also safe.
    #[error("recorded but not published ({0}); the sweeper republishes it")]
    Publish(#[from] PublishError),
    /// Could not connect.
    #[error("cannot connect: {0}")]
    Connect(String),
}

/// A connected producer (cheap to share behind an `Arc`).
#[derive(Debug)]
pub struct Producer {
    journal: Journal,
    publisher: Publisher,
    topology: Topology,
    secret: KeyRing,
    actor: String,
    approvals: oncely_core::approval::Approvals,
    config: Config,
    watcher: tokio::sync::OnceCell<crate::OutcomeWatcher>,
    conn: lapin::Connection,
}

impl Producer {
    /// Connect to Postgres (migrated by `oncely-worker migrate` to this version, with
    /// the producer's grants: both checked) and RabbitMQ, and declare the topology for the
    /// configured actions. Payloads are sealed with the data keys of
    /// `ONCELY_DATA_KEYS_FILE` when it is set (see [`Producer::connect_with_data_keys`]).
    pub async fn connect(config: &Config, secret: KeyRing) -> Result<Self, ProducerError> {
        Self::connect_as(config, secret, Process::Producer).await
    }

    /// [`Producer::connect`] for a process that needs more than the producer's grants
    /// (the gateway: [`Process::Gateway`]); the start-up check covers all of them.
    pub async fn connect_as(
        config: &Config,
        secret: KeyRing,
        process: Process,
    ) -> Result<Self, ProducerError> {
        let data_keys = DataKeys::from_env().map_err(|e| ProducerError::Connect(e.to_string()))?;
        Self::open(config, secret, process, data_keys).await
    }

    /// [`Producer::connect`] with the data keys given (`None`: payloads in plain text).
    pub async fn connect_with_data_keys(
        config: &Config,
        secret: KeyRing,
        data_keys: Option<DataKeys>,
    ) -> Result<Self, ProducerError> {
        Self::open(config, secret, Process::Producer, data_keys).await
    }

    async fn open(
        config: &Config,
        secret: KeyRing,
        process: Process,
        data_keys: Option<DataKeys>,
    ) -> Result<Self, ProducerError> {
        let pool = oncely_core::db::connect_checked_as(
            &config.database_url,
            &oncely_core::db::PoolSettings::for_config(config),
            process,
        )
        .await
        .map_err(|e| ProducerError::Connect(e.to_string()))?;
        // The error names the broker (never the password) and, for TLS, what is wrong.
        let conn = topology::connect(&config.broker, "oncely-producer")
            .await
            .map_err(|e| ProducerError::Connect(e.to_string()))?;
        let topology = Topology::new(&config.broker);
        let publisher = Publisher::open(&conn)
            .await
            .map_err(|e| ProducerError::Connect(e.to_string()))?;
        let actions: Vec<&str> = config.actions.keys().map(String::as_str).collect();
        topology
            .declare(publisher.channel(), &actions)
            .await
            .map_err(|e| {
                // With least-privilege broker users only the worker's may create the
                // queues (docs/security.md, "Least privilege"): say so rather than leave a bare 403.
                let hint = if e.to_string().contains("ACCESS_REFUSED") {
                    " (with per-process RabbitMQ users, a worker creates the queues: start one first)"
                } else {
                    ""
                };
                ProducerError::Connect(format!("declaring topology: {e}{hint}"))
            })?;
        let approvals = oncely_core::approval::Approvals::from_config(config)
            .map_err(ProducerError::Connect)?;
        Ok(Self {
            approvals,
            config: config.clone(),
            journal: Journal::on(pool).with_data_keys(data_keys),
            publisher,
            topology,
            secret,
            actor: format!("producer@{}", std::process::id()),
            watcher: tokio::sync::OnceCell::new(),
            conn,
        })
    }

    /// The journal this producer records into.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Key and hash an intent without recording it.
    pub fn seal(&self, intent: Intent) -> Result<Envelope, ProducerError> {
        Ok(intent.seal(&self.secret)?)
    }

    /// Enqueue one intent.
    pub async fn enqueue(&self, intent: Intent) -> Result<Enqueued, ProducerError> {
        self.enqueue_many(vec![intent])
            .await?
            .pop()
            .unwrap_or_else(|| Err(ProducerError::Connect("empty batch".into())))
    }

    /// Enqueue many: record in batches, publish them all, then await the confirms
    /// together. One result per intent, in order; a failure of the whole batch (journal
    /// down) is the outer error.
    pub async fn enqueue_many(
        &self,
        intents: Vec<Intent>,
    ) -> Result<Vec<Result<Enqueued, ProducerError>>, ProducerError> {
        self.enqueue_many_asked(intents, &[]).await
    }

    /// [`Producer::enqueue_many`] with what each intent asks beyond itself (`asked[i]`
    /// for `intents[i]`; missing: nothing): `not_before` (recorded now, published when
    /// due), `expires_at`, and the caller the approval rules see as `token` (the
    /// gateway's token id; default: this producer's actor). An intent an approval rule
    /// holds is recorded `awaiting_approval` and published once approved
    /// (docs/approvals.md).
    pub async fn enqueue_many_asked(
        &self,
        intents: Vec<Intent>,
        asked: &[Asked],
    ) -> Result<Vec<Result<Enqueued, ProducerError>>, ProducerError> {
        let (mut results, sealed) = self.seal_all(intents);
        let mut pending: Vec<(usize, IdempotencyKey, Pending)> = Vec::new();
        for chunk in sealed.chunks(RECORD_CHUNK) {
            self.record_and_publish(chunk, asked, &mut results, &mut pending)
                .await?;
        }
        await_confirms(pending, &mut results).await;
        Ok(results.into_iter().map(counted).collect())
    }

    /// Seal every intent; a slot per intent, already filled for those that failed.
    fn seal_all(&self, intents: Vec<Intent>) -> (Vec<Slot>, Vec<(usize, Envelope)>) {
        let mut results: Vec<Slot> = Vec::with_capacity(intents.len());
        let mut sealed: Vec<(usize, Envelope)> = Vec::with_capacity(intents.len());
        let limit = self.config.worker.max_message_bytes;
        for (i, intent) in intents.into_iter().enumerate() {
            match intent.seal(&self.secret).and_then(|e| fits(e, limit)) {
                Ok(e) => {
                    sealed.push((i, e));
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e.into()))),
            }
        }
        (results, sealed)
    }

    /// Record one chunk in one statement and publish what needs publishing (new, or a
    /// duplicate still `planned`: an earlier publish may have been lost and another copy
    /// is harmless); the confirms are awaited later, together.
    async fn record_and_publish(
        &self,
        chunk: &[(usize, Envelope)],
        asked: &[Asked],
        results: &mut [Slot],
        pending: &mut Vec<(usize, IdempotencyKey, Pending)>,
    ) -> Result<(), ProducerError> {
        let envelopes: Vec<Envelope> = chunk.iter().map(|(_, e)| e.clone()).collect();
        metrics::histogram!(m::RECORD_BATCH_SIZE).record(chunk.len() as f64);
        let recorded = if self.approvals.is_empty() && asked.is_empty() {
            timed("record", self.journal.record_many(&envelopes, &self.actor)).await?
        } else {
            let none = Asked::default();
            let chunk_asked: Vec<Asked> = chunk
                .iter()
                .map(|(i, _)| asked.get(*i).unwrap_or(&none).clone())
                .collect();
            let refs: Vec<&Envelope> = envelopes.iter().collect();
            let controls = self
                .approvals
                .controls(&self.journal, &refs, &chunk_asked, &self.actor)
                .await?;
            for c in &controls {
                if let Some(h) = &c.hold {
                    tracing::info!(rule = %h.rule, approvals_needed = h.approvals_needed, "held for approval");
                }
            }
            timed(
                "record",
                self.journal
                    .record_controlled(&envelopes, &controls, &self.actor),
            )
            .await?
        };
        // Borrowed from the chunk unless the row's key replaces the envelope's.
        let mut to_publish: Vec<(usize, Cow<'_, Envelope>)> = Vec::new();
        for ((i, env), rec) in chunk.iter().zip(recorded) {
            let publish = match &rec {
                Recorded::New => true,
                Recorded::Duplicate(op) => op.status == Status::Planned,
                Recorded::Waiting(_) | Recorded::Conflict(_) => false,
            };
            let answer = match rec {
                Recorded::New => Enqueued::Enqueued {
                    key: env.key.clone(),
                    status: Status::Planned,
                },
                Recorded::Waiting(status) => Enqueued::Enqueued {
                    key: env.key.clone(),
                    status,
                },
                Recorded::Duplicate(op) => duplicate(&op),
                Recorded::Conflict(op) => Enqueued::Conflict {
                    key: env.key.clone(),
                    existing_payload_hash: op.payload_hash.clone(),
                },
            };
            if publish {
                // A duplicate is published under its row's key (it differs from the
                // envelope's when the intent was recorded under another secret of the ring).
                let env = match &answer {
                    Enqueued::Duplicate { key, .. } if key != &env.key => Cow::Owned(Envelope {
                        key: key.clone(),
                        ..env.clone()
                    }),
                    _ => Cow::Borrowed(env),
                };
                to_publish.push((*i, env));
            }
            results[*i] = Some(Ok(answer));
        }
        // All of the chunk's publishes at once: their frames leave in a few writes.
        let bodies: Vec<Vec<u8>> = to_publish.iter().map(|(_, e)| e.to_bytes()).collect();
        let exchange = self.topology.actions_exchange();
        let published = self
            .publisher
            .publish_all(
                to_publish
                    .iter()
                    .zip(&bodies)
                    .map(|((_, env), body)| intent_message(&exchange, env, body)),
            )
            .await;
        for ((i, env), p) in to_publish.into_iter().zip(published) {
            match p {
                Ok(p) => pending.push((i, env.key.clone(), p)),
                Err(e) => results[i] = Some(Err(e.into())),
            }
        }
        Ok(())
    }

    /// Publish an already-recorded envelope (mandatory, persistent); await `confirmed()`.
    pub async fn publish_envelope(&self, env: &Envelope) -> Result<Pending, ProducerError> {
        let exchange = self.topology.actions_exchange();
        let body = env.to_bytes();
        let m = intent_message(&exchange, env, &body);
        Ok(self
            .publisher
            .publish(m.exchange, m.routing_key, m.body, m.options)
            .await?)
    }

    /// Tell the agents an operation was decided outside a worker (cancelled, approved,
    /// rejected): its outcome event, as the journal holds it now. A notification: a
    /// failure is logged and counted, never an error (waiters also read the journal).
    pub async fn notify_decided(&self, op: &Operation) {
        let ev = oncely_core::outcome::OutcomeEvent::decided(op);
        oncely_core::outcome::publish_one(&self.publisher, &self.config, &self.topology, &ev).await;
    }

    /// Cancel the operation `key` if nothing runs or was sent (docs/approvals.md, "Cancel"):
    /// [`Cancelled::Cancelled`](oncely_core::journal::Cancelled) — it will never be sent;
    /// `TooLate` — a worker took it first, or it ended (the row says how far it got).
    /// Atomic against a worker's claim; the agents hear of it on the outcomes exchange.
    pub async fn cancel(
        &self,
        key: &IdempotencyKey,
    ) -> Result<oncely_core::journal::Cancelled, ProducerError> {
        let answer = self.journal.cancel(key, None, &self.actor).await?;
        if let oncely_core::journal::Cancelled::Cancelled(op) = &answer {
            metrics::counter!(m::CONTROL_DECISIONS, "action_type" => op.action_type.clone(), "decision" => "cancelled").increment(1);
            self.notify_decided(op).await;
        }
        Ok(answer)
    }

    /// The operation for a key, if any (without its payload: see
    /// [`Journal::get_without_payload`]).
    pub async fn status(&self, key: &IdempotencyKey) -> Result<Option<Operation>, ProducerError> {
        Ok(self.journal.get_without_payload(key).await?)
    }

    /// The outcome watcher of this producer's connection (started on first use).
    pub async fn watcher(&self) -> Result<&crate::OutcomeWatcher, ProducerError> {
        self.watcher
            .get_or_try_init(|| crate::OutcomeWatcher::start(&self.conn, &self.topology))
            .await
            .map_err(|e| ProducerError::Connect(format!("watching outcomes: {e}")))
    }

    /// Whether the RabbitMQ connection is up.
    pub fn broker_connected(&self) -> bool {
        self.conn.status().connected()
    }

    /// Wait until the operation is terminal; `None` when `timeout` passes first (or there
    /// is no such operation). Woken by the outcomes exchange ([`crate::watch`]), not by
    /// polling the journal.
    pub async fn wait(
        &self,
        key: &IdempotencyKey,
        timeout: Duration,
    ) -> Result<Option<Operation>, ProducerError> {
        let op = self
            .watcher()
            .await?
            .wait(&self.journal, key, timeout)
            .await?;
        Ok(op.filter(|o| o.status.is_terminal()))
    }
}

/// An intent's message: to the actions exchange under its action type, mandatory,
/// persistent, the key as message id.
fn intent_message<'a>(exchange: &'a str, env: &'a Envelope, body: &'a [u8]) -> Message<'a> {
    Message {
        exchange,
        routing_key: env.intent.identity.action_type.as_str(),
        body,
        options: PublishOptions::mandatory().with_message_id(env.key.as_str()),
    }
}

/// One intent's answer, `None` until known.
type Slot = Option<Result<Enqueued, ProducerError>>;

/// Await the publisher confirms of a batch together; an unconfirmed publish is that
/// intent's error (its row exists: the sweeper republishes it).
async fn await_confirms(pending: Vec<(usize, IdempotencyKey, Pending)>, results: &mut [Slot]) {
    for (i, key, p) in pending {
        if let Err(e) = p.confirmed().await {
            tracing::warn!(%key, error = %e, "publish not confirmed; the sweeper will republish");
            metrics::counter!(m::PUBLISHES, "kind" => "intent", "result" => "failed").increment(1);
            results[i] = Some(Err(e.into()));
        } else {
            metrics::counter!(m::PUBLISHES, "kind" => "intent", "result" => "confirmed")
                .increment(1);
        }
    }
}

/// Count an intent's answer in the enqueue metric and hand it on.
fn counted(slot: Slot) -> Result<Enqueued, ProducerError> {
    let r = slot.unwrap_or_else(|| Err(ProducerError::Connect("internal: no result".into())));
    let label = match &r {
        Ok(Enqueued::Enqueued { .. }) => "enqueued",
        Ok(Enqueued::Duplicate { .. }) => "duplicate",
        Ok(Enqueued::Conflict { .. }) => "conflict",
        Err(_) => "failed",
    };
    metrics::counter!(m::INTENTS_ENQUEUED, "result" => label).increment(1);
    r
}

fn duplicate(op: &Operation) -> Enqueued {
    Enqueued::Duplicate {
        key: op.key.clone(),
        status: op.status,
        result: op.result_json.clone(),
        provider_operation_id: op.provider_operation_id.clone(),
    }
}

async fn timed<T>(statement: &'static str, f: impl std::future::Future<Output = T>) -> T {
    let start = std::time::Instant::now();
    let out = f.await;
    metrics::histogram!(m::JOURNAL_STATEMENT_SECONDS, "statement" => statement)
        .record(start.elapsed().as_secs_f64());
    out
}

/// `e` when its message fits the workers' limit (`worker.max_message_bytes`). Measured
/// on the envelope as published, not on the caller's body: re-serialising can grow a
/// payload (`9e15` is written back as `9000000000000000.0`), and a message over the limit
/// would be dead-lettered by every worker while its `planned` row was republished by the
/// sweeper forever. Refused before anything is recorded.
fn fits(e: Envelope, limit: usize) -> Result<Envelope, EnvelopeError> {
    let size = e.to_bytes().len();
    if size > limit {
        return Err(EnvelopeError::TooLarge { size, limit });
    }
    Ok(e)
}
