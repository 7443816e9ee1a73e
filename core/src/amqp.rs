//! Connecting to RabbitMQ: `amqp://` in plain text, `amqps://` over TLS with the
//! certificate checked against `[broker.tls] ca_file` (or the system's CAs) and the URL's
//! host name, and a client certificate when one is configured.
//!
//! Why we build the rustls config ourselves instead of handing lapin a PEM string
//! (`OwnedTLSConfig`): lapin *adds* such a CA to the system's roots, so a broker
//! certificate from any public CA would pass as well. A `ca_file` here is the only CA
//! trusted, as with libpq's `sslrootcert` and the providers' `ca_file`. lapin's own TCP
//! connect is kept (same DNS and socket handling); only the TLS step is ours.
//!
//! The scheme decides: an `amqps://` URL never falls back to plain text (a port that does
//! not answer in TLS is an error), and [`BrokerConfig::validate`] refuses TLS files with
//! an `amqp://` URL. Errors name the broker (`user@host:port/vhost`, never the password)
//! and, for TLS, say what is wrong in words ([`TlsFailure`]).
//!
//! A cluster (`broker.urls`): every connect tries the nodes in turn, starting with the
//! one that answered last (a process picks a random first node, so a fleet spreads over
//! the cluster), each with [`CONNECT_TIMEOUT`]; the error when none answers names every
//! node tried and why. Queues are quorum queues replicated on every node, so any node
//! serves them.
//!
//! The largest AMQP frame is [`DEFAULT_FRAME_MAX`] unless the URL asks for another
//! (`?frame_max=N`). Why not RabbitMQ's 128 KiB: lapin 4.12 keeps a send and a receive
//! buffer of 32 frames each per connection and fills them with zeros when the connection
//! opens, so 128 KiB frames cost every process 8 MiB of memory (a quarter of a worker's
//! heap at 1,000 calls in flight, heaptrack, docs/performance.md); 16 KiB frames cost
//! 1 MiB. A message larger than a frame travels as several body frames — envelopes are
//! about 500 bytes, at most `max_message_bytes` (256 KiB by default: 17 body frames).

use crate::config::{BrokerConfig, ConfigError};
use crate::tls::{self, TlsFailure};
use crate::topology::describe_amqp;
use lapin::tcp::{AMQPUriTcpExt as _, RustlsConnector};
use lapin::uri::{AMQPScheme, AMQPUri};
use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// How long one node may take to accept a connection (TCP, TLS and the AMQP handshake)
/// before the next is tried: a node that is down but not refusing (a dropped route) must
/// not stall a failover for the kernel's TCP timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// The largest AMQP frame oncely asks for when the URL does not say (`?frame_max=N`,
/// 4096 at least; the broker's own limit wins when lower): see the module docs.
pub const DEFAULT_FRAME_MAX: u32 = 16 * 1024;

/// How long a stopping process waits for the broker's answer to each of its closing
/// steps (a consumer's `basic.cancel`, the connection's `connection.close`).
///
/// Why bounded: lapin waits for `cancel-ok` and `close-ok` with no limit, so a broker that
/// stops answering (a partition, a frozen node) would keep a process from ever stopping;
/// and lapin 4.12.3's `Connection::close` was seen never to return with a healthy
/// RabbitMQ 3.10 (in the demo under CPU load: "closing the connection" logged, the close
/// never done). Giving up is safe: what the process has not acked is redelivered by the
/// broker when the connection ends, and the journal dedupes the redelivery.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Close `conn` gracefully, waiting at most [`STOP_TIMEOUT`] for the broker's answer.
/// `true` when the close completed (or the connection was already gone); `false` (and a
/// warning naming `who`) when the broker did not answer in time — the connection is then
/// left to end with the process, or with the broker's heartbeat check.
pub async fn close(conn: &lapin::Connection, who: &str, why: &str) -> bool {
    match tokio::time::timeout(STOP_TIMEOUT, conn.close(200, why.into())).await {
        Ok(_) => true,
        Err(_) => {
            tracing::warn!(
                process = who,
                timeout = ?STOP_TIMEOUT,
                "RabbitMQ did not answer the connection close in time; leaving the connection to end with the process"
            );
            false
        }
    }
}

