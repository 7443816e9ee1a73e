//! Real mail servers for one test: a private Postfix (SMTP, STARTTLS, AUTH through
//! Dovecot) and a private Dovecot (IMAP with STARTTLS, and Postfix's SASL), from
//! Debian's `postfix` and `dovecot-imapd` (`scripts/test` installs them), each with its
//! own configuration, queue, mailboxes and ports under a temporary directory, and a
//! certificate from a CA made for the test. Postfix copies every message to the
//! `archive` mailbox (`always_bcc`), which is what oncely's IMAP lookup searches.
//!
//! Two SMTP ports: `submission` (STARTTLS and AUTH required, as a relay for agents
//! would be) and `trusted` (plain, no AUTH, for 127.0.0.1 only — the port a
//! [`CutAfterData`] proxy sits in front of, since a proxy cannot see into TLS).
//!
//! Needs root (Postfix's daemons drop to the `postfix` user, as on a server).

use crate::tls::TestCa;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

/// The domain the servers accept mail for.
pub const DOMAIN: &str = "oncely.test";
/// The SMTP AUTH user and password oncely uses.
pub const SMTP_USER: (&str, &str) = ("oncely", "smtp-pass");
/// The archive mailbox's IMAP login.
pub const ARCHIVE_USER: (&str, &str) = ("archive", "archive-pass");
/// `uid:gid` owning the mailboxes (Debian's `nobody`).
const MAIL_OWNER: &str = "65534:65534";

/// Running Postfix and Dovecot, stopped when dropped.
#[derive(Debug)]
pub struct MailServer {
    dir: PathBuf,
    postfix: Child,
    dovecot: Child,
    /// SMTP with STARTTLS and AUTH required.
    pub submission: u16,
    /// Plain SMTP without AUTH (127.0.0.1 only).
    pub trusted: u16,
    /// Plain SMTP without AUTH that takes one message a minute from a client and answers
    /// the next with a 4xx (postfix's `smtpd_client_message_rate_limit`, counted by anvil):
    /// a mail server that throttles.
    pub throttled: u16,
    /// IMAP (STARTTLS required).
    pub imap: u16,
    /// The CA whose certificate both servers present (`ca_file` for oncely).
    pub ca: TestCa,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("free port: {e}"))
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

fn chown(owner: &str, path: &Path) {
    let ok = std::process::Command::new("chown")
        .args(["-R", owner])
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "chown {owner} {} (the mail tests need root)",
        path.display()
    );
}

impl MailServer {
    /// Configures and starts both, and waits until each greets.
    pub async fn start() -> MailServer {
        let dir = std::env::temp_dir().join(crate::unique_name("mail"));
        let conf = dir.join("conf");
        for sub in [
            "conf",
            "queue",
            "data",
            "mail",
            "dovecot-run",
            "dovecot-state",
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap_or_else(|e| panic!("{e}"));
        }
        let ca = TestCa::new(&conf, "ca");
        let (cert, key) = ca.server_pem(&["localhost", "127.0.0.1"]);
        write(&conf.join("cert.pem"), &cert);
        write(&conf.join("key.pem"), &key);
        let (submission, trusted, throttled, imap, auth) = (
            free_port(),
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        );
        write(&conf.join("main.cf"), &postfix_main(&dir, auth));
        write(
            &conf.join("master.cf"),
            &postfix_master(submission, trusted, throttled),
        );
        write(
            &conf.join("vmailbox"),
            &format!("alice@{DOMAIN} alice/\narchive@{DOMAIN} archive/\n"),
        );
        write(&conf.join("users"), &dovecot_users(&dir));
        write(&conf.join("dovecot.conf"), &dovecot_conf(&dir, imap, auth));
        chown("postfix:postfix", &dir.join("data"));
        chown(MAIL_OWNER, &dir.join("mail"));
        let log =
            |name: &str| std::fs::File::create(dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        let dovecot = Command::new("dovecot")
            .args(["-F", "-c"])
            .arg(conf.join("dovecot.conf"))
            .stdout(log("dovecot.out"))
            .stderr(log("dovecot.err"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("dovecot (scripts/test installs dovecot-imapd): {e}"));
        let postfix = Command::new("postfix")
            .arg("-c")
            .arg(&conf)
            .arg("start-fg")
            .stdin(Stdio::null())
            .stdout(log("postfix.log"))
            .stderr(log("postfix.err"))
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("postfix (scripts/test installs postfix): {e}"));
        let server = MailServer {
            dir,
            postfix,
            dovecot,
            submission,
            trusted,
            throttled,
            imap,
            ca,
        };
        for (port, greeting) in [
            (submission, "220"),
            (trusted, "220"),
            (throttled, "220"),
            (imap, "* OK"),
        ] {
            crate::eventually(
                &format!("the mail server greets on {port}"),
                Duration::from_secs(60),
                || greets(port, greeting),
            )
            .await;
        }
        server
    }

    /// The files of a mailbox (`alice`, `archive`): one per delivered message.
    pub fn messages(&self, user: &str) -> Vec<String> {
        let mut found = Vec::new();
        for sub in ["new", "cur"] {
            let Ok(entries) = std::fs::read_dir(self.dir.join("mail").join(user).join(sub)) else {
                continue;
            };
            for entry in entries.flatten() {
                if let Ok(text) = std::fs::read_to_string(entry.path()) {
                    found.push(text);
                }
            }
        }
        found
    }

    /// What Postfix logged.
    pub fn postfix_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postfix.log")).unwrap_or_default()
    }
}

