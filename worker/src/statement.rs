//! `oncely-worker admin import-statement`: reconciliation from a provider's statement
//! (the article's "сверка по выписке").
//!
//! A provider's statement (a bank's export, a payment provider's report) lists the
//! effects it recorded. Read against the journal it settles the operations nobody could
//! settle by asking (`unknown`, with or without an open review), and it finds the two
//! cases a person must hear about: effects oncely does not know (**unexpected** — the
//! alarm: something acted in oncely's name, or an operation was purged) and operations
//! still unknown that the statement does not mention (**missing**). It never changes an
//! operation that is not `unknown`; a statement that disagrees with a decided operation
//! is a **conflict**, reported, not applied.
//!
//! Dry run by default; `--apply` writes. Every settlement is one transaction with the
//! actor `statement:<file name>`, so importing the same file twice changes nothing the
//! second time. A row that does not parse is reported with its line number, and then
//! nothing is applied unless `--skip-bad`.

use clap::{Args, ValueEnum};
use oncely_core::IdempotencyKey;
use oncely_core::config::{Config, ProviderConfig};
use oncely_core::journal::{Journal, StatementCandidate, StatementVerdict};
use oncely_core::status::Status;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

/// The statement's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Comma-separated, a header row first (RFC 4180 quoting).
    Csv,
    /// One JSON object per line.
    Jsonl,
}

/// `admin import-statement FILE --provider NAME --format csv|jsonl`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The statement file.
    pub file: PathBuf,
    /// The provider it comes from (a `[providers.NAME]`): only operations of action
    /// types that use it are matched.
    #[arg(long)]
    pub provider: String,
    /// `csv` (a header row names the columns) or `jsonl`.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Write the settlements (default: a dry run that only reports).
    #[arg(long)]
    pub apply: bool,
    /// Apply the good rows even if some rows do not parse (they are still listed).
    #[arg(long)]
    pub skip_bad: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Column / field with oncely's idempotency key (`v1:…`); may be empty in a row.
    #[arg(long, default_value = "idempotency_key")]
    pub key_field: String,
    /// Column / field with the business reference, used when a row has no key.
    #[arg(long, default_value = "business_reference")]
    pub reference_field: String,
    /// Column / field with the provider's id of the effect.
    #[arg(long, default_value = "id")]
    pub id_field: String,
    /// Column / field with the effect's status.
    #[arg(long, default_value = "status")]
    pub status_field: String,
    /// Status values meaning the effect happened (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "succeeded")]
    pub succeeded_values: Vec<String>,
    /// Status values meaning it did not (refused, reversed; comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "failed,rejected")]
    pub failed_values: Vec<String>,
}

/// One parsed row.
#[derive(Debug, Clone, Serialize)]
struct Row {
    line: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
    id: String,
    succeeded: bool,
}

/// A row that does not parse.
#[derive(Debug, Clone, Serialize)]
struct Bad {
    line: usize,
    problem: String,
}

/// A row, and what the journal says about it.
#[derive(Debug, Clone, Serialize)]
struct Finding {
    #[serde(flatten)]
    row: Row,
    #[serde(skip_serializing_if = "Option::is_none")]
    operation: Option<String>,
    note: String,
}

/// The report.
#[derive(Debug, Default, Serialize)]
struct Report {
    file: String,
    provider: String,
    applied: bool,
    rows: usize,
    bad: Vec<Bad>,
    settled_succeeded: Vec<Finding>,
    settled_failed: Vec<Finding>,
    already_settled: usize,
    conflicts: Vec<Finding>,
    live: Vec<Finding>,
    unexpected: Vec<Finding>,
    missing: Vec<String>,
}

