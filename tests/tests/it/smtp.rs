//! `kind = "smtp"` against real mail servers: a private Postfix (STARTTLS, AUTH through
//! Dovecot, a copy of every message to an archive mailbox) and a private Dovecot (IMAP,
//! STARTTLS), with a CA made for the test — through real worker and reconciler processes.

use oncely_core::config::{
    Config, ImapArchive, ProviderConfig, Security, SmtpProviderConfig, ValueSource,
};
use oncely_core::{IdempotencyKey, Intent};
use oncely_tests::eventually;
use oncely_tests::fleet::{FAST_RECONCILER, Fleet, FleetOptions, secret};
use oncely_tests::mail::{ARCHIVE_USER, CutAfterData, DOMAIN, MailServer, SMTP_USER};
use serde_json::json;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);
/// Emails through the proxy that cuts the connection after DATA.
const CUT_ACTION: &str = "email.notify";

/// What [`mail_providers`] (a plain `fn`) needs: ports, the CA, the password file.
struct Setup {
    submission: u16,
    proxy: u16,
    imap: u16,
    ca_file: PathBuf,
    password_file: PathBuf,
}

static SETUP: OnceLock<Setup> = OnceLock::new();

fn smtp(host: &str, port: u16, security: Security, s: &Setup) -> SmtpProviderConfig {
    SmtpProviderConfig {
        host: host.into(),
        port,
        security,
        ca_file: (security != Security::None).then(|| s.ca_file.clone()),
        username: None,
        password: None,
        hello_name: "worker.oncely.test".into(),
        from: format!("Billing <billing@{DOMAIN}>"),
        to: "{/to}".into(),
        subject: "{/subject}".into(),
        text: "{/body}".into(),
        message_id_domain: DOMAIN.into(),
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(5),
        key_retention: Some(Duration::from_secs(24 * 3600)),
        archive: Some(ImapArchive {
            host: "localhost".into(),
            port: s.imap,
            security: Security::Starttls,
            ca_file: Some(s.ca_file.clone()),
            username: ValueSource::Literal(ARCHIVE_USER.0.into()),
            password: ValueSource::Literal(ARCHIVE_USER.1.into()),
            mailbox: "INBOX".into(),
            grace: Duration::from_secs(60),
        }),
        rate_limit: None,
    }
}

/// `mail`: the submission port, STARTTLS, AUTH with the password from a file;
/// `mail_cut`: the plain port behind the proxy that cuts after DATA.
fn mail_providers(config: &mut Config) {
    let s = SETUP.get().expect("set before the fleet");
    let mut mail = smtp("localhost", s.submission, Security::Starttls, s);
    mail.username = Some(ValueSource::Literal(SMTP_USER.0.into()));
    mail.password = Some(ValueSource::File {
        path: s.password_file.clone(),
        prefix: String::new(),
    });
    config
        .providers
        .insert("mail".into(), ProviderConfig::Smtp(mail));
    let cut = smtp("127.0.0.1", s.proxy, Security::None, s);
    config
        .providers
        .insert("mail_cut".into(), ProviderConfig::Smtp(cut));
    let mut policy = config.actions["email.send"].clone();
    policy.provider = "mail_cut".into();
    config.actions.insert(CUT_ACTION.into(), policy);
}

fn email(action: &str, n: usize) -> Intent {
    Intent::from_json(json!({
        "action_type": action, "workflow_id": "onboarding", "step": "welcome",
        "business_object": format!("user-{n}"), "revision": 1,
        "payload": {"to": format!("alice@{DOMAIN}"), "subject": format!("Welcome {n}"),
                    "body": format!("Hello number {n}.")}
    }))
    .expect("intent")
}

fn key_of(intent: &Intent) -> IdempotencyKey {
    intent.clone().seal(&secret()).expect("seal").key
}

fn message_id(key: &IdempotencyKey) -> String {
    format!("<{}@{DOMAIN}>", key.as_str().replace(':', "-"))
}

