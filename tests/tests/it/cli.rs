//! The command lines as a person uses them: the key test vector, bulk enqueue with a
//! summary, status, clear errors, and `migrate` creating a database.

use oncely_tests::fleet::{Fleet, SECRET, binary};
use oncely_tests::{TestDb, eventually, server_url, unique_name};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

async fn run(bin: &str, args: &[&str], env: &[(&str, &str)], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(binary(bin))
        .args(args)
        .env_remove("ONCELY_KEY_SECRET")
        .env_remove("ONCELY_KEY_SECRET_FILE")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).await.expect("write");
    drop(input);
    let out = child.wait_with_output().await.expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const VECTOR: &str = r#"{"action_type":"email.send","workflow_id":"case-1842","step":"send_approval_notice","business_object":"application-731","revision":2,"payload":{"account_id":"example-account","amount_minor":125000,"currency":"RUB","business_reference":"application-731"}}"#;

#[tokio::test]
async fn producer_key_prints_the_design_test_vectors_and_refuses_bad_input() {
    let env = [("ONCELY_KEY_SECRET", "test-secret-do-not-use")];
    let (code, out, err) = run("oncely-producer", &["key"], &env, VECTOR).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "v1:df776990f0466ed1f9862063fe0aa224ea08f78c7ecc6e1e8a2786867fbf3ede\nsha256:003e1cb47a383bcc76345f2954cfd442841bb6af6063b76d1c925eb0433ab80e\n"
    );
    let (code, _, err) = run("oncely-producer", &["key"], &[], VECTOR).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("ONCELY_KEY_SECRET_FILE") && err.contains("ONCELY_KEY_SECRET"),
        "{err}"
    );
    let float = VECTOR.replace("\"revision\":2", "\"revision\":2.0");
    let (code, _, err) = run("oncely-producer", &["key"], &env, &float).await;
    assert_eq!(code, 2);
    assert!(
        err.contains("revision") && err.contains("floats are not allowed"),
        "{err}"
    );
    let (code, _, err) = run("oncely-producer", &["key"], &env, "\u{0}\u{ff}").await;
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_enqueues_jsonl_with_a_summary_and_reports_status() {
    let fleet = Fleet::new().await;
    let _w = fleet.worker();
    let mut lines = String::new();
    for n in 0..30 {
        lines.push_str(&format!(
            "{{\"action_type\":\"ticket.create\",\"workflow_id\":\"w\",\"step\":\"s\",\"business_object\":\"o-{n}\",\"revision\":1,\"payload\":{{\"title\":\"t{n}\"}}}}\n"
        ));
    }
    lines.push_str("{\"action_type\":\"ticket.create\",\"workflow_id\":\"w\",\"step\":\"s\",\"business_object\":\"o-0\",\"revision\":1,\"payload\":{\"title\":\"t0\"}}\n");
    lines.push_str("{\"action_type\":\"ticket.create\",\"workflow_id\":\"w\",\"step\":\"s\",\"business_object\":\"o-1\",\"revision\":1,\"payload\":{\"title\":\"other\"}}\n");
    lines.push_str("not json\n");
    let config = fleet.config_path.to_string_lossy().into_owned();
    let env = [("ONCELY_KEY_SECRET", SECRET)];
    let (code, out, err) = run(
        "oncely-producer",
        &["--config", &config, "enqueue", "--jsonl", "--json"],
        &env,
        &lines,
    )
    .await;
    assert!(
        err.contains("enqueued 30, duplicate 1, conflict 1, failed 0, invalid 1"),
        "{err}"
    );
    assert_eq!(code, 2, "invalid lines make the exit code 2");
    assert_eq!(out.lines().count(), 32, "one JSON result per valid line");
    eventually("all 30 tickets", Duration::from_secs(60), || async {
        (fleet.count("succeeded").await == 30).then_some(())
    })
    .await;
    let key = serde_json::from_str::<serde_json::Value>(out.lines().next().expect("line"))
        .expect("json")["key"]
        .as_str()
        .expect("key")
        .to_owned();
    let (code, out, _) = run(
        "oncely-producer",
        &["--config", &config, "status", &key],
        &env,
        "",
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("succeeded") && out.contains(&key), "{out}");
    let (code, _, err) = run(
        "oncely-producer",
        &["--config", &config, "status", "v1:nope"],
        &env,
        "",
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("malformed"), "{err}");
}