/// Runs the import; the exit code: 0 clean, 1 bad rows (nothing applied) or a failure,
/// 2 unexpected effects found.
pub async fn run(config: &Config, journal: &Journal, args: ImportArgs) -> anyhow::Result<i32> {
    let (action_types, reference_pointer) = provider_scope(config, &args.provider)?;
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let (rows, bad) = match args.format {
        Format::Csv => parse_csv(&text, &args)?,
        Format::Jsonl => parse_jsonl(&text, &args),
    };
    let name = args
        .file
        .file_name()
        .map_or_else(|| "statement".into(), |n| n.to_string_lossy().into_owned());
    let mut report = Report {
        file: name.clone(),
        provider: args.provider.clone(),
        rows: rows.len() + bad.len(),
        bad,
        ..Report::default()
    };
    let blocked = !report.bad.is_empty() && !args.skip_bad;
    let candidates = candidates(journal, &action_types, &reference_pointer, &rows).await?;
    let to_settle = classify(&rows, &candidates, &mut report);
    if args.apply && !blocked {
        let actor = format!("statement:{name}");
        apply(journal, &actor, to_settle, &mut report).await?;
        report.applied = true;
    } else {
        for (finding, _, succeeded) in to_settle {
            push_settled(&mut report, finding, succeeded);
        }
    }
    print(&report, args.json, blocked)?;
    Ok(if blocked {
        1
    } else if !report.unexpected.is_empty() {
        2
    } else {
        0
    })
}

/// The action types that use `provider`, and where its payloads carry the reference.
fn provider_scope(config: &Config, provider: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let Some(p) = config.providers.get(provider) else {
        let known: Vec<&str> = config.providers.keys().map(String::as_str).collect();
        anyhow::bail!(
            "--provider {provider}: not configured (configured: {})",
            known.join(", ")
        );
    };
    let pointer = match p {
        ProviderConfig::Http(http) => http.reference_pointer.clone(),
        ProviderConfig::Smtp(_) => "/business_reference".to_owned(),
    };
    let path = pointer
        .trim_start_matches('/')
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect();
    let actions = config
        .actions
        .iter()
        .filter(|(_, a)| a.provider == provider)
        .map(|(name, _)| name.clone())
        .collect();
    Ok((actions, path))
}

fn row_from(
    line: usize,
    field: impl Fn(&str) -> Option<String>,
    args: &ImportArgs,
) -> Result<Row, String> {
    let key = field(&args.key_field).filter(|k| !k.is_empty());
    if let Some(k) = &key {
        IdempotencyKey::parse(k).map_err(|e| format!("{}: {e}", args.key_field))?;
    }
    let reference = field(&args.reference_field).filter(|r| !r.is_empty());
    if key.is_none() && reference.is_none() {
        return Err(format!(
            "neither {} nor {}",
            args.key_field, args.reference_field
        ));
    }
    let id = field(&args.id_field)
        .filter(|i| !i.is_empty())
        .ok_or_else(|| format!("no {}", args.id_field))?;
    let status = field(&args.status_field).unwrap_or_default();
    let succeeded = if args.succeeded_values.contains(&status) {
        true
    } else if args.failed_values.contains(&status) {
        false
    } else {
        return Err(format!(
            "{} {status:?} is neither succeeded ({}) nor failed ({})",
            args.status_field,
            args.succeeded_values.join(","),
            args.failed_values.join(",")
        ));
    };
    Ok(Row {
        line,
        key,
        reference,
        id,
        succeeded,
    })
}

fn parse_csv(text: &str, args: &ImportArgs) -> anyhow::Result<(Vec<Row>, Vec<Bad>)> {
    let mut records = csv_records(text).into_iter();
    let Some((_, Ok(header))) = records.next() else {
        anyhow::bail!("{}: no header row", args.file.display());
    };
    let column: HashMap<&str, usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| (h.trim(), i))
        .collect();
    for required in [&args.id_field, &args.status_field] {
        if !column.contains_key(required.as_str()) {
            anyhow::bail!(
                "{}: no column {required:?} in the header",
                args.file.display()
            );
        }
    }
    let (mut rows, mut bad) = (Vec::new(), Vec::new());
    for (line, record) in records {
        let parsed = record.and_then(|fields| {
            if fields.len() != header.len() {
                return Err(format!(
                    "{} fields, the header has {}",
                    fields.len(),
                    header.len()
                ));
            }
            let get = |name: &str| column.get(name).map(|&i| fields[i].trim().to_owned());
            row_from(line, get, args)
        });
        match parsed {
            Ok(row) => rows.push(row),
            Err(problem) => bad.push(Bad { line, problem }),
        }
    }
    Ok((rows, bad))
}

