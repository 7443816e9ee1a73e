//! The `oncely-producer` command: compute keys, enqueue intents, read status.
//!
//! Exit codes: 0 all done (duplicates count as done); 1 an error (nothing or part
//! done, see the summary); 2 bad usage or invalid input; 3 a conflict was refused.

use crate::{Enqueued, Producer};
use clap::{Parser, Subcommand};
use oncely_core::config::Config;
use oncely_core::{IdempotencyKey, Intent, KeyRing};
use std::io::{Read, Write};
use std::path::PathBuf;

/// Enqueue AI agents' actions so they happen once.
#[derive(Debug, Parser)]
#[command(
    name = "oncely-producer",
    version,
    about,
    long_about = "Enqueue AI agents' actions so they happen once.\n\n\
An intent is a JSON object: {\"action_type\": \"email.send\", \"workflow_id\": \"case-1842\", \"step\": \"send_approval_notice\", \
\"business_object\": \"application-731\", \"revision\": 2, \"tenant\": null, \"payload\": {...}}. The idempotency key is derived from \
everything but the payload, so the same intent always gets the same key.\n\n\
The key secret comes from ONCELY_KEY_SECRETS_FILE (a key ring), ONCELY_KEY_SECRET_FILE (a file) or ONCELY_KEY_SECRET; \
payloads are sealed with the current key of ONCELY_DATA_KEYS_FILE when it is set (docs/security.md). Postgres from DATABASE_URL, RabbitMQ from ONCELY_AMQP_URL."
)]
pub struct Cli {
    /// Config file (TOML); default: the built-in config (sandbox providers on localhost).
    #[arg(long, global = true, env = "ONCELY_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the idempotency key and payload hash of an intent (no database, no broker).
    Key {
        /// Intent JSON file; `-` or absent: stdin.
        file: Option<PathBuf>,
    },
    /// Record and publish one intent (a JSON file) or many (`--jsonl`, one per line).
    Enqueue {
        /// Intent file; `-` or absent: stdin.
        file: Option<PathBuf>,
        /// The input holds one intent per line.
        #[arg(long)]
        jsonl: bool,
        /// Print each result as a JSON line on stdout.
        #[arg(long)]
        json: bool,
        /// Record now, deliver no earlier than this (RFC 3339, e.g. `2026-12-08T09:00:00Z`).
        #[arg(long, value_parser = parse_time)]
        not_before: Option<chrono::DateTime<chrono::Utc>>,
        /// Not started by then: `expired`, never sent (RFC 3339).
        #[arg(long, value_parser = parse_time)]
        expires_at: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Show an operation's status.
    Status {
        /// The idempotency key (`v1:…`).
        key: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Wait for an operation to reach a terminal state.
    Wait {
        /// The idempotency key (`v1:…`).
        key: String,
        /// Give up after this long (e.g. `30s`).
        #[arg(long, default_value = "30s")]
        timeout: String,
    },
}

fn read_input(file: &Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    match file {
        Some(p) if p.as_os_str() != "-" => {
            buf =
                std::fs::read(p).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", p.display()))?
        }
        _ => {
            std::io::stdin().read_to_end(&mut buf)?;
        }
    }
    Ok(buf)
}

/// Run the CLI; returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let secret = || KeyRing::from_env().map_err(|e| anyhow::anyhow!("{e}"));
    match cli.command {
        Command::Key { file } => {
            let intent = match Intent::from_slice(&read_input(&file)?) {
                Ok(i) => i,
                Err(e) => {
                    eprintln!("error: invalid intent: {e}");
                    return Ok(2);
                }
            };
            let env = intent.seal(&secret()?)?;
            println!("{}", env.key);
            println!("{}", env.payload_hash);
            Ok(0)
        }
        Command::Enqueue {
            file,
            jsonl,
            json,
            not_before,
            expires_at,
        } => {
            let input = read_input(&file)?;
            let config = Config::load(cli.config.as_deref())?;
            let producer = Producer::connect(&config, secret()?).await?;
            if not_before.is_some() || expires_at.is_some() {
                let asked = crate::Asked {
                    not_before,
                    expires_at,
                    caller: None,
                };
                let intents = if jsonl {
                    input
                        .split(|b| *b == b'\n')
                        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
                        .map(Intent::from_slice)
                        .collect::<Result<Vec<_>, _>>()
                } else {
                    Intent::from_slice(&input).map(|i| vec![i])
                };
                let intents = match intents {
                    Ok(i) => i,
                    Err(e) => {
                        eprintln!("error: invalid intent: {e}");
                        return Ok(2);
                    }
                };
                let asked = vec![asked; intents.len()];
                let mut code = 0;
                for r in producer.enqueue_many_asked(intents, &asked).await? {
                    code = code.max(report_one(r, json));
                }
                return Ok(code);
            }
            if !jsonl {
                let intent = match Intent::from_slice(&input) {
                    Ok(i) => i,
                    Err(e) => {
                        eprintln!("error: invalid intent: {e}");
                        return Ok(2);
                    }
                };
                let r = producer.enqueue(intent).await;
                return Ok(report_one(r, json));
            }
            enqueue_lines(&producer, &input, json).await
        }
        Command::Status { key, json } => {
            let key = IdempotencyKey::parse(&key)?;
            let config = Config::load(cli.config.as_deref())?;
            let db = oncely_core::db::connect_checked_as(
                &config.database_url,
                &oncely_core::db::PoolSettings::for_config(&config),
                oncely_core::roles::Process::Producer,
            )
            .await?;
            let journal = oncely_core::journal::Journal::on(db);
            match journal.get_without_payload(&key).await? {
                None => {
                    eprintln!("no operation with key {key}");
                    Ok(1)
                }
                Some(op) if json => {
                    println!("{}", serde_json::to_string_pretty(&op)?);
                    Ok(0)
                }
                Some(op) => {
                    println!("key         {}", op.key);
                    println!("action      {}", op.action_type);
                    println!("workflow    {} / {}", op.workflow_id, op.step);
                    println!("status      {}", op.status);
                    println!("attempts    {}", op.attempt_count);
                    println!(
                        "provider id {}",
                        op.provider_operation_id.as_deref().unwrap_or("-")
                    );
                    println!(
                        "last error  {}",
                        op.last_error_code.as_deref().unwrap_or("-")
                    );
                    println!("updated     {}", op.updated_at);
                    Ok(0)
                }
            }
        }
        Command::Wait { key, timeout } => {
            let key = IdempotencyKey::parse(&key)?;
            let timeout = oncely_core::config::parse_duration(&timeout)
                .map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
            let config = Config::load(cli.config.as_deref())?;
            let producer = Producer::connect(&config, secret()?).await?;
            match producer.wait(&key, timeout).await? {
                Some(op) => {
                    println!("{}", serde_json::to_string_pretty(&op)?);
                    Ok(0)
                }
                None => {
                    eprintln!("not terminal after {timeout:?}");
                    Ok(1)
                }
            }
        }
    }
}

/// An RFC 3339 time (`2026-12-08T09:00:00Z`, `2026-12-08T10:00:00+01:00`).
fn parse_time(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}), e.g. 2026-12-08T09:00:00Z"))
}