#[tokio::test]
async fn migrate_creates_the_database_and_is_idempotent() {
    let name = unique_name("oncely_m");
    let server = server_url();
    let base = server
        .rsplit_once('/')
        .map(|(b, _)| b.to_owned())
        .expect("url");
    let url = format!("{base}/{name}");
    let env = [("DATABASE_URL", url.as_str())];
    let (code, out, err) = run("oncely-worker", &["migrate"], &env, "").await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("created and"), "{out}");
    let (code, out, _) = run("oncely-worker", &["migrate"], &env, "").await;
    assert_eq!(code, 0);
    assert!(out.starts_with("database"), "{out}");
    // Clean up through the harness's drop logic.
    let db = TestDb {
        name: name.clone(),
        url: url.clone(),
        pool: sqlx::PgPool::connect(&url).await.expect("connect"),
    };
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM agent_operations")
        .fetch_one(&db.pool)
        .await
        .expect("table exists");
    assert_eq!(n, 0);
    drop(db);
    let (code, _, err) = run(
        "oncely-worker",
        &["migrate"],
        &[("DATABASE_URL", "postgres://nobody:pw@127.0.0.1:1/x")],
        "",
    )
    .await;
    assert_eq!(code, 1);
    assert!(
        err.contains("127.0.0.1:1") && !err.contains(":pw@"),
        "{err}"
    );
    // Never through a transaction pooler: its lock is a session advisory lock.
    let (code, _, err) = run(
        "oncely-worker",
        &["migrate"],
        &[
            ("DATABASE_URL", url.as_str()),
            ("ONCELY_DATABASE_POOLER", "transaction"),
        ],
        "",
    )
    .await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not through a transaction pooler"), "{err}");
}

/// Only `migrate` changes the schema. `run`, `reconcile` and `admin` on a database that
/// was never migrated, or is one migration behind, refuse to start and say what to do.
#[tokio::test]
async fn processes_refuse_a_database_not_migrated_to_their_version() {
    let name = unique_name("oncely_s");
    let server = server_url();
    let base = server
        .rsplit_once('/')
        .map(|(b, _)| b.to_owned())
        .expect("url");
    let url = format!("{base}/{name}");
    let admin_pool = sqlx::PgPool::connect(&server).await.expect("server");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&admin_pool)
        .await
        .expect("create");
    let db = TestDb {
        name,
        url: url.clone(),
        pool: sqlx::PgPool::connect(&url).await.expect("connect"),
    };
    let versions: Vec<i64> = oncely_core::db::MIGRATOR
        .iter()
        .map(|m| m.version)
        .collect();
    let needed = *versions.last().expect("migrations");
    // No broker to reach: a process that got past the check would retry it for ever.
    // With the key secret: `run` refuses to start without one before it looks at the
    // database (hardening::a_worker_without_a_key_secret_refuses_to_start).
    let env = [
        ("DATABASE_URL", url.as_str()),
        ("ONCELY_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f"),
        ("ONCELY_KEY_SECRET", SECRET),
    ];
    let refuses = |args: &'static [&'static str], found: String| async move {
        let (code, _, err) = tokio::time::timeout(
            Duration::from_secs(60),
            run("oncely-worker", args, &env, ""),
        )
        .await
        .unwrap_or_else(|_| panic!("{args:?} kept running on an unmigrated database"));
        assert_ne!(code, 0, "{args:?}: {err}");
        let want = format!(
            "database schema is at version {found}, this binary needs {needed}: run `oncely-worker migrate`"
        );
        assert!(err.contains(&want), "{args:?}: {err}");
    };
    refuses(&["run"], "none".into()).await;
    refuses(&["reconcile"], "none".into()).await;
    refuses(&["admin", "ops", "list"], "none".into()).await;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = 'agent_operations'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("catalog");
    assert_eq!(n, 0, "nothing was migrated by run, reconcile or admin");

    let (code, _, err) = run("oncely-worker", &["migrate"], &env, "").await;
    assert_eq!(code, 0, "{err}");
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(&db.pool)
    .await
    .expect("one migration back");
    let older = if versions.len() > 1 {
        versions[versions.len() - 2].to_string()
    } else {
        "none".into()
    };
    refuses(&["run"], older.clone()).await;
    refuses(&["reconcile"], older).await;
}