/// RFC 4180 records with the line each starts on; blank lines are skipped. A record
/// with an unterminated quote is an error for its line.
fn csv_records(text: &str) -> Vec<(usize, Result<Vec<String>, String>)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    let mut line = 1;
    while chars.peek().is_some() {
        let start = line;
        let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
        loop {
            match (chars.next(), quoted) {
                (None, true) => {
                    out.push((start, Err("a quoted field is not closed".into())));
                    return out;
                }
                (None, false) => break,
                (Some('"'), true) if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (Some('"'), true) => quoted = false,
                (Some('"'), false) if field.is_empty() => quoted = true,
                (Some(','), false) => fields.push(std::mem::take(&mut field)),
                (Some('\r'), false) if chars.peek() == Some(&'\n') => {}
                (Some('\n'), false) => {
                    line += 1;
                    break;
                }
                (Some(c), _) => {
                    if c == '\n' {
                        line += 1;
                    }
                    field.push(c);
                }
            }
        }
        fields.push(field);
        if !(fields.len() == 1 && fields[0].trim().is_empty()) {
            out.push((start, Ok(fields)));
        }
    }
    out
}

fn parse_jsonl(text: &str, args: &ImportArgs) -> (Vec<Row>, Vec<Bad>) {
    let (mut rows, mut bad) = (Vec::new(), Vec::new());
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Map<String, Value>>(raw)
            .map_err(|e| format!("not a JSON object: {e}"))
            .and_then(|object| {
                let get = |name: &str| {
                    let value = if name.starts_with('/') {
                        Value::Object(object.clone()).pointer(name).cloned()
                    } else {
                        object.get(name).cloned()
                    };
                    match value? {
                        Value::String(s) => Some(s),
                        Value::Null => None,
                        other => Some(other.to_string()),
                    }
                };
                row_from(line, get, args)
            });
        match parsed {
            Ok(row) => rows.push(row),
            Err(problem) => bad.push(Bad { line, problem }),
        }
    }
    (rows, bad)
}

async fn candidates(
    journal: &Journal,
    action_types: &[String],
    reference_path: &[String],
    rows: &[Row],
) -> anyhow::Result<Vec<StatementCandidate>> {
    let keys: Vec<String> = rows.iter().filter_map(|r| r.key.clone()).collect();
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let references: Vec<String> = rows.iter().filter_map(|r| r.reference.clone()).collect();
    Ok(journal
        .statement_candidates(action_types, reference_path, &keys, &ids, &references)
        .await?)
}

/// Sorts every row into the report; returns the settlements to make.
fn classify(
    rows: &[Row],
    candidates: &[StatementCandidate],
    report: &mut Report,
) -> Vec<(Finding, StatementCandidate, bool)> {
    let by_key: HashMap<&str, &StatementCandidate> =
        candidates.iter().map(|c| (c.key.as_str(), c)).collect();
    let known_ids: BTreeSet<&str> = candidates
        .iter()
        .filter_map(|c| c.provider_operation_id.as_deref())
        .collect();
    let mut mentioned = BTreeSet::new();
    let mut settle = Vec::new();
    for row in rows {
        let finding = |op: Option<&StatementCandidate>, note: &str| Finding {
            row: row.clone(),
            operation: op.map(|c| c.key.to_string()),
            note: note.into(),
        };
        let op = match (&row.key, &row.reference) {
            (Some(key), _) => by_key.get(key.as_str()).copied(),
            (None, Some(reference)) => {
                let same: Vec<&StatementCandidate> = candidates
                    .iter()
                    .filter(|c| c.reference.as_deref() == Some(reference))
                    .collect();
                let unknown: Vec<&StatementCandidate> = same
                    .iter()
                    .copied()
                    .filter(|c| c.status == Status::Unknown)
                    .collect();
                if unknown.len() > 1 {
                    report.conflicts.push(finding(
                        None,
                        "several unknown operations share this reference",
                    ));
                    continue;
                }
                // An unknown one first; else a live one still being driven (left alone).
                unknown.first().or(same.first()).copied()
            }
            (None, None) => None,
        };
        let Some(op) = op else {
            if known_ids.contains(row.id.as_str()) {
                report.already_settled += 1;
            } else {
                report.unexpected.push(finding(
                    None,
                    "no operation of this provider has this key, reference or id",
                ));
            }
            continue;
        };
        mentioned.insert(op.key.to_string());
        match (op.status, row.succeeded) {
            (Status::Unknown, succeeded) => {
                settle.push((finding(Some(op), "unknown"), op.clone(), succeeded))
            }
            (Status::Succeeded, true)
                if op.provider_operation_id.as_deref() == Some(row.id.as_str()) =>
            {
                report.already_settled += 1;
            }
            (Status::FailedFinal, false) => report.already_settled += 1,
            (Status::Succeeded | Status::FailedFinal, _) => report.conflicts.push(finding(
                Some(op),
                &format!(
                    "the journal says {} (provider id {:?})",
                    op.status, op.provider_operation_id
                ),
            )),
            (status, _) => report.live.push(finding(
                Some(op),
                &format!("{status}: still being driven; left alone"),
            )),
        }
    }
    report.missing = candidates
        .iter()
        .filter(|c| c.status == Status::Unknown && !mentioned.contains(c.key.as_str()))
        .map(|c| c.key.to_string())
        .collect();
    settle
}

