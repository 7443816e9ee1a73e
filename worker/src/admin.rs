//! `oncely-worker admin`: look at operations, decide reviews, purge old rows.
//!
//! Readable tables by default, `--json` for scripts. `ops show` never prints the payload
//! unless `--payload` is given. Every review resolution is recorded with who, when and
//! the note, and moves the operation by compare-and-set.

use clap::{Args, Subcommand, ValueEnum};
use oncely_core::config::{Config, parse_duration};
use oncely_core::journal::{Event, Journal, Operation, OpsFilter, Resolution, Review};
use oncely_core::review::Evidence;
use oncely_core::{IdempotencyKey, Status};
use std::time::Duration;

/// Admin subcommands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Operations.
    #[command(subcommand)]
    Ops(OpsCommand),
    /// Human reviews.
    #[command(subcommand)]
    Review(ReviewCommand),
    /// Settle unknown operations from a provider's statement (dry run unless --apply);
    /// reports unexpected effects (exit code 2) and unknowns the statement lacks.
    ImportStatement(crate::statement::ImportArgs),
    /// Cancel an action that has not started (planned, held, retrying, deferred): it will
    /// never be sent. Exit code 3 when too late (the status is printed).
    Cancel {
        /// The idempotency key.
        key: String,
        /// Who cancels (recorded in the audit trail).
        #[arg(long)]
        by: String,
    },
    /// Approve a held action (`awaiting_approval`): due for a worker at once, or at its
    /// `not_before`; with four eyes, one of the two approvals. Never by its requester.
    Approve {
        /// The idempotency key.
        key: String,
        /// Who approves (recorded; must differ from who asked, and from a first approver).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        note: Option<String>,
    },
    /// Reject a held action: `rejected`, never sent.
    Reject {
        /// The idempotency key.
        key: String,
        /// Who rejects (recorded).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        note: Option<String>,
    },
    /// Delete terminal operations past retention (never sooner than the provider's key retention).
    Purge {
        /// Age past which terminal operations go (e.g. `30d`).
        #[arg(long)]
        older_than: String,
        /// Only count what would go.
        #[arg(long)]
        dry_run: bool,
        /// Pages of the operations table per transaction (8 kB each): the purge reads the
        /// table once, a step at a time, each step its own transaction.
        #[arg(long, default_value_t = oncely_core::journal::review::PURGE_BLOCKS, value_parser = clap::value_parser!(i64).range(1..))]
        pages_per_step: i64,
    },
}

