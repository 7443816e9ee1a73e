//! Publishing many messages at once (`Publisher::publish_all`, used by the producer SDK
//! for a recorded chunk and by workers for a committed batch's outcome events): every
//! message is confirmed and stored in the order given, and an unroutable mandatory
//! message is refused alone — the one that was returned, not a neighbour acknowledged in
//! the same multiple-ack (lapin hands a `basic.return` to whichever confirm of that ack
//! it resolves first; CI once saw message 247 refused for message 250).

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use oncely_core::config::BrokerConfig;
use oncely_core::publish::{Message, PublishError, PublishOptions, Publisher};

/// A connection, a publisher on it, an exclusive queue of its own (`queue`) and a routing
/// key no queue is bound to (`nobody`).
async fn setup(tag: &str) -> (lapin::Connection, Publisher, String, String) {
    let config = BrokerConfig::at(&oncely_tests::amqp_url());
    let conn = oncely_core::topology::connect(&config, tag)
        .await
        .expect("connect");
    let publisher = Publisher::open(&conn).await.expect("confirm channel");
    let queue = oncely_tests::unique_name(tag);
    let nobody = oncely_tests::unique_name("oncely_t_nobody");
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..Default::default()
    };
    publisher
        .channel()
        .queue_declare(queue.as_str().into(), exclusive, FieldTable::default())
        .await
        .expect("declare");
    (conn, publisher, queue, nobody)
}

#[tokio::test]
async fn publish_all_stores_every_message_in_order_and_refuses_only_the_unroutable() {
    let (conn, publisher, queue, nobody) = setup("oncely_t_publish_all").await;

    // More than a join's small-set limit (30), with every seventh message unroutable: the
    // broker acknowledges runs of them with one multiple-ack, each after its return.
    const N: usize = 2_000;
    let unroutable = |i: usize| i % 7 == 3;
    let bodies: Vec<Vec<u8>> = (0..N)
        .map(|i| format!("{{\"n\":{i}}}").into_bytes())
        .collect();
    let messages = bodies.iter().enumerate().map(|(i, body)| Message {
        exchange: "",
        routing_key: if unroutable(i) { &nobody } else { &queue },
        body,
        options: PublishOptions::mandatory(),
    });
    let sent = publisher.publish_all(messages).await;
    assert_eq!(sent.len(), N);
    for (i, p) in sent.into_iter().enumerate() {
        let confirmed = p.expect("handed to the connection").confirmed().await;
        if unroutable(i) {
            assert!(
                matches!(&confirmed, Err(PublishError::Unroutable { routing_key, .. }) if routing_key == &nobody),
                "message {i}: {confirmed:?}"
            );
        } else {
            assert!(confirmed.is_ok(), "message {i}: {confirmed:?}");
        }
    }

    let ch = conn.create_channel().await.expect("channel");
    let no_ack = BasicGetOptions { no_ack: true };
    for i in (0..N).filter(|&i| !unroutable(i)) {
        let got = ch
            .basic_get(queue.as_str().into(), no_ack)
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("message {i} missing"));
        assert_eq!(
            String::from_utf8_lossy(&got.delivery.data),
            String::from_utf8_lossy(&bodies[i]),
            "out of order at {i}"
        );
    }
    let rest = ch
        .basic_get(queue.as_str().into(), no_ack)
        .await
        .expect("get");
    assert!(rest.is_none(), "more messages than published");
    oncely_core::amqp::close(&conn, "oncely-test", "done").await;
}

/// Several tasks publishing on clones of one publisher, one message at a time, their
/// confirms awaited at the end: their messages are published together, and each returned
/// message is refused to its own publisher — also when several returned messages are
/// identical (which of those is refused does not matter; how many does).
#[tokio::test]
async fn concurrent_publishers_each_get_their_own_returns() {
    let (conn, publisher, queue, nobody) = setup("oncely_t_publish_concurrent").await;

    const TASKS: usize = 4;
    const EACH: usize = 300;
    let unroutable = |i: usize| i % 5 == 2;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (publisher, queue, nobody) = (publisher.clone(), queue.clone(), nobody.clone());
            tokio::spawn(async move {
                let mut pending = Vec::new();
                for i in 0..EACH {
                    // Returned messages of every task alike; routed ones all differ.
                    let (key, body) = if unroutable(i) {
                        (&nobody, "{}".to_owned())
                    } else {
                        (&queue, format!("{{\"t\":{t},\"n\":{i}}}"))
                    };
                    let p = publisher
                        .publish("", key, body.as_bytes(), PublishOptions::mandatory())
                        .await
                        .expect("handed to the connection");
                    pending.push(p);
                }
                let mut verdicts = Vec::new();
                for p in pending {
                    verdicts.push(p.confirmed().await);
                }
                verdicts
            })
        })
        .collect();
    for (t, task) in tasks.into_iter().enumerate() {
        for (i, confirmed) in task.await.expect("task").into_iter().enumerate() {
            if unroutable(i) {
                assert!(
                    matches!(&confirmed, Err(PublishError::Unroutable { routing_key, .. }) if routing_key == &nobody),
                    "task {t}, message {i}: {confirmed:?}"
                );
            } else {
                assert!(confirmed.is_ok(), "task {t}, message {i}: {confirmed:?}");
            }
        }
    }
    let ch = conn.create_channel().await.expect("channel");
    let stored = ch
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare")
        .message_count();
    let routed = TASKS * (0..EACH).filter(|&i| !unroutable(i)).count();
    assert_eq!(stored as usize, routed);
    oncely_core::amqp::close(&conn, "oncely-test", "done").await;
}
