//! Publishing with confirms, where "confirmed" means routed and stored.
//!
//! RabbitMQ answers a `mandatory` message that no queue would take with a
//! `basic.return` *and then an ack*: a failure here ([`PublishError::Unroutable`]), not a
//! success — for the message the return names, which lapin alone does not track (see
//! [`Publisher`]). Bulk callers publish many messages first and
//! then await their confirms together (a window), never one publish-then-wait each:
//! on this machine that is the difference between ~650 and ~8,600 messages/s. And they
//! publish with [`Publisher::publish_all`], not one awaited publish after another: each
//! of those waits until its frames are written on lapin's I/O thread.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};

use futures_util::FutureExt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lapin::message::BasicReturnMessage;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use lapin::{Confirmation, PublisherConfirm};
use tokio::sync::{mpsc, oneshot};

/// Why a publish did not become a stored message.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The broker could not be reached or the channel closed: retry (after reconnecting).
    #[error("broker unavailable: {0}")]
    Broker(#[from] lapin::Error),
    /// No queue is bound for the routing key (e.g. an action type nobody declared).
    #[error(
        "unroutable: no queue is bound to exchange {exchange:?} for routing key {routing_key:?}"
    )]
    Unroutable {
        /// The exchange.
        exchange: String,
        /// The routing key.
        routing_key: String,
    },
    /// This publisher's task ended (its runtime is shutting down): nothing was published,
    /// or its confirm can no longer be answered.
    #[error("the publisher is closed")]
    Closed,
    /// The broker refused to store it (queue full with reject-publish, or internal error).
    #[error("the broker refused the message (nack) for {routing_key:?}")]
    Nacked {
        /// The routing key.
        routing_key: String,
    },
}

/// Whether the broker must route the message to a queue (`mandatory`): then an
/// unroutable message is a [`PublishError::Unroutable`], not a silent drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mandatory {
    /// Commands and hand-offs: a message nobody can take is a failure.
    Yes,
    /// Notifications (outcome events): nobody may be listening, and that is fine.
    No,
}

/// How to publish one message, beyond its exchange, routing key and body.
#[derive(Debug, Clone)]
pub struct PublishOptions<'a> {
    /// Must it be routed?
    pub mandatory: Mandatory,
    /// AMQP headers (e.g. a dead-letter reason).
    pub headers: Option<FieldTable>,
    /// AMQP `message-id` (the idempotency key, for tracing a message through the broker).
    pub message_id: Option<&'a str>,
}

impl<'a> PublishOptions<'a> {
    /// A message that must be routed, with no headers and no message id.
    pub fn mandatory() -> Self {
        Self {
            mandatory: Mandatory::Yes,
            headers: None,
            message_id: None,
        }
    }

    /// A notification nobody may be listening to: not mandatory.
    pub fn notification() -> Self {
        Self {
            mandatory: Mandatory::No,
            ..Self::mandatory()
        }
    }

    /// With these headers.
    pub fn with_headers(self, headers: FieldTable) -> Self {
        Self {
            headers: Some(headers),
            ..self
        }
    }

    /// With this message id.
    pub fn with_message_id(self, id: &'a str) -> Self {
        Self {
            message_id: Some(id),
            ..self
        }
    }
}

/// One message for [`Publisher::publish_all`].
#[derive(Debug, Clone)]
pub struct Message<'a> {
    /// The exchange.
    pub exchange: &'a str,
    /// The routing key.
    pub routing_key: &'a str,
    /// The body (JSON).
    pub body: &'a [u8],
    /// Mandatory, headers, message id.
    pub options: PublishOptions<'a>,
}

/// A confirm-mode channel.
///
/// Every publish on it goes through one task (the *driver*, spawned by
/// [`Publisher::open`]), which also owns every confirm. Why: AMQP's `basic.return` does
/// not say which publish it returns, and lapin hands each return to whichever confirm it
/// resolves next — with a multiple-ack that is any message of the run (lapin keeps its
/// pending confirms in a hash map), so a routed neighbour was refused and the returned
/// message confirmed (CI saw message 247 refused for 250). RabbitMQ sends a message's
/// return before its ack on the same channel, so when a run of confirms resolves, the
/// returns of its messages have all arrived and each sits on one confirm of that run or
/// of an earlier one. The driver therefore collects the returns of everything resolved
/// at once, gives each to the publish it names — same exchange, routing key and body,
/// the earliest of them still waiting — and only then answers the run. It can do that
/// because no confirm exists that it does not hold: it publishes, and registers what it
/// published, before it looks at confirms again.
#[derive(Debug, Clone)]
pub struct Publisher {
    channel: Channel,
    requests: mpsc::UnboundedSender<Request>,
}

/// A publish whose confirm has not been awaited yet.
#[derive(Debug)]
pub struct Pending {
    verdict: oneshot::Receiver<Verdict>,
    exchange: String,
    routing_key: String,
}

