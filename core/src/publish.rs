//! Publishing with confirms, where "confirmed" means routed and stored.
//!
//! RabbitMQ answers a `mandatory` message that no queue would take with a
//! `basic.return` *and then an ack*: lapin surfaces that as `Confirmation::Ack(Some(_))`,
//! which is a failure here, not a success. Bulk callers publish many messages first and
//! then await their confirms together (a window), never one publish-then-wait each:
//! on this machine that is the difference between ~650 and ~8,600 messages/s.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use lapin::{Confirmation, PublisherConfirm};

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
    /// The broker refused to store it (queue full with reject-publish, or internal error).
    #[error("the broker refused the message (nack) for {routing_key:?}")]
    Nacked {
        /// The routing key.
        routing_key: String,
    },
}

/// A confirm-mode channel.
#[derive(Debug, Clone)]
pub struct Publisher {
    channel: Channel,
}

/// A publish whose confirm has not been awaited yet.
#[derive(Debug)]
pub struct Pending {
    confirm: PublisherConfirm,
    exchange: String,
    routing_key: String,
}

impl Publisher {
    /// Open a channel in confirm mode on `conn`.
    pub async fn open(conn: &Connection) -> Result<Self, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self { channel })
    }

    /// The underlying channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publish a persistent JSON message; await the result with [`Pending::confirmed`].
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        mandatory: bool,
        headers: Option<FieldTable>,
        message_id: Option<&str>,
    ) -> Result<Pending, PublishError> {
        let mut props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into());
        if let Some(h) = headers {
            props = props.with_headers(h);
        }
        if let Some(id) = message_id {
            props = props.with_message_id(id.into());
        }
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory,
                    immediate: false,
                },
                body,
                props,
            )
            .await?;
        Ok(Pending {
            confirm,
            exchange: exchange.to_owned(),
            routing_key: routing_key.to_owned(),
        })
    }

    /// Publish and wait for its confirm.
    pub async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        mandatory: bool,
        headers: Option<FieldTable>,
    ) -> Result<(), PublishError> {
        self.publish(exchange, routing_key, body, mandatory, headers, None)
            .await?
            .confirmed()
            .await
    }
}

impl Pending {
    /// Wait for the broker's verdict: `Ok` only when routed and stored.
    pub async fn confirmed(self) -> Result<(), PublishError> {
        match self.confirm.await? {
            Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
            Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable {
                exchange: self.exchange,
                routing_key: self.routing_key,
            }),
            Confirmation::Nack(_) => Err(PublishError::Nacked {
                routing_key: self.routing_key,
            }),
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
