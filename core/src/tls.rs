//! TLS to Postgres and RabbitMQ: reading the certificate files, and saying in words why
//! a handshake failed.
//!
//! Why one module for both: an operator who sets up TLS for the database and the broker
//! meets the same three problems twice — a CA file that is not there, a server whose
//! certificate the CA does not vouch for, and a host name the certificate does not carry —
//! and should read the same words for them. The drivers (sqlx, lapin) report these as an
//! `io::Error` wrapping a `rustls::Error`; [`TlsFailure::find`] digs it out and names it.
//!
//! The TLS stack is rustls on *ring*, as for the providers (no OpenSSL, no aws-lc).

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError};
use std::error::Error as StdError;
use std::fmt;
use std::path::Path;

/// Why a TLS handshake (or the first read after it) failed, in words for the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsFailure {
    /// The server's certificate is not signed by a CA we trust.
    NotTrusted,
    /// The certificate is valid, but not for the host name we connected to.
    NameMismatch {
        /// The host name (or IP) we checked.
        expected: String,
        /// The names the certificate carries (empty when the driver does not say).
        presented: Vec<String>,
    },
    /// The server's certificate has expired.
    Expired,
    /// The server's certificate is not valid yet (a clock is wrong, or it is brand new).
    NotYetValid,
    /// The server wants a client certificate and we sent none.
    ClientCertificateRequired,
    /// The server refused the client certificate we sent.
    ClientCertificateRejected,
    /// The server does not speak TLS on this port (it said so, or answered in plain text).
    NotTls,
    /// The server closed (or reset) the connection during the handshake or right after
    /// it, without a TLS alert we could read. What servers that require a client
    /// certificate often do: with TLS 1.3 the client finishes its side first, and the
    /// server's alert can be lost in the reset. See [`TlsFailure::closed`].
    Closed,
    /// Anything else rustls reported.
    Other(String),
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotTrusted => f.write_str(
                "certificate not trusted: the server's certificate is not signed by a CA we trust",
            ),
            Self::NameMismatch {
                expected,
                presented,
            } if presented.is_empty() => write!(
                f,
                "host name mismatch: the server's certificate is not valid for {expected:?}"
            ),
            Self::NameMismatch {
                expected,
                presented,
            } => write!(
                f,
                "host name mismatch: the server's certificate is not valid for {expected:?} (it names {})",
                presented.join(", ")
            ),
            Self::Expired => f.write_str("the server's certificate has expired"),
            Self::NotYetValid => {
                f.write_str("the server's certificate is not valid yet (is a clock wrong?)")
            }
            Self::ClientCertificateRequired => {
                f.write_str("the server requires a client certificate and none was sent")
            }
            Self::ClientCertificateRejected => {
                f.write_str("the server refused our client certificate")
            }
            Self::NotTls => f.write_str(
                "the server does not offer TLS on this port; refusing to continue in plain text",
            ),
            Self::Closed => f.write_str(
                "the server closed the connection during or right after the TLS handshake \
                 (a server that requires a client certificate does this to a client without \
                 one, or with one it does not trust)",
            ),
            Self::Other(e) => write!(f, "TLS handshake failed: {e}"),
        }
    }
}

impl TlsFailure {
    /// The TLS failure inside `err`, if any: a `rustls::Error` anywhere in its source
    /// chain, including inside an `io::Error` (whose `source()` skips the error it wraps).
    pub fn find(err: &(dyn StdError + 'static)) -> Option<TlsFailure> {
        let mut next = Some(err);
        while let Some(e) = next {
            if let Some(tls) = e.downcast_ref::<rustls::Error>() {
                return Some(Self::from_rustls(tls));
            }
            if let Some(inner) = e
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                && let Some(found) = Self::find(inner)
            {
                return Some(found);
            }
            next = e.source();
        }
        None
    }

    /// [`TlsFailure::Closed`] for an I/O error that is the peer closing or resetting the
    /// connection; callers use it only where TLS was required and no AMQP or Postgres
    /// answer had come yet.
    pub fn closed(io: &std::io::Error) -> Option<TlsFailure> {
        use std::io::ErrorKind as K;
        matches!(
            io.kind(),
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe
        )
        .then_some(Self::Closed)
    }

    /// Name a rustls error.
    pub fn from_rustls(err: &rustls::Error) -> TlsFailure {
        use rustls::Error as E;
        match err {
            E::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    Self::NotTrusted
                }
                CertificateError::NotValidForNameContext {
                    expected,
                    presented,
                } => Self::NameMismatch {
                    expected: server_name(expected),
                    presented: presented.iter().map(|n| tidy_name(n)).collect(),
                },
                CertificateError::NotValidForName => Self::NameMismatch {
                    expected: String::new(),
                    presented: Vec::new(),
                },
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    Self::Expired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    Self::NotYetValid
                }
                other => Self::Other(format!("invalid server certificate: {other:?}")),
            },
            E::AlertReceived(AlertDescription::CertificateRequired) => {
                Self::ClientCertificateRequired
            }
            // TLS 1.2 has no `certificate_required`: servers say `handshake_failure`.
            E::AlertReceived(AlertDescription::HandshakeFailure) => Self::Other(
                "the server ended the handshake (handshake_failure): it may require a client \
                 certificate, or share no cipher suite with us"
                    .into(),
            ),
            E::AlertReceived(
                AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateRevoked
                | AlertDescription::AccessDenied,
            ) => Self::ClientCertificateRejected,
            // What came back is not a TLS record: the port speaks something else
            // (RabbitMQ answers a ClientHello on its plain port with "AMQP…").
            E::InvalidMessage(_) => Self::NotTls,
            other => Self::Other(other.to_string()),
        }
    }
}

