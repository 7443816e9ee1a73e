//! A certificate authority made for one test (rcgen), and rustls server configs with
//! certificates it signs — current, expired, or for another host — for the sandbox's TLS
//! listener. The CA's certificate is written to `ca.pem` in the test's directory, which
//! is what a provider's `ca_file` points at. It also signs the server certificates of
//! private Postgres and RabbitMQ servers (PEM files) and client certificates.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// When a server certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// From 2020 to 2099.
    Current,
    /// From 2020 to 2021.
    Expired,
}

/// A test CA whose certificate is in `dir/ca.pem`.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    ca_file: PathBuf,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/NAME.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("oncely test CA {name}"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let issuer =
            CertifiedIssuer::self_signed(params, key).unwrap_or_else(|e| panic!("CA cert: {e}"));
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        let ca_file = dir.join(format!("{name}.pem"));
        std::fs::write(&ca_file, issuer.pem()).unwrap_or_else(|e| panic!("{e}"));
        TestCa { issuer, ca_file }
    }

    /// The PEM file with this CA's certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A certificate for `names` signed by this CA and its key, both PEM: for servers
    /// that read files (Postfix, Dovecot).
    pub fn server_pem(&self, names: &[&str]) -> (String, String) {
        let (cert, key) = self.issue(names, Validity::Current);
        (cert.pem(), key.serialize_pem())
    }

    /// A client certificate whose subject CN is `common_name` (Postgres' `cert` auth
    /// takes the user name from it) and its key, written as `dir/NAME.pem` and
    /// `dir/NAME.key`: the paths a client's `cert_file` / `sslcert` and `key_file` /
    /// `sslkey` point at.
    pub fn client_files(&self, dir: &Path, name: &str, common_name: &str) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2099, 12, 31);
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("client key: {e}"));
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("client cert: {e}"));
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        let (cert_file, key_file) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key_file, key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        (cert_file, key_file)
    }

    /// This CA's certificate, PEM (for a server's `ssl_ca_file` / `cacertfile`).
    pub fn ca_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (DNS names or IPs) and its key.
    fn issue(&self, names: &[&str], validity: Validity) -> (rcgen::Certificate, KeyPair) {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap_or_else(|e| panic!("{e}"));
        params
            .distinguished_name
            .push(DnType::CommonName, "oncely test server");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = match validity {
            Validity::Current => rcgen::date_time_ymd(2099, 12, 31),
            Validity::Expired => rcgen::date_time_ymd(2021, 1, 1),
        };
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("server key: {e}"));
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("server cert: {e}"));
        (cert, key)
    }

    /// A server config presenting a certificate for `names` (DNS names or IPs) signed
    /// by this CA, valid or expired.
    pub fn server_config(&self, names: &[&str], validity: Validity) -> Arc<rustls::ServerConfig> {
        let (cert, key) = self.issue(names, validity);
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap_or_else(|e| panic!("server config: {e}"));
        Arc::new(config)
    }
}