impl Drop for MailServer {
    fn drop(&mut self) {
        // `start-fg` runs master under a script: stop master itself, then the children.
        let _ = std::process::Command::new("postfix")
            .arg("-c")
            .arg(self.dir.join("conf"))
            .arg("abort")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.postfix.start_kill();
        let _ = self.dovecot.start_kill();
    }
}

async fn greets(port: u16, greeting: &str) -> Option<()> {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let mut line = String::new();
    let mut reader = BufReader::new(stream);
    let read = reader.read_line(&mut line);
    tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .ok()?
        .ok()?;
    line.starts_with(greeting).then_some(())
}

fn postfix_main(dir: &Path, auth: u16) -> String {
    let d = dir.display();
    format!(
        "compatibility_level = 3.6\n\
         queue_directory = {d}/queue\n\
         data_directory = {d}/data\n\
         mail_owner = postfix\n\
         setgid_group = postdrop\n\
         myhostname = mail.{DOMAIN}\n\
         mydomain = {DOMAIN}\n\
         mydestination =\n\
         inet_interfaces = 127.0.0.1\n\
         inet_protocols = ipv4\n\
         mynetworks = 127.0.0.0/8\n\
         virtual_mailbox_domains = {DOMAIN}\n\
         virtual_mailbox_base = {d}/mail\n\
         virtual_mailbox_maps = texthash:{d}/conf/vmailbox\n\
         virtual_minimum_uid = 100\n\
         virtual_uid_maps = static:65534\n\
         virtual_gid_maps = static:65534\n\
         always_bcc = archive@{DOMAIN}\n\
         smtpd_tls_cert_file = {d}/conf/cert.pem\n\
         smtpd_tls_key_file = {d}/conf/key.pem\n\
         smtpd_tls_security_level = may\n\
         smtpd_sasl_type = dovecot\n\
         smtpd_sasl_path = inet:127.0.0.1:{auth}\n\
         maillog_file = /dev/stdout\n\
         smtputf8_enable = no\n\
         biff = no\n"
    )
}

fn postfix_master(submission: u16, trusted: u16, throttled: u16) -> String {
    let services = "\
pickup    unix  n - n 60 1 pickup
cleanup   unix  n - n - 0 cleanup
qmgr      unix  n - n 300 1 qmgr
tlsmgr    unix  - - n 1000? 1 tlsmgr
rewrite   unix  - - n - - trivial-rewrite
bounce    unix  - - n - 0 bounce
defer     unix  - - n - 0 bounce
trace     unix  - - n - 0 bounce
verify    unix  - - n - 1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n - - proxymap
smtp      unix  - - n - - smtp
relay     unix  - - n - - smtp
showq     unix  n - n - - showq
error     unix  - - n - - error
retry     unix  - - n - - error
discard   unix  - - n - - discard
virtual   unix  - n n - - virtual
anvil     unix  - - n - 1 anvil
scache    unix  - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
";
    format!(
        "127.0.0.1:{submission} inet n - n - - smtpd\n  \
           -o smtpd_tls_security_level=encrypt\n  \
           -o smtpd_sasl_auth_enable=yes\n  \
           -o smtpd_tls_auth_only=yes\n  \
           -o smtpd_relay_restrictions=permit_sasl_authenticated,reject\n  \
           -o smtpd_recipient_restrictions=permit_sasl_authenticated,reject\n\
         127.0.0.1:{trusted} inet n - n - - smtpd\n  \
           -o smtpd_relay_restrictions=permit_mynetworks,reject\n  \
           -o smtpd_recipient_restrictions=permit_mynetworks,reject\n\
         127.0.0.1:{throttled} inet n - n - - smtpd\n  \
           -o smtpd_relay_restrictions=permit_mynetworks,reject\n  \
           -o smtpd_recipient_restrictions=permit_mynetworks,reject\n  \
           -o smtpd_client_message_rate_limit=1\n  \
           -o smtpd_client_event_limit_exceptions=\n\
         {services}"
    )
}

