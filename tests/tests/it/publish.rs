//! Publishing many messages at once (`Publisher::publish_all`, used by the producer SDK
//! for a recorded chunk and by workers for a committed batch's outcome events): every
//! message is confirmed and stored in the order given, and an unroutable mandatory
//! message is refused alone.

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use oncely_core::config::BrokerConfig;
use oncely_core::publish::{Message, PublishError, PublishOptions, Publisher};

#[tokio::test]
async fn publish_all_stores_every_message_in_order_and_refuses_only_the_unroutable() {
    let config = BrokerConfig::at(&oncely_tests::amqp_url());
    let conn = oncely_core::topology::connect(&config, "oncely-test-publish-all")
        .await
        .expect("connect");
    let publisher = Publisher::open(&conn).await.expect("confirm channel");
    let queue = oncely_tests::unique_name("oncely_t_publish_all");
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

    // More than a join's small-set limit (30), with one unroutable message in the middle.
    const N: usize = 500;
    const UNROUTABLE: usize = 250;
    let bodies: Vec<Vec<u8>> = (0..N)
        .map(|i| format!("{{\"n\":{i}}}").into_bytes())
        .collect();
    let messages = bodies.iter().enumerate().map(|(i, body)| Message {
        exchange: "",
        routing_key: if i == UNROUTABLE { &nobody } else { &queue },
        body,
        options: PublishOptions::mandatory(),
    });
    let sent = publisher.publish_all(messages).await;
    assert_eq!(sent.len(), N);
    for (i, p) in sent.into_iter().enumerate() {
        let confirmed = p.expect("handed to the connection").confirmed().await;
        if i == UNROUTABLE {
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
    for i in (0..N).filter(|&i| i != UNROUTABLE) {
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
