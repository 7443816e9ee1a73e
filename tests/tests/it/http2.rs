//! HTTP/2 to providers (`http2 = true`) against a real HTTP/2 server that is not oncely's
//! own: Debian's nginx, over TLS (ALPN `h2`) and without (h2c by prior knowledge), and
//! the same server speaking HTTP/1.1 only. What is shown, from nginx's access log: the
//! switch is what picks the protocol; over HTTP/2 every call in flight is a stream of one
//! connection; a TLS server without `h2` is reached over HTTP/1.1; an `http://` server
//! that does not speak h2c gets none of our requests, and the call is unknown (nothing
//! proves that). And against the sandbox over TLS with h2: a reset of the shared
//! connection after the request is unknown, and the lookup finds the effect.

use super::https::{bank, payment, payment_call, temp_dir};
use futures_util::future::join_all;
use oncely_core::IdempotencyKey;
use oncely_sandbox::{FaultMode, FaultRule, Faults};
use oncely_tests::eventually;
use oncely_tests::nginx::{Logged, Nginx};
use oncely_tests::tls::{TestCa, Validity};
use oncely_worker::provider::{Outcome, Provider, Remote};
use std::collections::BTreeSet;
use std::time::Duration;

/// Calls made at once in the shared-connection checks.
const AT_ONCE: u8 = 24;

fn key(run: u8, n: u8) -> IdempotencyKey {
    let run = format!("{run:02x}").repeat(31);
    IdempotencyKey::parse(&format!("v1:{run}{n:02x}")).expect("key")
}

async fn execute(provider: &dyn Provider, run: u8, n: u8) -> Outcome {
    let (key, payload) = (key(run, n), payment(n));
    provider.execute(payment_call(&key, &payload)).await
}

/// `AT_ONCE` calls at once (keys `run`/0..): every outcome.
async fn at_once(provider: &dyn Provider, run: u8) -> Vec<Outcome> {
    join_all((0..AT_ONCE).map(|n| execute(provider, run, n))).await
}

fn succeeded(outcomes: &[Outcome]) -> bool {
    outcomes
        .iter()
        .all(|o| matches!(o, Outcome::Succeeded { .. }))
}

/// The protocols and the number of connections of `run`'s requests in `log`.
fn seen(log: &[Logged], run: u8) -> (BTreeSet<String>, usize, usize) {
    let prefix = format!("v1:{}", format!("{run:02x}").repeat(31));
    let ours: Vec<&Logged> = log.iter().filter(|l| l.key.starts_with(&prefix)).collect();
    let protocols = ours.iter().map(|l| l.protocol.clone()).collect();
    let connections = ours.iter().map(|l| l.connection).collect::<BTreeSet<_>>();
    (protocols, connections.len(), ours.len())
}

/// [`seen`] on `base`'s listener once nginx has logged all `AT_ONCE` requests of `run`:
/// it writes a line after answering, so the last may come after the client has its answer.
async fn logged(nginx: &Nginx, base: &str, run: u8) -> (BTreeSet<String>, usize, usize) {
    eventually(
        &format!("nginx to log {AT_ONCE} requests of run {run}"),
        Duration::from_secs(10),
        || async {
            let seen = seen(&nginx.requests(base), run);
            (seen.2 >= AT_ONCE.into()).then_some(seen)
        },
    )
    .await
}

fn set(protocol: &str) -> BTreeSet<String> {
    BTreeSet::from([protocol.to_owned()])
}