/// Why a connection to RabbitMQ could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AmqpError {
    /// A setting cannot be used: the URL, or a TLS file (missing, unreadable, not PEM).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TLS handshake failed (or the server refused us right after it).
    #[error("cannot connect to RabbitMQ at {target} over TLS: {failure}{}", amqp_hint(.failure))]
    Tls {
        /// `user@host:port/vhost`, without password.
        target: String,
        /// What went wrong, in words.
        failure: TlsFailure,
    },
    /// Anything else: refused, unreachable, bad credentials, closed.
    #[error("cannot connect to RabbitMQ at {target}: {source}")]
    Connect {
        /// `user@host:port/vhost`, without password.
        target: String,
        /// lapin's error.
        source: lapin::Error,
    },
    /// The node did not complete the connection within [`CONNECT_TIMEOUT`].
    #[error("cannot connect to RabbitMQ at {target}: no answer within {}s", .after.as_secs())]
    Timeout {
        /// `user@host:port/vhost`, without password.
        target: String,
        /// How long we waited.
        after: Duration,
    },
    /// None of the nodes of `broker.urls` could be connected to.
    #[error(
        "cannot connect to any of the {} RabbitMQ nodes of broker.urls (tried in this order): {}",
        .tried.len(),
        .tried.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    AllNodes {
        /// Each node's error, in the order they were tried.
        tried: Vec<AmqpError>,
    },
}

impl AmqpError {
    /// lapin's error, when the connection was attempted and failed (not a settings or TLS
    /// problem).
    pub fn lapin(&self) -> Option<&lapin::Error> {
        match self {
            Self::Connect { source, .. } => Some(source),
            Self::AllNodes { tried } => tried.last().and_then(Self::lapin),
            _ => None,
        }
    }
}

/// What to check next, for the operator reading the error.
fn amqp_hint(failure: &TlsFailure) -> &'static str {
    match failure {
        TlsFailure::NotTrusted => {
            " (trusted: the CAs in broker.tls.ca_file, or the system's CA bundle without it)"
        }
        TlsFailure::NameMismatch { .. } => {
            " (the URL's host must be a name the certificate carries)"
        }
        TlsFailure::ClientCertificateRequired => {
            " (set broker.tls.cert_file and broker.tls.key_file)"
        }
        TlsFailure::Closed => {
            " (check broker.tls.cert_file and broker.tls.key_file, and the broker's log)"
        }
        TlsFailure::NotTls => " (amqps:// needs the broker's TLS port, usually 5671)",
        _ => "",
    }
}

/// The parsed broker URLs (one per node) with their TLS settings loaded: build one at
/// start (bad files fail there), connect as often as needed. Clones share the node that
/// answered last.
#[derive(Clone)]
pub struct AmqpConnector {
    nodes: Vec<Node>,
    target: String,
    tls: Option<RustlsConnector>,
    /// The node to try first: the one that answered last.
    next: Arc<AtomicUsize>,
}

/// One node of the cluster (or the only one).
#[derive(Clone)]
struct Node {
    uri: AMQPUri,
    target: String,
}