/// One test, two acts (one pair of servers): emails sent once each over STARTTLS with
/// AUTH although every intent comes twice; then a connection cut after DATA — unknown —
/// settled by the reconciler finding the message in the archive over IMAP, with exactly
/// one copy in the recipient's mailbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emails_go_out_once_and_a_lost_reply_after_data_is_found_in_the_archive() {
    let mail = MailServer::start().await;
    let proxy = CutAfterData::start(mail.trusted).await;
    let dir = std::env::temp_dir().join(oncely_tests::unique_name("smtp"));
    std::fs::create_dir_all(&dir).expect("dir");
    let password_file = dir.join("smtp_password");
    std::fs::write(&password_file, format!("{}\n", SMTP_USER.1)).expect("password file");
    let setup = Setup {
        submission: mail.submission,
        proxy: proxy.port,
        imap: mail.imap,
        ca_file: mail.ca.ca_file().to_owned(),
        password_file,
    };
    assert!(SETUP.set(setup).is_ok(), "one smtp test per process");
    let fleet = Fleet::with(FleetOptions {
        configure: Some(mail_providers),
        reconciler: Some(FAST_RECONCILER),
        ..FleetOptions::default()
    })
    .await;
    let _procs = [fleet.worker(), fleet.worker(), fleet.reconciler()];

    // Act 1: four emails, each enqueued by two producers at once.
    let n = 4;
    let emails: Vec<Intent> = (0..n).map(|i| email("email.send", i)).collect();
    let new = fleet.enqueue_from_two(emails.clone(), emails.clone()).await;
    assert_eq!(new, n);
    eventually("every email sent", DEADLINE, || async {
        (fleet.count("succeeded").await == n as i64).then_some(())
    })
    .await;
    eventually("every email delivered", DEADLINE, || async {
        (mail.messages("alice").len() == n).then_some(())
    })
    .await;
    let inbox = mail.messages("alice");
    for intent in &emails {
        let key = key_of(intent);
        let copies = inbox
            .iter()
            .filter(|m| m.contains(&format!("Message-ID: {}", message_id(&key))))
            .count();
        assert_eq!(copies, 1, "{key}: one message, with the derived Message-ID");
        assert!(
            inbox
                .iter()
                .any(|m| m.contains(&format!("X-Oncely-Key: {key}"))),
            "{key}: the key travels in X-Oncely-Key"
        );
        let op = fleet.op(&key).await.expect("row");
        assert_eq!(op.provider_operation_id, Some(message_id(&key)));
    }
    assert!(
        mail.postfix_log().contains("starttls=1 auth=1"),
        "the submission port was used with STARTTLS and AUTH"
    );

    // Act 2: the proxy cuts the connection right after the final "." — Postfix has the
    // message, the worker has no reply: unknown. The reconciler asks the archive.
    let cut = email(CUT_ACTION, 100);
    let key = key_of(&cut);
    fleet.producer().await.enqueue(cut).await.expect("enqueue");
    eventually("the cut email settled", DEADLINE, || async {
        (fleet.count("succeeded").await == n as i64 + 1).then_some(())
    })
    .await;
    let events: Vec<(String, String)> = sqlx::query_as(
        "SELECT to_status, actor FROM operation_events WHERE idempotency_key = $1 ORDER BY id",
    )
    .bind(key.as_str())
    .fetch_all(&fleet.db.pool)
    .await
    .expect("events");
    let statuses: Vec<&str> = events.iter().map(|(s, _)| s.as_str()).collect();
    assert!(
        statuses.ends_with(&["executing", "unknown", "succeeded"]),
        "went unknown, then was settled: {events:?}"
    );
    let op = fleet.op(&key).await.expect("row");
    assert_eq!(op.attempt_count, 1, "never sent twice");
    assert_eq!(op.provider_operation_id, Some(message_id(&key)));
    eventually("the cut email delivered", DEADLINE, || async {
        (mail.messages("alice").len() == n + 1).then_some(())
    })
    .await;
    let copies = mail
        .messages("alice")
        .iter()
        .filter(|m| m.contains(&message_id(&key)))
        .count();
    assert_eq!(copies, 1, "exactly one message in the recipient's mailbox");
}

/// A real mail server over its rate (postfix's `smtpd_client_message_rate_limit`): the
/// first message goes out, the next is answered with a 4xx before it is taken — a
/// throttle (deferred, the attempt not spent), never a plain "not sent" or an unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mail_server_over_its_rate_throttles_and_takes_nothing() {
    use oncely_worker::provider::{Call, Outcome, Provider, SmtpProvider};
    let mail = MailServer::start().await;
    let setup = Setup {
        submission: mail.submission,
        proxy: mail.trusted,
        imap: mail.imap,
        ca_file: mail.ca.ca_file().to_owned(),
        password_file: PathBuf::new(),
    };
    let config = smtp("127.0.0.1", mail.throttled, Security::None, &setup);
    let provider = SmtpProvider::new("mail_limited", &config).expect("provider");
    let mut outcomes = Vec::new();
    for n in 0..2 {
        let intent = email("email.send", 100 + n);
        let key = key_of(&intent);
        let outcome = provider
            .execute(Call {
                key: &key,
                action_type: "email.send",
                payload: &intent.payload,
                first_attempt_at: None,
            })
            .await;
        outcomes.push(outcome);
    }
    assert!(
        matches!(outcomes[0], Outcome::Succeeded { .. }),
        "{outcomes:?}"
    );
    match &outcomes[1] {
        Outcome::Throttled { code, retry_after } => {
            assert!(
                ["smtp_421", "smtp_450", "smtp_451", "smtp_452"].contains(&code.as_str()),
                "{code}"
            );
            assert_eq!(*retry_after, None, "SMTP says no Retry-After");
        }
        other => panic!("the second message must be throttled: {other:?}"),
    }
    eventually("the first message delivered", DEADLINE, || async {
        (mail.messages("alice").len() == 1).then_some(())
    })
    .await;
    assert_eq!(
        mail.messages("alice").len(),
        1,
        "the throttled one was not taken"
    );
}