fn dovecot_users(dir: &Path) -> String {
    let d = dir.display();
    let (smtp, smtp_pass) = SMTP_USER;
    let (archive, archive_pass) = ARCHIVE_USER;
    format!(
        "alice:{{PLAIN}}alice-pass:65534:65534::{d}/mail/alice\n\
         {archive}:{{PLAIN}}{archive_pass}:65534:65534::{d}/mail/{archive}\n\
         {smtp}:{{PLAIN}}{smtp_pass}:65534:65534::{d}/mail/{smtp}\n"
    )
}

fn dovecot_conf(dir: &Path, imap: u16, auth: u16) -> String {
    let d = dir.display();
    format!(
        "base_dir = {d}/dovecot-run\n\
         state_dir = {d}/dovecot-state\n\
         protocols = imap\n\
         listen = 127.0.0.1\n\
         log_path = {d}/dovecot.log\n\
         ssl = required\n\
         ssl_cert = <{d}/conf/cert.pem\n\
         ssl_key = <{d}/conf/key.pem\n\
         disable_plaintext_auth = yes\n\
         auth_mechanisms = plain login\n\
         mail_location = maildir:{d}/mail/%n\n\
         first_valid_uid = 100\n\
         passdb {{\n  driver = passwd-file\n  args = scheme=PLAIN username_format=%n {d}/conf/users\n}}\n\
         userdb {{\n  driver = passwd-file\n  args = username_format=%n {d}/conf/users\n}}\n\
         service imap-login {{\n  inet_listener imap {{\n    address = 127.0.0.1\n    port = {imap}\n  }}\n  inet_listener imaps {{\n    port = 0\n  }}\n}}\n\
         service auth {{\n  inet_listener {{\n    address = 127.0.0.1\n    port = {auth}\n  }}\n}}\n\
         service stats {{\n  unix_listener stats-reader {{\n    mode = 0666\n  }}\n  unix_listener stats-writer {{\n    mode = 0666\n  }}\n}}\n"
    )
}

/// A TCP proxy in front of an SMTP server that cuts the client off right after the
/// client's final `.` of a message has been passed on — before the server's reply can
/// reach it: the connection lost after DATA that makes an outcome *unknown* (RFC 1047).
/// The server still gets the whole message and answers into the void.
#[derive(Debug)]
pub struct CutAfterData {
    /// Where clients connect.
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl CutAfterData {
    /// A proxy to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> CutAfterData {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("proxy: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(cut_after_data(client, upstream));
            }
        });
        CutAfterData { port, task }
    }
}

impl Drop for CutAfterData {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn cut_after_data(client: TcpStream, upstream: u16) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // Server → client until the cut.
    let (cut_tx, mut cut_rx) = tokio::sync::oneshot::channel::<()>();
    let down = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            tokio::select! {
                read = server_read.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => if client_write.write_all(&buf[..n]).await.is_err() { return },
                },
                _ = &mut cut_rx => {
                    // Drop the client's side; read the server's reply into the void.
                    drop(client_write);
                    let _ = tokio::time::timeout(Duration::from_secs(10), server_read.read(&mut buf)).await;
                    return;
                }
            }
        }
    });
    // Client → server, watching for DATA and then the end of the message.
    let mut seen = Vec::new();
    let mut in_data = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = match client_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if server_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if !in_data && seen.windows(6).any(|w| w.eq_ignore_ascii_case(b"DATA\r\n")) {
            in_data = true;
            seen.clear();
        } else if in_data && seen.windows(5).any(|w| w == b"\r\n.\r\n") {
            let _ = cut_tx.send(());
            break;
        }
    }
    let _ = down.await;
}