impl std::fmt::Debug for AmqpConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpConnector")
            .field("target", &self.target)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl AmqpConnector {
    /// Check the URL and read the TLS files of `broker` (errors name the field and file).
    pub fn new(broker: &BrokerConfig) -> Result<Self, AmqpError> {
        broker.validate()?;
        let field_error = |field: &str, problem: String| ConfigError::Invalid {
            field: field.into(),
            problem,
        };
        let field = broker.urls_field();
        let urls = broker.node_urls();
        let mut nodes = Vec::with_capacity(urls.len());
        for (i, url) in urls.iter().enumerate() {
            let mut uri: AMQPUri = url.parse().map_err(|e: String| {
                let which = if urls.len() > 1 {
                    format!("URL {} is ", i + 1)
                } else {
                    String::new()
                };
                field_error(field, format!("{which}not an AMQP URL: {e}"))
            })?;
            uri.query.frame_max.get_or_insert(DEFAULT_FRAME_MAX);
            nodes.push(Node {
                uri,
                target: describe_amqp(url),
            });
        }
        // `validate` made every scheme the same.
        let tls = match nodes[0].uri.scheme {
            AMQPScheme::AMQP => None,
            AMQPScheme::AMQPS => Some(client_config(broker, &field_error)?),
        };
        // A random first node per process, so that a fleet spreads over the cluster.
        let start = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish() as usize
            % nodes.len();
        Ok(Self {
            target: nodes
                .iter()
                .map(|n| n.target.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            nodes,
            tls,
            next: Arc::new(AtomicUsize::new(start)),
        })
    }

    /// `user@host:port/vhost` (of every node, comma-separated), for messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// How many nodes there are to try.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Whether connections are TLS (`amqps://`).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connect, naming the connection after this process (visible in the management UI
    /// and in `rabbitmqctl list_connections`).
    ///
    /// With several nodes, they are tried in turn from the one that answered last; the
    /// error names every node and why it failed.
    pub async fn connect(&self, name: &str) -> Result<lapin::Connection, AmqpError> {
        let n = self.nodes.len();
        let start = self.next.load(Ordering::Relaxed) % n;
        let mut tried = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            let node = &self.nodes[i];
            let attempt = tokio::time::timeout(CONNECT_TIMEOUT, self.connect_node(node, name));
            let result = match attempt.await {
                Ok(result) => result,
                Err(_) => Err(AmqpError::Timeout {
                    target: node.target.clone(),
                    after: CONNECT_TIMEOUT,
                }),
            };
            match result {
                Ok(conn) => {
                    self.next.store(i, Ordering::Relaxed);
                    if !tried.is_empty() {
                        tracing::warn!(
                            node = %node.target,
                            failed = %tried.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
                            "connected to another RabbitMQ node of broker.urls"
                        );
                    }
                    return Ok(conn);
                }
                // A settings problem is the same on every node.
                Err(e @ AmqpError::Config(_)) => return Err(e),
                Err(e) => tried.push(e),
            }
        }
        match (n, tried.pop()) {
            (1, Some(only)) => Err(only),
            (_, last) => {
                tried.extend(last);
                Err(AmqpError::AllNodes { tried })
            }
        }
    }

    async fn connect_node(&self, node: &Node, name: &str) -> Result<lapin::Connection, AmqpError> {
        let props = lapin::ConnectionProperties::default().with_connection_name(name.into());
        let runtime = lapin::runtime::default_runtime().map_err(|source| AmqpError::Connect {
            target: node.target.clone(),
            source,
        })?;
        let tls = self.tls.clone();
        let connected = lapin::Connection::connector(
            node.uri.clone(),
            runtime,
            async move |uri: AMQPUri, runtime| {
                // lapin's TCP connect (DNS, socket), then our TLS step for amqps://.
                let mut tcp_uri = uri.clone();
                tcp_uri.scheme = AMQPScheme::AMQP;
                let stream = tcp_uri.connect_async(&runtime).await?;
                match (&uri.scheme, &tls) {
                    (AMQPScheme::AMQP, _) => Ok(stream),
                    (AMQPScheme::AMQPS, Some(tls)) => {
                        let host = uri.authority.host.trim_start_matches('[');
                        let host = host.trim_end_matches(']');
                        Ok(stream.into_rustls(tls, host).await?)
                    }
                    // Unreachable: `new` builds a connector for every amqps:// URL. Never
                    // fall back to plain text if it ever were reached.
                    (AMQPScheme::AMQPS, None) => {
                        Err(std::io::Error::other("amqps:// without a TLS configuration").into())
                    }
                }
            },
            props,
        )
        .await;
        connected.map_err(|source| self.classify(node, source))
    }

    fn classify(&self, node: &Node, source: lapin::Error) -> AmqpError {
        let tls_failure = match source.kind() {
            lapin::ErrorKind::IOError(io) if self.is_tls() => {
                // lapin only returns from `connect` once the AMQP handshake is done, so an
                // I/O error here came before the broker said anything in AMQP.
                TlsFailure::find(io.as_ref()).or_else(|| TlsFailure::closed(io))
            }
            _ => None,
        };
        match tls_failure {
            Some(failure) => AmqpError::Tls {
                target: node.target.clone(),
                failure,
            },
            None => AmqpError::Connect {
                target: node.target.clone(),
                source,
            },
        }
    }
}