#[tokio::test]
async fn over_tls_the_switch_picks_http2_in_the_handshake_and_calls_share_one_connection() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let nginx = Nginx::start(&ca).await;
    let ca_file = Some(ca.ca_file().to_owned());

    // http2 = true: ALPN picks h2, and every call in flight is a stream of one connection.
    let h2 = bank(&nginx.tls_h2, |p| {
        p.ca_file = ca_file.clone();
        p.http2 = true;
    });
    let outcomes = at_once(h2.as_ref(), 1).await;
    assert!(succeeded(&outcomes), "{outcomes:?}");
    assert_eq!(
        logged(&nginx, &nginx.tls_h2, 1).await,
        (set("HTTP/2.0"), 1, AT_ONCE.into())
    );
    let log = nginx.requests(&nginx.tls_h2);
    assert!(log.iter().all(|l| l.method == "POST"), "{log:?}");

    // The same server without the switch: HTTP/1.1, a connection per call in flight.
    let h1 = bank(&nginx.tls_h2, |p| p.ca_file = ca_file.clone());
    let outcomes = at_once(h1.as_ref(), 2).await;
    assert!(succeeded(&outcomes), "{outcomes:?}");
    let (protocols, connections, requests) = logged(&nginx, &nginx.tls_h2, 2).await;
    assert_eq!((protocols, requests), (set("HTTP/1.1"), AT_ONCE.into()));
    assert!(
        connections > 1,
        "{connections} connections for {AT_ONCE} calls at once"
    );

    // A server that does not offer h2: the switch falls back to HTTP/1.1.
    let fallback = bank(&nginx.tls_h1, |p| {
        p.ca_file = ca_file.clone();
        p.http2 = true;
    });
    let outcomes = at_once(fallback.as_ref(), 3).await;
    assert!(succeeded(&outcomes), "{outcomes:?}");
    let (protocols, _, requests) = logged(&nginx, &nginx.tls_h1, 3).await;
    assert_eq!((protocols, requests), (set("HTTP/1.1"), AT_ONCE.into()));
}

#[tokio::test]
async fn without_tls_the_switch_speaks_h2c_and_an_http1_server_gets_no_request() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let nginx = Nginx::start(&ca).await;

    let h2c = bank(&nginx.h2c, |p| p.http2 = true);
    let outcomes = at_once(h2c.as_ref(), 4).await;
    assert!(succeeded(&outcomes), "{outcomes:?}");
    assert_eq!(
        logged(&nginx, &nginx.h2c, 4).await,
        (set("HTTP/2.0"), 1, AT_ONCE.into())
    );

    // HTTP/2 by prior knowledge to a server that speaks HTTP/1.1 only: nginx never reads
    // a request of ours (it answers the preface with an error and closes), but the
    // connection was handed over before that came back, so nothing proves it: unknown.
    let wrong = bank(&nginx.plain_h1, |p| p.http2 = true);
    let outcome = execute(wrong.as_ref(), 5, 0).await;
    assert!(matches!(outcome, Outcome::Unknown { .. }), "{outcome:?}");
    let log = nginx.requests(&nginx.plain_h1);
    assert_eq!(seen(&log, 5).2, 0, "{log:?}");
}

#[tokio::test]
async fn a_reset_of_the_shared_connection_is_unknown_and_the_lookup_finds_the_effect() {
    let dir = temp_dir();
    let ca = TestCa::new(&dir, "ca");
    let local = "127.0.0.1:0".parse().expect("addr");
    let mut sandbox = oncely_sandbox::spawn(local).await.expect("sandbox");
    let addr = sandbox
        .serve_tls(local, ca.server_config(&["localhost"], Validity::Current))
        .await
        .expect("TLS listener");
    let provider = bank(&format!("https://localhost:{}", addr.port()), |p| {
        p.ca_file = Some(ca.ca_file().to_owned());
        p.http2 = true;
    });
    let outcomes = at_once(provider.as_ref(), 6).await;
    assert!(succeeded(&outcomes), "{outcomes:?}");

    // The request reached the sandbox; then it resets the connection every stream shares.
    sandbox
        .set_faults(Faults {
            rules: vec![FaultRule::new(FaultMode::AcceptThenReset).times(1)],
            ..Faults::default()
        })
        .expect("faults");
    let outcome = execute(provider.as_ref(), 7, 0).await;
    assert!(matches!(outcome, Outcome::Unknown { .. }), "{outcome:?}");
    let (key, payload) = (key(7, 0), payment(0));
    let found = provider.lookup(payment_call(&key, &payload)).await;
    assert!(matches!(found, Remote::Succeeded { .. }), "{found:?}");
    assert_eq!(sandbox.effects().count(key.as_str()), 1);

    // The next call gets a new connection and succeeds.
    let outcome = execute(provider.as_ref(), 7, 1).await;
    assert!(matches!(outcome, Outcome::Succeeded { .. }), "{outcome:?}");
}
