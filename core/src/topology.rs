//! RabbitMQ topology: names, and their idempotent declaration by every process.
//!
//! - `<p>.actions` (direct): routing key = action type → quorum queue `<p>.action.<type>`
//!   with an explicit `x-delivery-limit` and at-least-once dead-lettering to `<p>.dlx`.
//! - `<p>.dlx` (fanout) → `<p>.dead`: poison and invalid messages, kept for a person.
//! - `<p>.reconcile-requests` (fanout) → `<p>.reconcile`: keys whose outcome is unknown,
//!   for the reconciler. Not through the default exchange: a user allowed to publish
//!   there reaches every queue of the vhost by name, which would make per-prefix
//!   RabbitMQ permissions meaningless; and not under the queue's own name, so a user can
//!   be allowed to bind from the exchange without being allowed to consume the queue
//!   ([`crate::roles::rabbitmq`]).
//! - `<p>.outcomes` (topic): `<action_type>.<status>` events for agents that listen.
//!
//! Every name carries the prefix so environments (and parallel tests) share a broker.
//! Declaring is idempotent; a declaration that differs from an existing queue's
//! arguments fails loudly (PRECONDITION_FAILED) rather than silently diverging.

use crate::amqp::{AmqpConnector, AmqpError};
use crate::config::BrokerConfig;
use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};

/// Header naming why a message was dead-lettered by a worker.
pub const REJECT_REASON_HEADER: &str = "x-oncely-reject-reason";
/// Header with a short human description of the problem (never the payload).
pub const REJECT_DETAIL_HEADER: &str = "x-oncely-reject-detail";

/// The names for one prefix.
#[derive(Debug, Clone)]
pub struct Topology {
    prefix: String,
    queue_type: String,
    delivery_limit: i64,
}

impl Topology {
    /// Names for a broker config.
    pub fn new(broker: &BrokerConfig) -> Self {
        Self {
            prefix: broker.prefix.clone(),
            queue_type: broker.queue_type.clone(),
            delivery_limit: broker.delivery_limit,
        }
    }

    /// The actions exchange.
    pub fn actions_exchange(&self) -> String {
        format!("{}.actions", self.prefix)
    }
    /// The queue of one action type.
    pub fn action_queue(&self, action_type: &str) -> String {
        format!("{}.action.{action_type}", self.prefix)
    }
    /// The dead-letter exchange.
    pub fn dead_exchange(&self) -> String {
        format!("{}.dlx", self.prefix)
    }
    /// The dead-letter queue.
    pub fn dead_queue(&self) -> String {
        format!("{}.dead", self.prefix)
    }
    /// The reconcile queue.
    pub fn reconcile_queue(&self) -> String {
        format!("{}.reconcile", self.prefix)
    }
    /// The exchange reconcile requests are published to (fanout, bound to the reconcile
    /// queue).
    pub fn reconcile_exchange(&self) -> String {
        format!("{}.reconcile-requests", self.prefix)
    }
    /// The outcomes exchange.
    pub fn outcomes_exchange(&self) -> String {
        format!("{}.outcomes", self.prefix)
    }

    fn queue_args(&self, dead_letter: bool) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(self.queue_type.as_str().into()),
        );
        if dead_letter {
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(self.dead_exchange().as_str().into()),
            );
            if self.queue_type == "quorum" {
                args.insert(
                    "x-delivery-limit".into(),
                    AMQPValue::LongLongInt(self.delivery_limit),
                );
                args.insert(
                    "x-dead-letter-strategy".into(),
                    AMQPValue::LongString("at-least-once".into()),
                );
                // at-least-once dead-lettering requires reject-publish overflow.
                args.insert(
                    "x-overflow".into(),
                    AMQPValue::LongString("reject-publish".into()),
                );
            }
        }
        args
    }

    /// Declare everything for these action types (idempotent).
    pub async fn declare(
        &self,
        channel: &Channel,
        action_types: &[&str],
    ) -> Result<(), lapin::Error> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let qdurable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                self.dead_exchange().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(self.dead_queue().into(), qdurable, self.queue_args(false))
            .await?;
        channel
            .queue_bind(
                self.dead_queue().into(),
                self.dead_exchange().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.actions_exchange().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .exchange_declare(
                self.outcomes_exchange().into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                self.reconcile_queue().into(),
                qdurable,
                self.queue_args(true),
            )
            .await?;
        channel
            .exchange_declare(
                self.reconcile_exchange().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                self.reconcile_queue().into(),
                self.reconcile_exchange().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        for t in action_types {
            let q = self.action_queue(t);
            channel
                .queue_declare(q.as_str().into(), qdurable, self.queue_args(true))
                .await?;
            channel
                .queue_bind(
                    q.into(),
                    self.actions_exchange().into(),
                    ShortString::from(*t),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// Delete everything for these action types (tests and `admin` teardown).
    pub async fn delete(
        &self,
        channel: &Channel,
        action_types: &[&str],
    ) -> Result<(), lapin::Error> {
        let mut queues: Vec<String> = action_types.iter().map(|t| self.action_queue(t)).collect();
        queues.extend([self.reconcile_queue(), self.dead_queue()]);
        for q in queues {
            channel
                .queue_delete(q.into(), QueueDeleteOptions::default())
                .await?;
        }
        for e in [
            self.actions_exchange(),
            self.outcomes_exchange(),
            self.reconcile_exchange(),
            self.dead_exchange(),
        ] {
            channel
                .exchange_delete(e.into(), ExchangeDeleteOptions::default())
                .await?;
        }
        Ok(())
    }
}

/// `user@host:port/vhost` of an AMQP URL, without the password, for messages.
pub fn describe_amqp(url: &str) -> String {
    match url.parse::<lapin::uri::AMQPUri>() {
        Ok(u) => format!(
            "{}@{}:{}/{}",
            u.authority.userinfo.username, u.authority.host, u.authority.port, u.vhost
        ),
        Err(_) => "(unparseable AMQP URL)".into(),
    }
}

/// Connect to the broker of `broker` (its URL and `[broker.tls]`), naming the
/// connection after this process. Reads the TLS files each time: a process that
/// reconnects often should keep an [`AmqpConnector`] instead.
pub async fn connect(broker: &BrokerConfig, name: &str) -> Result<lapin::Connection, AmqpError> {
    AmqpConnector::new(broker)?.connect(name).await
}