/// The rustls client config of an `amqps://` connection: the CA file alone (or the
/// system's roots), a client certificate when configured, ring as the crypto provider.
fn client_config(
    broker: &BrokerConfig,
    field_error: &dyn Fn(&str, String) -> ConfigError,
) -> Result<RustlsConnector, ConfigError> {
    let t = &broker.tls;
    let roots = match &t.ca_file {
        Some(path) => {
            tls::roots_from_file(path).map_err(|e| field_error("broker.tls.ca_file", e))?
        }
        None => tls::system_roots().map_err(|e| field_error("broker.tls.ca_file", e))?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| field_error("broker.tls", format!("TLS setup failed: {e}")))?
        .with_root_certificates(roots);
    let config = match (&t.cert_file, &t.key_file) {
        (Some(cert), Some(key)) => {
            let chain =
                tls::certs_from_file(cert).map_err(|e| field_error("broker.tls.cert_file", e))?;
            let key = tls::key_from_file(key).map_err(|e| field_error("broker.tls.key_file", e))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                field_error(
                    "broker.tls.key_file",
                    format!("does not match broker.tls.cert_file: {e}"),
                )
            })?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(RustlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::broker::BrokerTls;

    fn broker(url: &str, tls: BrokerTls) -> BrokerConfig {
        BrokerConfig {
            url: url.into(),
            tls,
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn frames_are_16_kib_unless_the_url_names_a_size() {
        let frame_max = |url: &str| {
            let c = AmqpConnector::new(&broker(url, BrokerTls::default())).expect(url);
            c.nodes[0].uri.query.frame_max
        };
        assert_eq!(
            frame_max("amqp://guest:guest@127.0.0.1:5672/%2f"),
            Some(DEFAULT_FRAME_MAX)
        );
        assert_eq!(
            frame_max("amqp://guest:guest@127.0.0.1:5672/%2f?frame_max=131072&heartbeat=10"),
            Some(131_072)
        );
    }

    #[test]
    fn a_missing_tls_file_is_named_with_its_field() {
        let cases = [
            (
                BrokerTls {
                    ca_file: Some("/nonexistent/ca.pem".into()),
                    ..BrokerTls::default()
                },
                "broker.tls.ca_file",
            ),
            (
                BrokerTls {
                    cert_file: Some("/nonexistent/client.pem".into()),
                    key_file: Some("/nonexistent/client.key".into()),
                    ..BrokerTls::default()
                },
                "broker.tls.cert_file",
            ),
        ];
        for (tls, field) in cases {
            let err = AmqpConnector::new(&broker("amqps://u:secret@mq.example/%2f", tls))
                .expect_err(field)
                .to_string();
            assert!(
                err.contains(field) && err.contains("/nonexistent/"),
                "{err}"
            );
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn tls_files_with_a_plain_url_are_refused() {
        let tls = BrokerTls {
            ca_file: Some("/etc/ssl/certs/ca-certificates.crt".into()),
            ..BrokerTls::default()
        };
        let err = AmqpConnector::new(&broker("amqp://u:p@mq.example/%2f", tls))
            .expect_err("plain URL with a CA")
            .to_string();
        assert!(
            err.contains("broker.tls.ca_file") && err.contains("amqps://"),
            "{err}"
        );
    }

    #[test]
    fn a_plain_url_needs_no_tls() {
        let c = AmqpConnector::new(&broker(
            "amqp://u:p@mq.example:5672/%2f",
            BrokerTls::default(),
        ))
        .expect("plain");
        assert!(!c.is_tls());
        assert_eq!(c.target(), "u@mq.example:5672//");
    }

    /// Three local ports nothing listens on (bound, then released).
    fn closed_ports() -> Vec<u16> {
        let listeners: Vec<_> = (0..3)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        listeners
            .iter()
            .map(|l| l.local_addr().expect("addr").port())
            .collect()
    }

    #[tokio::test]
    async fn with_no_node_answering_the_error_names_every_node_and_no_password() {
        let ports = closed_ports();
        let urls: Vec<String> = ports
            .iter()
            .map(|p| format!("amqp://u:secret@127.0.0.1:{p}/%2f"))
            .collect();
        let config = BrokerConfig {
            urls,
            ..BrokerConfig::default()
        };
        let c = AmqpConnector::new(&config).expect("connector");
        assert_eq!(c.node_count(), 3);
        let err = c.connect("test").await.expect_err("nothing listens");
        let AmqpError::AllNodes { tried } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(tried.len(), 3);
        let text = err.to_string();
        for p in &ports {
            assert!(text.contains(&format!("u@127.0.0.1:{p}//")), "{text}");
        }
        assert!(text.contains("broker.urls"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }

    #[tokio::test]
    async fn a_single_url_keeps_its_own_error() {
        let port = closed_ports()[0];
        let c = AmqpConnector::new(&BrokerConfig::at(&format!(
            "amqp://u:secret@127.0.0.1:{port}/%2f"
        )))
        .expect("connector");
        let err = c.connect("test").await.expect_err("nothing listens");
        assert!(matches!(err, AmqpError::Connect { .. }), "{err:?}");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
