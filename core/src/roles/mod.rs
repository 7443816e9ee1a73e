//! Least privilege: one Postgres group role and one RabbitMQ user per kind of process.
//!
//! A worker that can delete the audit trail, a gateway that can read every payload, or a
//! reconciler that can resolve its own reviews would make one compromised process worth
//! the whole journal. So each kind of process connects as a login role that is a member
//! of one `NOLOGIN` group role holding exactly what that kind's statements need:
//!
//! | group role (default prefix) | used by |
//! | --- | --- |
//! | `oncely_migrate` | owns the schema objects; `oncely-worker migrate` |
//! | `oncely_worker` | `oncely-worker run` |
//! | `oncely_reconciler` | `oncely-worker reconcile` (with its sweeper) |
//! | `oncely_producer` | the producer SDK and CLI, and `oncely-gateway` |
//! | `oncely_admin` | `oncely-worker admin` (inspect, resolve, import statements, purge) |
//! | `oncely_desk` | the review desk of `oncely-gateway serve` (read reviews, resolve them; no payloads) |
//!
//! `oncely-worker migrate --roles` creates or updates them (or prints the SQL with
//! `--print`); every process checks at start that its role has what it needs and says
//! which grant is missing. docs/security.md ("Least privilege") has the tables and the how-to.
//!
//! # Layout
//! - [`grants`]: what each process kind needs — the one table both of the following use.
//! - [`sql`]: the roles and grants as SQL, computed from the live schema.
//! - [`check`]: the start-up check of the connected role, and the `migrate` check.
//! - [`rabbitmq`]: the RabbitMQ permissions per user.

pub mod check;
pub mod grants;
pub mod rabbitmq;
pub mod sql;

pub use check::{MigrateRefused, MissingGrants, check_can_migrate, check_grants};
pub use sql::{RolesError, apply, plan};

/// The default prefix of the group roles' names.
pub const DEFAULT_PREFIX: &str = "oncely_";

/// A kind of process that connects to Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Process {
    /// `oncely-worker run`.
    Worker,
    /// `oncely-worker reconcile`.
    Reconciler,
    /// The producer SDK and `oncely-producer`.
    Producer,
    /// `oncely-gateway`.
    Gateway,
    /// `oncely-worker admin`.
    Admin,
    /// The review desk (`oncely-gateway serve --desk-reviewers-file`).
    Desk,
}

impl Process {
    /// Every kind.
    pub const ALL: [Process; 6] = [
        Process::Worker,
        Process::Reconciler,
        Process::Producer,
        Process::Gateway,
        Process::Admin,
        Process::Desk,
    ];

    /// Its name in messages ("needed by the worker").
    pub fn name(self) -> &'static str {
        match self {
            Process::Worker => "worker",
            Process::Reconciler => "reconciler",
            Process::Producer => "producer",
            Process::Gateway => "gateway",
            Process::Admin => "admin",
            Process::Desk => "review desk",
        }
    }

    /// The group role it connects through.
    pub fn role(self) -> Role {
        match self {
            Process::Worker => Role::Worker,
            Process::Reconciler => Role::Reconciler,
            Process::Producer | Process::Gateway => Role::Producer,
            Process::Admin => Role::Admin,
            Process::Desk => Role::Desk,
        }
    }
}

/// A group role (`NOLOGIN`); login roles are made members of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Owns the tables, sequences and functions; applies migrations.
    Migrate,
    /// Action workers.
    Worker,
    /// Reconcilers (with the sweeper).
    Reconciler,
    /// Producers and the gateway.
    Producer,
    /// Admin commands.
    Admin,
    /// The review desk: reads reviews and operations (never payloads), resolves reviews.
    Desk,
}

impl Role {
    /// Every group role.
    pub const ALL: [Role; 6] = [
        Role::Migrate,
        Role::Worker,
        Role::Reconciler,
        Role::Producer,
        Role::Admin,
        Role::Desk,
    ];

    /// The part of the name after the prefix.
    pub fn suffix(self) -> &'static str {
        match self {
            Role::Migrate => "migrate",
            Role::Worker => "worker",
            Role::Reconciler => "reconciler",
            Role::Producer => "producer",
            Role::Admin => "admin",
            Role::Desk => "desk",
        }
    }

    /// Its name under `prefix` (`oncely_worker`).
    pub fn name(self, prefix: &str) -> String {
        format!("{prefix}{}", self.suffix())
    }

    /// The processes whose needs it holds (none for the owner: it owns everything).
    pub fn processes(self) -> &'static [Process] {
        match self {
            Role::Migrate => &[],
            Role::Worker => &[Process::Worker],
            Role::Reconciler => &[Process::Reconciler],
            Role::Producer => &[Process::Producer, Process::Gateway],
            Role::Admin => &[Process::Admin],
            Role::Desk => &[Process::Desk],
        }
    }
}

/// Whether `prefix` makes safe role names: lower-case ASCII letters, digits and `_`,
/// starting with a letter or `_`, short enough that every name fits Postgres' 63 bytes.
pub fn valid_prefix(prefix: &str) -> bool {
    let longest = Role::ALL
        .iter()
        .map(|r| r.suffix().len())
        .max()
        .unwrap_or(0);
    !prefix.is_empty()
        && prefix.len() + longest <= 63
        && prefix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !prefix.as_bytes()[0].is_ascii_digit()
}