/// What the broker did with one message.
#[derive(Debug)]
enum Verdict {
    Stored,
    Returned,
    Nacked,
    Failed(lapin::Error),
}

/// One message, owned, on its way to the driver.
struct Outgoing {
    exchange: String,
    routing_key: String,
    body: Vec<u8>,
    mandatory: bool,
    properties: BasicProperties,
}

/// Messages to publish together, and where their pending confirms go.
struct Request {
    messages: Vec<Outgoing>,
    reply: oneshot::Sender<Vec<Result<Pending, PublishError>>>,
}

impl Publisher {
    /// Open a channel in confirm mode on `conn` (and start its driver).
    pub async fn open(conn: &Connection) -> Result<Self, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let (requests, rx) = mpsc::unbounded_channel();
        tokio::spawn(Driver::new(channel.clone()).run(rx));
        Ok(Self { channel, requests })
    }

    /// The underlying channel (for declarations; publish through [`Publisher`] only).
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publish a persistent JSON message; await the result with [`Pending::confirmed`].
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        options: PublishOptions<'_>,
    ) -> Result<Pending, PublishError> {
        let one = Message {
            exchange,
            routing_key,
            body,
            options,
        };
        self.publish_all([one])
            .await
            .pop()
            .unwrap_or(Err(PublishError::Closed))
    }

    /// Publish several messages together; await each result's confirm with
    /// [`Pending::confirmed`]. Results in the order given.
    ///
    /// Why not one [`Publisher::publish`] after another: each of those waits until its
    /// own frames are written, and lapin writes on its own I/O thread — one socket write
    /// and two thread wake-ups per message. Here every message's frames are handed to
    /// the connection before any write is awaited, so they leave in a few writes (and
    /// in the order given). Concurrent callers' messages are published together too.
    pub async fn publish_all<'m>(
        &self,
        messages: impl IntoIterator<Item = Message<'m>>,
    ) -> Vec<Result<Pending, PublishError>> {
        let messages: Vec<Outgoing> = messages.into_iter().map(Outgoing::from).collect();
        let n = messages.len();
        let (reply, answer) = oneshot::channel();
        if n == 0 || self.requests.send(Request { messages, reply }).is_err() {
            return (0..n).map(|_| Err(PublishError::Closed)).collect();
        }
        match answer.await {
            Ok(pending) => pending,
            Err(_) => (0..n).map(|_| Err(PublishError::Closed)).collect(),
        }
    }

    /// Publish and wait for its confirm.
    pub async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        options: PublishOptions<'_>,
    ) -> Result<(), PublishError> {
        self.publish(exchange, routing_key, body, options)
            .await?
            .confirmed()
            .await
    }
}

impl From<Message<'_>> for Outgoing {
    fn from(m: Message<'_>) -> Self {
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        if let Some(h) = m.options.headers {
            properties = properties.with_headers(h);
        }
        if let Some(id) = m.options.message_id {
            properties = properties.with_message_id(id.into());
        }
        Self {
            exchange: m.exchange.to_owned(),
            routing_key: m.routing_key.to_owned(),
            body: m.body.to_vec(),
            mandatory: m.options.mandatory == Mandatory::Yes,
            properties,
        }
    }
}

/// Which message a return names: its exchange, routing key and body.
fn identity(exchange: &str, routing_key: &str, body: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    (exchange, routing_key, body).hash(&mut h);
    h.finish()
}

/// A published message awaiting its confirm.
struct Waiting {
    /// Mandatory messages only: the identity a return would carry.
    identity: Option<u64>,
    returned: bool,
    verdict: oneshot::Sender<Verdict>,
}

/// The task that publishes on the channel and answers every confirm (see [`Publisher`]).
struct Driver {
    channel: Channel,
    next: u64,
    waiting: HashMap<u64, Waiting>,
    /// Mandatory messages not yet answered nor returned, by identity, oldest first.
    by_identity: HashMap<u64, VecDeque<u64>>,
}

type Resolved = (u64, Result<Confirmation, lapin::Error>);

impl Driver {
    fn new(channel: Channel) -> Self {
        Self {
            channel,
            next: 0,
            waiting: HashMap::new(),
            by_identity: HashMap::new(),
        }
    }

    async fn run(mut self, mut requests: mpsc::UnboundedReceiver<Request>) {
        let mut confirms = FuturesUnordered::new();
        let mut open = true;
        while open || !confirms.is_empty() {
            tokio::select! {
                request = requests.recv(), if open => match request {
                    Some(first) => {
                        let mut batch = vec![first];
                        while let Ok(more) = requests.try_recv() {
                            batch.push(more);
                        }
                        for (seq, confirm) in self.publish(batch).await {
                            confirms.push(async move { (seq, confirm.await) });
                        }
                    }
                    None => open = false,
                },
                Some(first) = confirms.next(), if !confirms.is_empty() => {
                    // Everything resolved by the frames read so far: one run.
                    let mut run = vec![first];
                    while let Some(Some(more)) = confirms.next().now_or_never() {
                        run.push(more);
                    }
                    self.answer(run);
                }
            }
        }
    }

