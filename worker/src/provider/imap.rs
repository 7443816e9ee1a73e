//! Asking an IMAP archive mailbox whether a message went out: LOGIN, EXAMINE (read
//! only), `SEARCH HEADER Message-ID "<…>"`, LOGOUT — over implicit TLS, STARTTLS or
//! plain TCP.
//!
//! Why a few dozen lines of IMAP instead of a client crate: the lookup needs four
//! commands whose answers carry no literals, and the crates that speak all of IMAP bring
//! their own runtime or TLS choices. This speaks exactly RFC 3501's subset it needs, on
//! the same rustls stack as everything else, and any answer it does not expect is a
//! failed lookup (never "absent").

use std::path::Path;
use std::time::Duration;

use oncely_core::config::{ImapArchive, Security};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;

use super::transport;

/// A byte stream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The archive, ready to be asked.
pub(crate) struct Archive {
    host: String,
    port: u16,
    security: Security,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    username: String,
    password: String,
    mailbox: String,
    connect_timeout: Duration,
    /// How long a message may take to reach the archive.
    pub grace: Duration,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("mailbox", &self.mailbox)
            .finish_non_exhaustive()
    }
}

/// Why a lookup could not answer (a short code).
pub(crate) type Failure = &'static str;

impl Archive {
    /// The archive of `config`, its credentials resolved; errors name the field.
    pub(crate) fn new(
        config: &ImapArchive,
        connect_timeout: Duration,
    ) -> Result<Self, (&'static str, String)> {
        let tls = match config.security {
            Security::None => None,
            Security::Implicit | Security::Starttls => Some(
                transport::rustls_connector(&config.host, config.ca_file.as_deref().map(Path::new))
                    .map_err(|e| ("ca_file", e))?,
            ),
        };
        Ok(Archive {
            host: config.host.clone(),
            port: config.port,
            security: config.security,
            tls,
            username: config.username.resolve().map_err(|e| ("username", e))?,
            password: config.password.resolve().map_err(|e| ("password", e))?,
            mailbox: config.mailbox.clone(),
            connect_timeout,
            grace: config.grace,
        })
    }

    /// Whether a message with this `Message-ID` is in the mailbox.
    pub(crate) async fn contains(&self, message_id: &str) -> Result<bool, Failure> {
        let mut session = self.open().await?;
        let refused = |code: Failure| move |e: Failure| if e == "no" { code } else { e };
        session
            .command(&format!(
                "LOGIN {} {}",
                quote(&self.username),
                quote(&self.password)
            ))
            .await
            .map_err(refused("imap_login_refused"))?;
        session
            .command(&format!("EXAMINE {}", quote(&self.mailbox)))
            .await
            .map_err(refused("imap_no_mailbox"))?;
        let lines = session
            .command(&format!("SEARCH HEADER Message-ID {}", quote(message_id)))
            .await
            .map_err(refused("imap_search_refused"))?;
        let _ = session.command("LOGOUT").await;
        let found = lines
            .iter()
            .filter_map(|l| l.strip_prefix("* SEARCH"))
            .any(|numbers| numbers.split_whitespace().next().is_some());
        Ok(found)
    }

    async fn open(&self) -> Result<Session, Failure> {
        let connect = async {
            let tcp = TcpStream::connect((self.host.as_str(), self.port))
                .await
                .map_err(|_| "imap_connect_failed")?;
            let _ = tcp.set_nodelay(true);
            let stream: Box<dyn Io> = match (&self.tls, self.security) {
                (Some((connector, name)), Security::Implicit) => Box::new(
                    connector
                        .connect(name.clone(), tcp)
                        .await
                        .map_err(|_| "imap_tls_handshake")?,
                ),
                _ => Box::new(tcp),
            };
            let mut session = Session::new(stream);
            session.greeting().await?;
            if let (Some((connector, name)), Security::Starttls) = (&self.tls, self.security) {
                session
                    .command("STARTTLS")
                    .await
                    .map_err(|_| "imap_starttls_refused")?;
                let plain = session.into_inner();
                let secured = connector
                    .connect(name.clone(), plain)
                    .await
                    .map_err(|_| "imap_tls_handshake")?;
                session = Session::new(Box::new(secured));
            }
            Ok(session)
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .unwrap_or(Err("imap_connect_timeout"))
    }
}

/// One IMAP connection: tagged commands, untagged lines collected.
struct Session {
    io: BufReader<Box<dyn Io>>,
    tag: u32,
}

impl Session {
    fn new(io: Box<dyn Io>) -> Self {
        Session {
            io: BufReader::new(io),
            tag: 0,
        }
    }

    fn into_inner(self) -> Box<dyn Io> {
        self.io.into_inner()
    }

    async fn line(&mut self) -> Result<String, Failure> {
        let mut line = String::new();
        match self.io.read_line(&mut line).await {
            Ok(0) | Err(_) => Err("imap_connection_lost"),
            Ok(_) => Ok(line.trim_end().to_owned()),
        }
    }

    async fn greeting(&mut self) -> Result<(), Failure> {
        let line = self.line().await?;
        if line.starts_with("* OK") || line.starts_with("* PREAUTH") {
            Ok(())
        } else {
            Err("imap_bad_greeting")
        }
    }

    /// Sends `command`; its untagged lines, or `"no"` / a failure code.
    async fn command(&mut self, command: &str) -> Result<Vec<String>, Failure> {
        self.tag += 1;
        let tag = format!("a{}", self.tag);
        let io = self.io.get_mut();
        io.write_all(format!("{tag} {command}\r\n").as_bytes())
            .await
            .map_err(|_| "imap_connection_lost")?;
        io.flush().await.map_err(|_| "imap_connection_lost")?;
        let mut untagged = Vec::new();
        loop {
            let line = self.line().await?;
            let Some(status) = line.strip_prefix(&format!("{tag} ")) else {
                untagged.push(line);
                continue;
            };
            return match status.split_whitespace().next() {
                Some("OK") => Ok(untagged),
                Some("NO") => Err("no"),
                _ => Err("imap_bad_command"),
            };
        }
    }
}

/// An IMAP quoted string (RFC 3501 §4.3): `"` and `\` escaped.
fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_escapes_quotes_and_backslashes() {
        assert_eq!(quote("INBOX"), "\"INBOX\"");
        assert_eq!(quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(quote("<v1-ab@mail.test>"), "\"<v1-ab@mail.test>\"");
    }
}