fn report_one(r: Result<Enqueued, crate::ProducerError>, json: bool) -> i32 {
    match r {
        Ok(e) => {
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            } else {
                match &e {
                    Enqueued::Enqueued { key, status }
                        if *status == oncely_core::Status::Planned =>
                    {
                        println!("enqueued {key}")
                    }
                    Enqueued::Enqueued { key, status } => println!("enqueued {key} ({status})"),
                    Enqueued::Duplicate { key, status, .. } => {
                        println!("duplicate {key} ({status})")
                    }
                    Enqueued::Conflict { key, .. } => {
                        println!("conflict {key}: the key exists with another payload")
                    }
                }
            }
            if matches!(e, Enqueued::Conflict { .. }) {
                3
            } else {
                0
            }
        }
        Err(crate::ProducerError::Invalid(e)) => {
            eprintln!("error: invalid intent: {e}");
            2
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}

async fn enqueue_lines(producer: &Producer, input: &[u8], json: bool) -> anyhow::Result<i32> {
    const BATCH: usize = 1000;
    let lines: Vec<&[u8]> = input
        .split(|b| *b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .collect();
    let total = lines.len();
    let (mut enq, mut dup, mut conflict, mut failed, mut invalid) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    let mut stderr = std::io::stderr();
    let started = std::time::Instant::now();
    for (chunk_no, chunk) in lines.chunks(BATCH).enumerate() {
        let mut intents = Vec::with_capacity(chunk.len());
        for (j, line) in chunk.iter().enumerate() {
            match Intent::from_slice(line) {
                Ok(i) => intents.push(i),
                Err(e) => {
                    invalid += 1;
                    eprintln!("line {}: invalid intent: {e}", chunk_no * BATCH + j + 1);
                }
            }
        }
        for r in producer.enqueue_many(intents).await? {
            match &r {
                Ok(Enqueued::Enqueued { .. }) => enq += 1,
                Ok(Enqueued::Duplicate { .. }) => dup += 1,
                Ok(Enqueued::Conflict { key, .. }) => {
                    conflict += 1;
                    eprintln!("conflict: {key} exists with another payload");
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("failed: {e}");
                }
            }
            if json && let Ok(e) = &r {
                println!("{}", serde_json::to_string(e).unwrap_or_default());
            }
        }
        let done = ((chunk_no + 1) * BATCH).min(total);
        let _ = write!(
            stderr,
            "\r[{:<30}] {done}/{total}",
            "#".repeat(done * 30 / total.max(1))
        );
        let _ = stderr.flush();
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!();
    eprintln!(
        "enqueued {enq}, duplicate {dup}, conflict {conflict}, failed {failed}, invalid {invalid} ({total} lines in {secs:.1}s, {:.0}/s)",
        total as f64 / secs.max(1e-9)
    );
    Ok(if failed > 0 {
        1
    } else if invalid > 0 {
        2
    } else if conflict > 0 {
        3
    } else {
        0
    })
}