/// webpki lists a certificate's names in their `Debug` form (`DnsName("db.example")`):
/// the bare name reads better.
fn tidy_name(name: &str) -> String {
    name.strip_prefix("DnsName(\"")
        .and_then(|n| n.strip_suffix("\")"))
        .unwrap_or(name)
        .to_owned()
}

fn server_name(name: &rustls::pki_types::ServerName<'_>) -> String {
    match name {
        rustls::pki_types::ServerName::DnsName(d) => d.as_ref().to_owned(),
        rustls::pki_types::ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        other => format!("{other:?}"),
    }
}

/// The CA certificates in a PEM file, for a root store that trusts them alone.
/// Errors name the file and say what is wrong with it.
pub fn roots_from_file(path: &Path) -> Result<rustls::RootCertStore, String> {
    let shown = path.display();
    let text = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in CertificateDer::pem_slice_iter(&text).enumerate() {
        let cert = cert.map_err(|e| format!("{shown}: certificate {} unreadable: {e}", i + 1))?;
        roots
            .add(cert)
            .map_err(|e| format!("{shown}: certificate {} is not a usable CA: {e}", i + 1))?;
    }
    if roots.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    Ok(roots)
}

/// The system's CA bundle (`/etc/ssl/certs`), for servers with publicly issued
/// certificates (managed brokers).
pub fn system_roots() -> Result<rustls::RootCertStore, String> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(format!(
            "no system CA certificates found{why}; install ca-certificates or set a CA file"
        ));
    }
    Ok(roots)
}

/// The certificate chain in a PEM file (a client certificate, then its intermediates).
pub fn certs_from_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let text = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown}: certificate unreadable: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{shown} holds no PEM certificate"));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1; not encrypted).
pub fn key_from_file(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let shown = path.display();
    let text = std::fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            format!("{shown} holds no PEM private key (an encrypted key is not supported)")
        }
        e => format!("{shown}: private key unreadable: {e}"),
    })
}

/// Whether a file can be read now (for start-up checks of paths a driver reads later).
pub fn check_readable(path: &Path) -> Result<(), String> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_are_named_in_words() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                "certificate not trusted",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
                    expected: rustls::pki_types::ServerName::try_from("db.example")
                        .expect("name")
                        .to_owned(),
                    presented: vec!["DnsName(\"other.example\")".into()],
                }),
                "host name mismatch: the server's certificate is not valid for \"db.example\" (it names other.example)",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
                "requires a client certificate",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::UnknownCA),
                "refused our client certificate",
            ),
            (
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                "does not offer TLS",
            ),
        ];
        for (err, words) in cases {
            let text = TlsFailure::from_rustls(&err).to_string();
            assert!(text.contains(words), "{err:?} → {text:?}");
        }
    }

    #[test]
    fn a_rustls_error_is_found_inside_an_io_error() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert_eq!(TlsFailure::find(&io), Some(TlsFailure::NotTrusted));
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(TlsFailure::find(&plain), None);
        assert_eq!(TlsFailure::closed(&plain), None);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(TlsFailure::closed(&reset), Some(TlsFailure::Closed));
        assert!(
            TlsFailure::Closed
                .to_string()
                .contains("client certificate")
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let missing = Path::new("/nonexistent/oncely-ca.pem");
        for err in [
            roots_from_file(missing).map(drop).expect_err("roots"),
            certs_from_file(missing).map(drop).expect_err("certs"),
            key_from_file(missing).map(drop).expect_err("key"),
            check_readable(missing).expect_err("readable"),
        ] {
            assert!(err.contains("/nonexistent/oncely-ca.pem"), "{err}");
        }
    }
}