async fn apply(
    journal: &Journal,
    actor: &str,
    to_settle: Vec<(Finding, StatementCandidate, bool)>,
    report: &mut Report,
) -> anyhow::Result<()> {
    for (mut finding, op, succeeded) in to_settle {
        let verdict = if succeeded {
            StatementVerdict::Succeeded(&finding.row.id)
        } else {
            StatementVerdict::Failed
        };
        if journal
            .settle_from_statement(&op.key, op.attempt, verdict, actor)
            .await?
        {
            push_settled(report, finding, succeeded);
        } else {
            finding.note = "changed while importing; run the import again".into();
            report.live.push(finding);
        }
    }
    Ok(())
}

fn push_settled(report: &mut Report, finding: Finding, succeeded: bool) {
    if succeeded {
        report.settled_succeeded.push(finding);
    } else {
        report.settled_failed.push(finding);
    }
}

fn print(report: &Report, json: bool, blocked: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    let verb = if report.applied {
        "settled"
    } else {
        "would settle"
    };
    println!(
        "statement {} from {}: {} rows",
        report.file, report.provider, report.rows
    );
    for bad in &report.bad {
        println!("  bad row, line {}: {}", bad.line, bad.problem);
    }
    if blocked {
        println!("  nothing applied: fix the bad rows or pass --skip-bad");
    }
    println!("  {verb} succeeded: {}", report.settled_succeeded.len());
    println!("  {verb} failed:    {}", report.settled_failed.len());
    println!("  already settled:      {}", report.already_settled);
    for (title, list) in [
        ("conflict", &report.conflicts),
        ("left alone", &report.live),
    ] {
        for f in list {
            println!(
                "  {title}, line {}: {} — {}",
                f.row.line,
                f.operation.as_deref().unwrap_or("-"),
                f.note
            );
        }
    }
    for f in &report.unexpected {
        let what = f
            .row
            .key
            .as_deref()
            .or(f.row.reference.as_deref())
            .unwrap_or("-");
        println!(
            "  UNEXPECTED EFFECT, line {}: {what} (provider id {}) — oncely has no such operation",
            f.row.line, f.row.id
        );
    }
    for key in &report.missing {
        println!("  missing from the statement (still unknown): {key}");
    }
    if !report.applied && !blocked {
        println!("  dry run: nothing written (pass --apply)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_records_handle_quotes_line_breaks_and_blank_lines() {
        let text = "id,status\r\n\"po_1\",succeeded\n\n\"a \"\"quoted\"\"\nvalue\",failed\nlast,x";
        let records = csv_records(text);
        let lines: Vec<usize> = records.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, vec![1, 2, 4, 6]);
        assert_eq!(
            records[2].1,
            Ok(vec!["a \"quoted\"\nvalue".into(), "failed".into()])
        );
        assert_eq!(records[3].1, Ok(vec!["last".into(), "x".into()]));
        let open = csv_records("id\n\"never closed\n");
        assert!(
            open.last()
                .is_some_and(|(line, r)| *line == 2 && r.is_err())
        );
    }
}
