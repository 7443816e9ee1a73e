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

/// How long a `basic.consume` may go unanswered: on RabbitMQ 3.10 a quorum queue whose
/// leader was lost in a crash never answers it (docs/operations.md), and a worker waiting
/// forever would look healthy while its queue fills.
const CONSUME_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A `541 INTERNAL_ERROR` from the broker.
fn is_internal_error(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 541)
}

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
        // The series exists (at 0) from the first consume, for the alert.
        let unusable = metrics::counter!(m::QUEUE_UNUSABLE, "queue" => queue.to_owned());
        unusable.increment(0);
        let consumed = tokio::time::timeout(
            CONSUME_TIMEOUT,
            ch.basic_consume(
                queue.into(),
                tag.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await;
        let problem = match consumed {
            Ok(Ok(consumer)) => return Ok((ch, consumer)),
            Ok(Err(e)) if !is_internal_error(&e) => return Err(e.into()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!(
                "no answer to basic.consume within {}s",
                CONSUME_TIMEOUT.as_secs()
            ),
        };
        unusable.increment(1);
        tracing::error!(
            queue,
            problem = %problem,
            "queue {queue} is unusable on the broker (a quorum queue whose leader is lost, \
             e.g. after a crash of its node): see docs/operations.md, \
             \"A quorum queue answers 541 after a crash\" — delete the queue, the fleet \
             declares it again and Postgres re-drives its work"
        );
        anyhow::bail!("queue {queue} is unusable: {problem}")
    }

    /// Close the connection (best effort: it may already be gone), waiting for the broker
    /// at most [`oncely_core::amqp::STOP_TIMEOUT`].
    pub async fn close(self, who: &str, why: &str) {
        oncely_core::amqp::close(&self.conn, who, why).await;
    }
}
