//! One broker session, opened the same way by every long-running process.
//!
//! Workers and reconcilers both need, per connection: a connection named after the
//! process, a confirm-mode publisher, the topology declared (idempotently, so a restarted
//! broker gets it back), the `connections` metric, and consumers with a prefetch. Doing
//! it in one place keeps their behaviour after a reconnect identical. A session lives as
//! long as its connection; the caller's supervisor opens a new one after a loss.

use crate::context::Context;
use lapin::options::{BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use oncely_core::metrics as m;
use oncely_core::publish::Publisher;

/// A connection with its publisher and the topology declared.
#[derive(Debug)]
pub struct Session {
    conn: Connection,
    publisher: Publisher,
}

impl Session {
    /// Connect, open the publisher, declare the topology and count the connection.
    pub async fn open(ctx: &Context) -> anyhow::Result<Self> {
        let conn = ctx.amqp.connect(&ctx.owner).await?;
        let publisher = Publisher::open(&conn).await?;
        ctx.topology
            .declare(publisher.channel(), &ctx.action_types())
            .await?;
        metrics::counter!(m::CONNECTIONS, "kind" => "amqp", "result" => "established").increment(1);
        Ok(Self { conn, publisher })
    }

    /// The confirm-mode publisher of this session.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Consume `queue` on a channel of its own with `prefetch` unacked deliveries at most.
    /// Keep the channel as long as the consumer is wanted (cancel with `tag`).
    pub async fn consume(
        &self,
        queue: &str,
        tag: &str,
        prefetch: u16,
    ) -> anyhow::Result<(Channel, Consumer)> {
        let ch = self.conn.create_channel().await?;
        ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
        let consumer = ch
            .basic_consume(
                queue.into(),
                tag.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok((ch, consumer))
    }

    /// Close the connection (best effort: it may already be gone).
    pub async fn close(self, why: &str) {
        let _ = self.conn.close(200, why.into()).await;
    }
}