    /// Publish every request's messages together; register each confirm before
    /// returning, and hand each caller its pending confirms.
    async fn publish(&mut self, mut batch: Vec<Request>) -> Vec<(u64, PublisherConfirm)> {
        let channel = &self.channel;
        let sent = futures_util::future::join_all(
            batch
                .iter_mut()
                .flat_map(|r| r.messages.iter_mut())
                .map(|m| {
                    channel.basic_publish(
                        m.exchange.as_str().into(),
                        m.routing_key.as_str().into(),
                        BasicPublishOptions {
                            mandatory: m.mandatory,
                            immediate: false,
                        },
                        &m.body,
                        std::mem::take(&mut m.properties),
                    )
                }),
        )
        .await;
        let mut sent = sent.into_iter();
        let mut confirms = Vec::new();
        for request in batch {
            let mut pending = Vec::with_capacity(request.messages.len());
            for (m, result) in request.messages.into_iter().zip(&mut sent) {
                pending.push(match result {
                    Ok(confirm) => {
                        let seq = self.next;
                        self.next += 1;
                        let identity = m
                            .mandatory
                            .then(|| identity(&m.exchange, &m.routing_key, &m.body));
                        if let Some(id) = identity {
                            self.by_identity.entry(id).or_default().push_back(seq);
                        }
                        let (verdict, rx) = oneshot::channel();
                        self.waiting.insert(
                            seq,
                            Waiting {
                                identity,
                                returned: false,
                                verdict,
                            },
                        );
                        confirms.push((seq, confirm));
                        Ok(Pending {
                            verdict: rx,
                            exchange: m.exchange,
                            routing_key: m.routing_key,
                        })
                    }
                    Err(e) => Err(PublishError::Broker(e)),
                });
            }
            // A caller that went away still has its messages' confirms answered here.
            let _ = request.reply.send(pending);
        }
        confirms
    }

    /// Give every return of the run to the message it names, then answer the run.
    fn answer(&mut self, run: Vec<Resolved>) {
        let mut outcomes = Vec::with_capacity(run.len());
        for (seq, result) in run {
            let outcome = match result {
                Ok(Confirmation::Ack(returned)) => {
                    if let Some(r) = returned {
                        self.returned(&r);
                    }
                    Verdict::Stored
                }
                Ok(Confirmation::Nack(returned)) => {
                    if let Some(r) = returned {
                        self.returned(&r);
                    }
                    Verdict::Nacked
                }
                Ok(Confirmation::NotRequested) => Verdict::Stored,
                Err(e) => Verdict::Failed(e),
            };
            outcomes.push((seq, outcome));
        }
        for (seq, outcome) in outcomes {
            let Some(w) = self.waiting.remove(&seq) else {
                continue;
            };
            if let Some(id) = w.identity {
                self.forget(id, seq);
            }
            let verdict = match outcome {
                Verdict::Stored if w.returned => Verdict::Returned,
                other => other,
            };
            let _ = w.verdict.send(verdict);
        }
    }

    /// A return: mark the oldest waiting message with its identity.
    fn returned(&mut self, r: &BasicReturnMessage) {
        let d = &r.delivery;
        let id = identity(d.exchange.as_str(), d.routing_key.as_str(), &d.data);
        let seq = self.by_identity.get_mut(&id).and_then(VecDeque::pop_front);
        if self.by_identity.get(&id).is_some_and(VecDeque::is_empty) {
            self.by_identity.remove(&id);
        }
        match seq.and_then(|s| self.waiting.get_mut(&s)) {
            Some(w) => w.returned = true,
            None => tracing::error!(
                exchange = d.exchange.as_str(),
                routing_key = d.routing_key.as_str(),
                "the broker returned a message that no publish awaiting its confirm matches"
            ),
        }
    }

    fn forget(&mut self, id: u64, seq: u64) {
        if let Some(q) = self.by_identity.get_mut(&id) {
            q.retain(|&s| s != seq);
            if q.is_empty() {
                self.by_identity.remove(&id);
            }
        }
    }
}

impl Pending {
    /// Wait for the broker's verdict: `Ok` only when routed and stored.
    pub async fn confirmed(self) -> Result<(), PublishError> {
        match self.verdict.await {
            Ok(Verdict::Stored) => Ok(()),
            Ok(Verdict::Returned) => Err(PublishError::Unroutable {
                exchange: self.exchange,
                routing_key: self.routing_key,
            }),
            Ok(Verdict::Nacked) => Err(PublishError::Nacked {
                routing_key: self.routing_key,
            }),
            Ok(Verdict::Failed(e)) => Err(PublishError::Broker(e)),
            Err(_) => Err(PublishError::Closed),
        }
    }
}

/// A header table from string pairs.
pub fn headers(pairs: &[(&str, &str)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), AMQPValue::LongString((*v).into()));
    }
    t
}