/// `admin ops …`
#[derive(Debug, Subcommand)]
pub enum OpsCommand {
    /// List operations, newest first.
    List(ListArgs),
    /// One operation and its event history.
    Show {
        /// The idempotency key.
        key: String,
        /// Also print the payload (personal data: only when needed).
        #[arg(long)]
        payload: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Filters for `ops list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only this status.
    #[arg(long)]
    pub status: Option<Status>,
    /// Only this action type.
    #[arg(long)]
    pub action: Option<String>,
    /// Only this workflow.
    #[arg(long)]
    pub workflow: Option<String>,
    /// Only operations created longer ago than this (e.g. `10m`).
    #[arg(long)]
    pub older_than: Option<String>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: i64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `admin review …`
#[derive(Debug, Subcommand)]
pub enum ReviewCommand {
    /// Open reviews (or all with `--all`).
    List {
        /// Include resolved ones.
        #[arg(long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decide an open review.
    Resolve {
        /// The idempotency key.
        key: String,
        /// The decision.
        #[arg(long = "as", value_enum)]
        resolution: ResolveAs,
        /// Required with `--as succeeded`: the provider's id (e.g. from the bank statement).
        #[arg(long)]
        provider_operation_id: Option<String>,
        /// Who decides (recorded in the audit trail).
        #[arg(long)]
        by: String,
        /// Why (recorded).
        #[arg(long)]
        note: Option<String>,
    },
}

/// Review decisions.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ResolveAs {
    /// The effect happened.
    Succeeded,
    /// It did not and must not: failed_final.
    Failed,
    /// It did not: authorise exactly one more attempt.
    Retry,
}

fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("{}", line(headers.iter().map(|h| h.to_string()).collect()));
    for r in rows {
        println!("{}", line(r.clone()));
    }
}

fn short_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Run an admin command; returns the exit code.
pub async fn run(config: &Config, cmd: AdminCommand) -> anyhow::Result<i32> {
    let pool = oncely_core::db::connect_checked_as(
        &config.database_url,
        &oncely_core::db::PoolSettings {
            max_connections: 2,
            ..oncely_core::db::PoolSettings::for_config(config)
        },
        oncely_core::roles::Process::Admin,
    )
    .await?;
    let journal = Journal::on(pool).with_data_keys(oncely_core::DataKeys::from_env()?);
    match cmd {
        AdminCommand::Ops(OpsCommand::List(a)) => ops_list(&journal, a).await,
        AdminCommand::Ops(OpsCommand::Show { key, payload, json }) => {
            ops_show(&journal, &key, payload, json).await
        }
        AdminCommand::Review(ReviewCommand::List { all, json }) => {
            review_list(&journal, all, json).await
        }
        AdminCommand::Review(ReviewCommand::Resolve {
            key,
            resolution,
            provider_operation_id,
            by,
            note,
        }) => review_resolve(&journal, &key, resolution, provider_operation_id, &by, note).await,
        AdminCommand::ImportStatement(args) => crate::statement::run(config, &journal, args).await,
        AdminCommand::Purge {
            older_than,
            dry_run,
            pages_per_step,
        } => purge(config, &journal, &older_than, dry_run, pages_per_step).await,
        AdminCommand::Cancel { key, by } => cancel(&journal, &key, &by).await,
        AdminCommand::Approve { key, by, note } => {
            decide(&journal, &key, &by, true, note.as_deref()).await
        }
        AdminCommand::Reject { key, by, note } => {
            decide(&journal, &key, &by, false, note.as_deref()).await
        }
    }
}

/// `admin cancel`: 0 cancelled, 3 too late, 1 not found.
async fn cancel(journal: &Journal, key: &str, by: &str) -> anyhow::Result<i32> {
    use oncely_core::journal::Cancelled;
    let key = IdempotencyKey::parse(key)?;
    Ok(
        match journal.cancel(&key, None, &format!("admin:{by}")).await? {
            Cancelled::Cancelled(_) => {
                println!("cancelled {key}: it will never be sent");
                0
            }
            Cancelled::TooLate(op) if op.status == Status::Cancelled => {
                println!("cancelled {key} (already)");
                0
            }
            Cancelled::TooLate(op) => {
                println!("too late: {key} is {} (it may run or have run)", op.status);
                3
            }
            Cancelled::NotFound => {
                eprintln!("no operation with key {key}");
                1
            }
        },
    )
}

/// `admin approve|reject`: 0 done, 3 refused (not held, own request, already decided),
/// 1 not found.
async fn decide(
    journal: &Journal,
    key: &str,
    by: &str,
    approve: bool,
    note: Option<&str>,
) -> anyhow::Result<i32> {
    use oncely_core::journal::Decided;
    let key = IdempotencyKey::parse(key)?;
    Ok(
        match journal
            .decide_approval(&key, by, approve, note, None)
            .await?
        {
            Decided::Approved(_) => {
                println!("approved {key}: due for a worker");
                0
            }
            Decided::NeedsMore { more, .. } => {
                println!("approval recorded for {key}: {more} more (another person) needed");
                0
            }
            Decided::Rejected(_) => {
                println!("rejected {key}: it will never be sent");
                0
            }
            Decided::NotHeld(op) => {
                println!("not held: {key} is {}", op.status);
                3
            }
            Decided::OwnRequest => {
                println!("refused: {by} asked for {key} and may not approve it");
                3
            }
            Decided::AlreadyDecided => {
                println!("refused: {by} already decided on {key}");
                3
            }
            Decided::NotFound => {
                eprintln!("no operation with key {key}");
                1
            }
        },
    )
}

/// `admin ops list`.
async fn ops_list(journal: &Journal, a: ListArgs) -> anyhow::Result<i32> {
    let older_than = a
        .older_than
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--older-than: {e}"))?;
    let ops = journal
        .list(&OpsFilter {
            status: a.status,
            action_type: a.action,
            workflow_id: a.workflow,
            older_than,
            limit: a.limit,
        })
        .await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ops)?);
    } else {
        let rows: Vec<Vec<String>> = ops
            .iter()
            .map(|o| {
                vec![
                    o.key.to_string(),
                    o.action_type.clone(),
                    o.workflow_id.clone(),
                    o.status.to_string(),
                    o.attempt_count.to_string(),
                    o.provider_operation_id
                        .clone()
                        .unwrap_or_else(|| "-".into()),
                    o.last_error_code.clone().unwrap_or_else(|| "-".into()),
                    short_time(o.updated_at),
                ]
            })
            .collect();
        table(
            &[
                "KEY",
                "ACTION",
                "WORKFLOW",
                "STATUS",
                "ATT",
                "PROVIDER ID",
                "ERROR",
                "UPDATED",
            ],
            &rows,
        );
    }
    Ok(0)
}

/// `admin ops show KEY`: the operation, its events and its reviews.
async fn ops_show(journal: &Journal, key: &str, payload: bool, json: bool) -> anyhow::Result<i32> {
    let key = IdempotencyKey::parse(key)?;
    let Some(mut op) = journal.get(&key).await? else {
        eprintln!("no operation with key {key}");
        return Ok(1);
    };
    let events = journal.events(&key).await?;
    let reviews = journal.reviews_of(&key).await?;
    let shown_payload = if payload {
        match op.open_payload(journal.data_keys()) {
            Ok(p) => Some(serde_json::Value::Object(p)),
            Err(oncely_core::journal::PayloadUnavailable::Missing) => None,
            Err(e) => {
                eprintln!("payload not shown: {e}");
                None
            }
        }
    } else {
        None
    };
    op.payload = None;
    if json {
        let mut v = serde_json::json!({"operation": op, "events": events, "reviews": review_views(&reviews)});
        if let Some(p) = shown_payload {
            v["payload"] = p;
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    print_operation(&op);
    if let Some(p) = shown_payload {
        println!("payload      {p}");
    }
    println!();
    print_events(&events);
    print_reviews(&reviews);
    Ok(0)
}

/// The operation's fields, one per line (never its payload).
fn print_operation(op: &Operation) {
    println!("key          {}", op.key);
    println!("action       {}", op.action_type);
    println!("tenant       {}", op.tenant.as_deref().unwrap_or("-"));
    println!(
        "workflow     {} / step {} / {} rev {}",
        op.workflow_id, op.step, op.business_object, op.revision
    );
    println!("status       {}", op.status);
    println!(
        "attempts     {} (reconcile checks {})",
        op.attempt_count, op.reconcile_checks
    );
    println!(
        "provider id  {}",
        op.provider_operation_id.as_deref().unwrap_or("-")
    );
    println!(
        "last error   {}",
        op.last_error_code.as_deref().unwrap_or("-")
    );
    println!(
        "lease/due    {}{}",
        op.lease_until.map(short_time).unwrap_or_else(|| "-".into()),
        op.lease_owner
            .as_ref()
            .map(|o| format!(" ({o})"))
            .unwrap_or_default()
    );
    println!("payload hash {}", op.payload_hash);
    println!(
        "created      {}   updated {}",
        short_time(op.created_at),
        short_time(op.updated_at)
    );
}

/// The audit trail as a table.
fn print_events(events: &[Event]) {
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                short_time(e.at),
                e.from_status.clone().unwrap_or_else(|| "-".into()),
                e.to_status.clone(),
                e.attempt.to_string(),
                e.actor.clone(),
                e.reason.clone(),
                e.error_code
                    .clone()
                    .or_else(|| e.provider_operation_id.clone())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    table(
        &["AT", "FROM", "TO", "ATT", "ACTOR", "REASON", "DETAIL"],
        &rows,
    );
}

/// Each review with its decision (or who it waits for) and its evidence.
fn print_reviews(reviews: &[Review]) {
    for r in reviews {
        println!();
        println!(
            "review #{}: {} ({}, opened {} by {}){}",
            r.id,
            r.reason,
            r.reason().class().as_str(),
            short_time(r.opened_at),
            r.opened_by,
            match (&r.resolution, &r.resolved_by) {
                (Some(res), Some(by)) => format!(
                    " → {res} by {by}{}",
                    r.note
                        .as_ref()
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default()
                ),
                _ => format!(" — OPEN, {}", waiting_on(r)),
            }
        );
        print_evidence(&r.evidence.0, r.rechecks);
    }
}

/// Who an open review waits for, in words.
fn waiting_on(r: &Review) -> String {
    match r.recheck_at {
        Some(at) => format!("next lookup {}", short_time(at)),
        None => "waiting for a person".into(),
    }
}

/// A review's evidence, indented under it.
fn print_evidence(e: &Evidence, rechecks: i32) {
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    println!(
        "  policy {} (max checks {}), provider {} (honours key {}, key retention {})",
        or_dash(e.policy.clone()),
        or_dash(e.max_reconcile_checks.map(|n| n.to_string())),
        or_dash(e.provider.clone()),
        or_dash(e.honours_key.map(|b| b.to_string())),
        or_dash(e.key_retention_secs.map(|s| format!("{s}s"))),
    );
    println!(
        "  attempts {}, checks before review {}, re-checks since {rechecks}",
        e.attempts, e.checks_before_review
    );
    for l in &e.lookups {
        println!(
            "  lookup {}  {}{}",
            short_time(l.at),
            l.answer,
            l.code
                .as_ref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        );
    }
}

/// A review as `--json` prints it: the row, its class, and who an open one waits for.
#[derive(serde::Serialize)]
struct ReviewView<'a> {
    #[serde(flatten)]
    review: &'a Review,
    class: &'static str,
    waiting_on: Option<&'static str>,
}

fn review_views(reviews: &[Review]) -> Vec<ReviewView<'_>> {
    reviews
        .iter()
        .map(|r| ReviewView {
            review: r,
            class: r.reason().class().as_str(),
            waiting_on: match (&r.resolution, r.recheck_at) {
                (Some(_), _) => None,
                (None, Some(_)) => Some("lookup"),
                (None, None) => Some("person"),
            },
        })
        .collect()
}

/// `admin review list`.
async fn review_list(journal: &Journal, all: bool, json: bool) -> anyhow::Result<i32> {
    let reviews = journal.reviews(all).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&review_views(&reviews))?);
    } else {
        let rows: Vec<Vec<String>> = reviews
            .iter()
            .map(|r| {
                let last = r.evidence.0.lookups.last();
                vec![
                    r.idempotency_key.clone(),
                    r.reason.clone(),
                    r.reason().class().as_str().into(),
                    short_time(r.opened_at),
                    r.rechecks.to_string(),
                    last.map(|l| match &l.code {
                        Some(c) => format!("{} ({c}) {}", l.answer, short_time(l.at)),
                        None => format!("{} {}", l.answer, short_time(l.at)),
                    })
                    .unwrap_or_else(|| "-".into()),
                    match (&r.resolution, r.recheck_at) {
                        (Some(res), _) => res.clone(),
                        (None, Some(_)) => "OPEN (re-checking)".into(),
                        (None, None) => "OPEN (for a person)".into(),
                    },
                    r.resolved_by.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        table(
            &[
                "KEY",
                "REASON",
                "CLASS",
                "OPENED",
                "RECHECKS",
                "LAST LOOKUP",
                "RESOLUTION",
                "BY",
            ],
            &rows,
        );
    }
    Ok(0)
}

/// `admin review resolve KEY --as …`: the same audited transaction the review desk uses.
async fn review_resolve(
    journal: &Journal,
    key: &str,
    resolution: ResolveAs,
    provider_operation_id: Option<String>,
    by: &str,
    note: Option<String>,
) -> anyhow::Result<i32> {
    let key = IdempotencyKey::parse(key)?;
    let resolution = match (resolution, provider_operation_id) {
        (ResolveAs::Succeeded, Some(id)) if !id.trim().is_empty() => Resolution::Succeeded {
            provider_operation_id: id,
        },
        (ResolveAs::Succeeded, _) => anyhow::bail!(
            "--as succeeded needs --provider-operation-id (the provider's id of the effect)"
        ),
        (ResolveAs::Failed, None) => Resolution::Failed,
        (ResolveAs::Retry, None) => Resolution::Retry,
        (_, Some(_)) => {
            anyhow::bail!("--provider-operation-id only goes with --as succeeded")
        }
    };
    if by.trim().is_empty() {
        anyhow::bail!("--by must name who decides");
    }
    let op = journal
        .resolve_review(&key, &resolution, by, note.as_deref())
        .await?;
    println!("{} is now {} (resolved by {by})", op.key, op.status);
    if op.status == Status::FailedRetryable {
        println!("one more attempt is authorised; the sweeper republishes it within its next pass");
    }
    Ok(0)
}

/// `admin purge --older-than AGE`: never sooner than each provider's key retention.
async fn purge(
    config: &Config,
    journal: &Journal,
    older_than: &str,
    dry_run: bool,
    pages_per_step: i64,
) -> anyhow::Result<i32> {
    let age = parse_duration(older_than).map_err(|e| anyhow::anyhow!("--older-than: {e}"))?;
    let mut cutoffs = Vec::new();
    for (action, policy) in &config.actions {
        let retention = config
            .providers
            .get(&policy.provider)
            .and_then(|p| p.key_retention())
            .unwrap_or(Duration::ZERO);
        if age < retention {
            eprintln!(
                "note: {action} keeps operations for its provider's key retention ({retention:?}), longer than --older-than"
            );
        }
        cutoffs.push((action.clone(), age.max(retention)));
    }
    // Progress on stderr every 10 s (a purge of a big journal reads all of it).
    let mut said = std::time::Instant::now();
    let n = journal
        .purge_in_steps(&cutoffs, dry_run, pages_per_step, |step| {
            if said.elapsed() >= Duration::from_secs(10) {
                said = std::time::Instant::now();
                eprintln!(
                    "{} {} so far; page {} of {}",
                    if dry_run { "would purge" } else { "purged" },
                    step.purged,
                    step.next_block.min(step.table_blocks),
                    step.table_blocks
                );
            }
        })
        .await?;
    println!(
        "{} {n} terminal operations",
        if dry_run { "would purge" } else { "purged" }
    );
    Ok(0)
}
