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

use crate::config::{BrokerConfig, ConfigError};
use crate::tls::{self, TlsFailure};
use crate::topology::describe_amqp;
use lapin::tcp::{AMQPUriTcpExt as _, RustlsConnector};
use lapin::uri::{AMQPScheme, AMQPUri};
use std::sync::Arc;

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
}

impl AmqpError {
    /// lapin's error, when the connection was attempted and failed (not a settings or TLS
    /// problem).
    pub fn lapin(&self) -> Option<&lapin::Error> {
        match self {
            Self::Connect { source, .. } => Some(source),
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

/// A parsed broker URL with its TLS settings loaded: build one at start (bad files fail
/// there), connect as often as needed.
#[derive(Clone)]
pub struct AmqpConnector {
    uri: AMQPUri,
    target: String,
    tls: Option<RustlsConnector>,
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
        let uri: AMQPUri = broker
            .url
            .parse()
            .map_err(|e: String| field_error("broker.url", format!("not an AMQP URL: {e}")))?;
        let tls = match uri.scheme {
            AMQPScheme::AMQP => None,
            AMQPScheme::AMQPS => Some(client_config(broker, &field_error)?),
        };
        Ok(Self {
            target: describe_amqp(&broker.url),
            uri,
            tls,
        })
    }

    /// `user@host:port/vhost`, for messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether connections are TLS (`amqps://`).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connect, naming the connection after this process (visible in the management UI
    /// and in `rabbitmqctl list_connections`).
    pub async fn connect(&self, name: &str) -> Result<lapin::Connection, AmqpError> {
        let props = lapin::ConnectionProperties::default().with_connection_name(name.into());
        let runtime = lapin::runtime::default_runtime().map_err(|source| AmqpError::Connect {
            target: self.target.clone(),
            source,
        })?;
        let tls = self.tls.clone();
        let connected = lapin::Connection::connector(
            self.uri.clone(),
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
        connected.map_err(|source| self.classify(source))
    }

    fn classify(&self, source: lapin::Error) -> AmqpError {
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
                target: self.target.clone(),
                failure,
            },
            None => AmqpError::Connect {
                target: self.target.clone(),
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
}
