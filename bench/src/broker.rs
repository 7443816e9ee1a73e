//! The broker ceiling: bare publish-with-confirms and consume-with-ack through one
//! quorum queue — the same bodies, the same prefetch, no journal, no provider. The
//! consumer acks what has arrived with one `multiple` ack, as a worker acks a committed
//! batch (docs/performance.md, "Acks in runs").

use super::sys::{self, CpuSampler, CpuUse};
use futures_util::{FutureExt, StreamExt};
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use oncely_core::config::BrokerConfig;
use oncely_core::publish::{Message, PublishOptions, Publisher};
use oncely_core::topology;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Confirms awaited together, as the producer SDK does for an `enqueue_many` of this size.
pub const CONFIRM_WINDOW: usize = 1000;

/// What the broker did.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerResult {
    /// Messages through the queue.
    pub messages: usize,
    /// Seconds from the first publish to the last ack.
    pub seconds: f64,
    /// Messages per second.
    pub msg_per_s: f64,
    /// Seconds until the last confirm arrived (the publishing side alone).
    pub publish_seconds: f64,
    /// Where the CPUs' time went.
    pub cpu: CpuUse,
}

/// Run it on a fresh quorum queue `<prefix>.ceiling`, deleted at the end.
pub async fn run(
    amqp_url: &str,
    prefix: &str,
    bodies: &[(String, Vec<u8>)],
    prefetch: u16,
) -> anyhow::Result<BrokerResult> {
    let queue = format!("{prefix}.ceiling");
    sys::registry(|r| r.queues.push(queue.clone()));
    let result = measure(amqp_url, &queue, bodies, prefetch).await;
    if let Err(e) = delete_queue(amqp_url, &queue).await {
        eprintln!("warning: could not delete queue {queue}: {e}");
    } else {
        sys::registry(|r| r.queues.retain(|q| q != &queue));
    }
    result
}

/// Delete a bare queue.
pub async fn delete_queue(amqp_url: &str, queue: &str) -> anyhow::Result<()> {
    let conn = topology::connect(&BrokerConfig::at(amqp_url), "oncely-bench-cleanup").await?;
    let ch = conn.create_channel().await?;
    ch.queue_delete(queue.into(), Default::default()).await?;
    oncely_core::amqp::close(&conn, "bench", "bench cleanup").await;
    Ok(())
}

async fn measure(
    amqp_url: &str,
    queue: &str,
    bodies: &[(String, Vec<u8>)],
    prefetch: u16,
) -> anyhow::Result<BrokerResult> {
    let n = bodies.len();
    // Producer and consumer on their own connections, as they are in a deployment.
    let pconn = topology::connect(&BrokerConfig::at(amqp_url), "oncely-bench-publisher").await?;
    let cconn = topology::connect(&BrokerConfig::at(amqp_url), "oncely-bench-consumer").await?;
    let publisher = Publisher::open(&pconn).await?;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    publisher
        .channel()
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await?;
    let cch = cconn.create_channel().await?;
    cch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = cch
        .basic_consume(
            queue.into(),
            "oncely-bench-ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let consuming = tokio::spawn(async move {
        let mut acked = 0usize;
        while acked < n {
            match tokio::time::timeout(Duration::from_secs(60), consumer.next()).await {
                Ok(Some(Ok(mut d))) => {
                    // What else has already arrived is acked with the last of it, in one
                    // `multiple` ack (every delivery below is being acked: nothing is
                    // held back on this channel).
                    let mut got = 1;
                    while acked + got < n {
                        match consumer.next().now_or_never() {
                            Some(Some(Ok(next))) => {
                                d = next;
                                got += 1;
                            }
                            Some(Some(Err(e))) => return Err(e.into()),
                            Some(None) | None => break,
                        }
                    }
                    let ack = BasicAckOptions { multiple: got > 1 };
                    if !d.acker.ack(ack).await? {
                        anyhow::bail!("an ack was refused by the channel");
                    }
                    acked += got;
                }
                Ok(Some(Err(e))) => return Err(e.into()),
                Ok(None) => anyhow::bail!("the consumer was cancelled after {acked} messages"),
                Err(_) => anyhow::bail!("no delivery for 60 s after {acked} of {n} messages"),
            }
        }
        Ok::<Instant, anyhow::Error>(Instant::now())
    });

    let cpu = CpuSampler::start();
    let started = Instant::now();
    for window in bodies.chunks(CONFIRM_WINDOW) {
        // The window's publishes together (as the producer SDK publishes a recorded chunk).
        let pending = publisher
            .publish_all(window.iter().map(|(id, body)| Message {
                exchange: "",
                routing_key: queue,
                body,
                options: PublishOptions::mandatory().with_message_id(id),
            }))
            .await;
        for p in pending {
            p?.confirmed().await?;
        }
    }
    let publish_seconds = started.elapsed().as_secs_f64();
    let last_ack = consuming.await??;
    let cpu = cpu.finish(&[]);
    let seconds = last_ack.duration_since(started).as_secs_f64();
    oncely_core::amqp::close(&cconn, "bench", "bench done").await;
    oncely_core::amqp::close(&pconn, "bench", "bench done").await;
    Ok(BrokerResult {
        messages: n,
        seconds,
        msg_per_s: n as f64 / seconds,
        publish_seconds,
        cpu,
    })
}
