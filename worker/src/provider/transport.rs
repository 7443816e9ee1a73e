//! Reaching a provider: TCP, then TLS for `https://`, bounded by `connect_timeout`, and
//! errors that say which of the two failed.
//!
//! Why a connector of our own instead of `hyper_rustls::HttpsConnector`: the line this
//! project exists for — "not sent" (retry freely) versus "unknown" (reconcile first) —
//! now runs at the end of the TLS handshake. Until the handshake is done no request byte
//! can have been written, so a refused connect, a DNS failure, a stalled or failed
//! handshake and a certificate the provider's CA does not vouch for are all *not sent*.
//! hyper's client reports any error of this connector as `is_connect()` and only hands a
//! connection to the request after it returns, so the boundary holds by construction.
//! Owning the connector also lets the code say *which* step failed (`tls_certificate` is
//! a person's problem, `connect_failed` a network's), and bounds TCP and the handshake
//! together by one `connect_timeout`. The stream type is hyper-rustls's, so the TLS
//! stack is the one hyper's users run.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::Uri;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tower_service::Service;

/// TLS for one provider: the client config and the name its certificate must carry.
#[derive(Clone)]
pub(crate) struct Tls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// TLS to `host`, trusting the CAs in `ca_file`, or the system's roots without one.
    /// Errors are for the operator: which file, what is wrong with it.
    pub(crate) fn new(host: &str, ca_file: Option<&Path>) -> Result<Self, String> {
        Self::offering(host, ca_file, Vec::new())
    }

    /// [`Tls::new`], offering HTTP/2 in the handshake (ALPN `h2`, then `http/1.1`): the
    /// provider picks, and hyper's client speaks what was picked.
    pub(crate) fn offering_h2(host: &str, ca_file: Option<&Path>) -> Result<Self, String> {
        Self::offering(host, ca_file, vec![b"h2".to_vec(), b"http/1.1".to_vec()])
    }

    fn offering(host: &str, ca_file: Option<&Path>, alpn: Vec<Vec<u8>>) -> Result<Self, String> {
        let roots = match ca_file {
            Some(path) => oncely_core::tls::roots_from_file(path)?,
            None => oncely_core::tls::system_roots()?,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS setup failed: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn;
        // `[::1]` in a URL is `::1` in a certificate.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(bare.to_owned())
            .map_err(|e| format!("{host:?} cannot be checked against a certificate: {e}"))?;
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }
}

/// A rustls connector and the name to check, for connections other than hyper's
/// (the IMAP archive): the same roots and checks as [`Tls::new`].
pub(crate) fn rustls_connector(
    host: &str,
    ca_file: Option<&Path>,
) -> Result<(TlsConnector, ServerName<'static>), String> {
    let tls = Tls::new(host, ca_file)?;
    Ok((tls.connector, tls.server_name))
}

/// Why a connection could not be made. Every variant means *nothing was sent*.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// DNS, refused, unreachable: no TCP connection.
    Tcp(Box<dyn StdError + Send + Sync>),
    /// TCP connected, the TLS handshake failed.
    Tls(std::io::Error),
    /// TCP and the handshake together took longer than `connect_timeout`.
    TimedOut,
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp(e) => write!(f, "tcp connect failed: {e}"),
            Self::Tls(e) => write!(f, "TLS handshake failed: {e}"),
            Self::TimedOut => f.write_str("connect (TCP and TLS) timed out"),
        }
    }
}

impl StdError for ConnectFailure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Self::Tcp(e) => Some(e.as_ref()),
            Self::Tls(e) => Some(e),
            Self::TimedOut => None,
        }
    }
}

impl ConnectFailure {
    /// The short code an attempt records (`connect_failed`, `connect_timeout`,
    /// `tls_certificate`, `tls_handshake`).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::Tcp(_) => "connect_failed",
            Self::TimedOut => "connect_timeout",
            Self::Tls(e) => match e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()) {
                Some(rustls::Error::InvalidCertificate(_)) => "tls_certificate",
                _ => "tls_handshake",
            },
        }
    }

    /// The connect failure inside a client error, if that is what it was.
    pub(crate) fn find<'e>(error: &'e (dyn StdError + 'static)) -> Option<&'e Self> {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(found) = e.downcast_ref::<Self>() {
                return Some(found);
            }
            current = e.source();
        }
        None
    }
}

/// The connector: TCP (hyper's), then TLS when the provider has [`Tls`].
#[derive(Debug, Clone)]
pub(crate) struct Connector {
    tcp: HttpConnector,
    tls: Option<Tls>,
    timeout: Duration,
}

/// What the connector hands hyper: plain TCP or TLS over it.
pub(crate) type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

impl Connector {
    /// `tls`: `None` for an `http://` provider.
    pub(crate) fn new(tls: Option<Tls>, connect_timeout: Duration) -> Self {
        let mut tcp = HttpConnector::new();
        // The URL's scheme is ours to judge (https is handled here, not refused).
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        Connector {
            tcp,
            tls,
            timeout: connect_timeout,
        }
    }
}

impl Service<Uri> for Connector {
    type Response = Stream;
    type Error = ConnectFailure;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, ConnectFailure>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ConnectFailure>> {
        self.tcp
            .poll_ready(cx)
            .map_err(|e| ConnectFailure::Tcp(Box::new(e)))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tcp = self.tcp.call(uri);
        let tls = self.tls.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let connect = async move {
                let stream = tcp.await.map_err(|e| ConnectFailure::Tcp(Box::new(e)))?;
                let Some(tls) = tls else {
                    return Ok(MaybeHttpsStream::Http(stream));
                };
                let secured = tls
                    .connector
                    .connect(tls.server_name, TokioIo::new(stream))
                    .await
                    .map_err(ConnectFailure::Tls)?;
                Ok(MaybeHttpsStream::Https(TokioIo::new(secured)))
            };
            tokio::time::timeout(timeout, connect)
                .await
                .unwrap_or(Err(ConnectFailure::TimedOut))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_ca_file_is_named_with_its_problem() {
        let dir = std::env::temp_dir().join(format!("oncely-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let missing = dir.join("missing.pem");
        let err = Tls::new("example.com", Some(&missing)).expect_err("missing");
        assert!(
            err.contains("cannot read") && err.contains("missing.pem"),
            "{err}"
        );

        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let err = Tls::new("example.com", Some(&empty)).expect_err("empty");
        assert!(err.contains("holds no PEM certificate"), "{err}");

        let garbage = dir.join("garbage.pem");
        std::fs::write(
            &garbage,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .expect("write");
        let err = Tls::new("example.com", Some(&garbage)).expect_err("garbage");
        assert!(err.contains("certificate 1"), "{err}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn failures_get_codes_and_are_found_inside_other_errors() {
        let cert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(ConnectFailure::Tls(cert).code(), "tls_certificate");
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(ConnectFailure::Tls(eof).code(), "tls_handshake");
        assert_eq!(ConnectFailure::TimedOut.code(), "connect_timeout");

        #[derive(Debug)]
        struct Outer(ConnectFailure);
        impl fmt::Display for Outer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped = Outer(ConnectFailure::TimedOut);
        assert_eq!(
            ConnectFailure::find(&wrapped).map(ConnectFailure::code),
            Some("connect_timeout")
        );
        assert!(ConnectFailure::find(&std::io::Error::other("x")).is_none());
    }
}
