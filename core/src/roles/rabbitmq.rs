//! RabbitMQ permissions per user, limited to one fleet's prefix.
//!
//! RabbitMQ grants per vhost three regular expressions over resource names:
//! *configure* (declare, delete), *write* (publish to an exchange; be the destination of
//! a binding) and *read* (consume from a queue; be the source of a binding). Creating a
//! queue with `x-dead-letter-exchange` also needs *read* on the queue and *write* on that
//! exchange (measured on RabbitMQ 3.10; re-declaring an existing one needs only
//! *configure*). Every oncely process declares the topology at start
//! ([`crate::topology`]), so each needs *configure* on every name of its prefix and the
//! rights to re-bind it; beyond that the users differ:
//!
//! | user | creates the queues | publishes to | consumes from |
//! | --- | --- | --- | --- |
//! | worker | yes (start one first on a new broker or prefix) | `<p>.outcomes`, `<p>.reconcile-requests`, `<p>.dlx` (invalid messages) | `<p>.action.*` |
//! | reconciler | no | `<p>.actions` (republish), `<p>.outcomes`, `<p>.reconcile-requests` | `<p>.reconcile` |
//! | producer, gateway | no | `<p>.actions` | a server-named `amq.gen-*` queue bound to `<p>.outcomes` (waits) |
//!
//! So the gateway's user cannot consume the action queues (whose messages carry the
//! payloads its database role may not read), the worker cannot publish intents, and no
//! user may write to the default exchange (`amq.default`), which reaches *any* queue of
//! the vhost by name — another prefix's included. Prefixes share a vhost safely when no
//! prefix is another's followed by `.action` (`a` and `a.action`); separate vhosts are
//! the stronger boundary and need nothing from this module but `-p`.

use super::Role;

/// The three regular expressions of `rabbitmqctl set_permissions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Declare and delete.
    pub configure: String,
    /// Publish to exchanges; bind queues.
    pub write: String,
    /// Consume from queues; bind from exchanges.
    pub read: String,
}

/// `prefix` with the regex metacharacters a broker prefix may hold escaped (a prefix is
/// ASCII letters, digits, `.`, `_`, `-`; only `.` means something in a regex).
fn escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if "\\.^$|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Alternatives under a prefix, anchored: `^p\.(a|b|action\..+)$`.
fn names(p: &str, alternatives: &[&str]) -> String {
    format!("^{p}\\.({})$", alternatives.join("|"))
}

/// The per-type action queues.
const ACTION_QUEUES: &str = "action\\..+";
/// Every name of a prefix: what each process declares.
const EVERY: &[&str] = &[
    "actions",
    "dlx",
    "dead",
    "outcomes",
    "reconcile",
    "reconcile-requests",
    ACTION_QUEUES,
];
/// Re-binding the topology: the queues are the bindings' destinations (*write*)…
const BIND_DESTINATIONS: &[&str] = &["dead", "reconcile", ACTION_QUEUES];
/// … and the exchanges their sources (*read*).
const BIND_SOURCES: &[&str] = &["dlx", "actions", "reconcile-requests"];
/// The outcome watcher's exclusive queue is server-named (`amq.gen-…`): the producer
/// declares, binds and consumes it. Exclusive queues belong to the connection that
/// declared them, so no other user can consume or delete one.
const SERVER_NAMED: &str = "^amq\\.gen-.*$";

/// The permissions of `role`'s RabbitMQ user for a fleet with broker prefix `prefix`;
/// `None` for the roles that do not use RabbitMQ (`migrate`, `admin`, `desk`).
pub fn permissions(role: Role, prefix: &str) -> Option<Permissions> {
    let p = escape(prefix);
    let with = |base: &[&str], more: &[&str]| names(&p, &[base, more].concat());
    match role {
        Role::Migrate | Role::Admin | Role::Desk => None,
        // Creates the queues (dead-letter arguments: read on the queue, write on
        // `<p>.dlx`), consumes the action queues, dead-letters invalid messages itself.
        Role::Worker => Some(Permissions {
            configure: names(&p, EVERY),
            write: with(
                BIND_DESTINATIONS,
                &["dlx", "outcomes", "reconcile-requests"],
            ),
            read: with(BIND_SOURCES, &["reconcile", ACTION_QUEUES]),
        }),
        Role::Reconciler => Some(Permissions {
            configure: names(&p, EVERY),
            write: with(
                BIND_DESTINATIONS,
                &["actions", "outcomes", "reconcile-requests"],
            ),
            read: with(BIND_SOURCES, &["reconcile"]),
        }),
        Role::Producer => Some(Permissions {
            configure: format!("{}|{SERVER_NAMED}", names(&p, EVERY)),
            write: format!("{}|{SERVER_NAMED}", with(BIND_DESTINATIONS, &["actions"])),
            read: format!("{}|{SERVER_NAMED}", with(BIND_SOURCES, &["outcomes"])),
        }),
    }
}

/// Single-quoted for a POSIX shell.
fn shell(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// The `rabbitmqctl` commands that create one user per role (named `<users><role>`,
/// e.g. `oncely_worker`) with its permissions on `vhost` for broker prefix `prefix`.
/// Passwords are read from stdin (`--pre-hashed-password` is not used), so none is
/// written here.
pub fn commands(prefix: &str, vhost: &str, users: &str) -> String {
    let mut out = format!(
        "# RabbitMQ users for the oncely fleet with broker prefix {prefix:?} on vhost {vhost:?}.\n\
         # Each `add_user` reads the password from stdin. docs/security.md (Least privilege) explains each pattern.\n"
    );
    for role in [Role::Worker, Role::Reconciler, Role::Producer] {
        let Some(p) = permissions(role, prefix) else {
            continue;
        };
        let user = shell(&format!("{users}{}", role.suffix()));
        out.push_str(&format!(
            "rabbitmqctl add_user {user}\n\
             rabbitmqctl set_permissions -p {} {user} {} {} {}\n",
            shell(vhost),
            shell(&p.configure),
            shell(&p.write),
            shell(&p.read),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether RabbitMQ would match `name` against `re` (Erlang `re` and the regex crate
    /// agree on these plain patterns).
    fn matches(re: &str, name: &str) -> bool {
        regex::Regex::new(re).expect("regex").is_match(name)
    }

    #[test]
    fn each_user_reaches_only_what_it_uses_under_its_prefix() {
        let w = permissions(Role::Worker, "t1").expect("worker");
        assert!(matches(&w.read, "t1.action.email.send"));
        assert!(matches(&w.write, "t1.outcomes"));
        assert!(
            !matches(&w.write, "t1.actions"),
            "a worker publishes no intents"
        );
        assert!(!matches(&w.write, "amq.default"));
        assert!(!matches(&w.configure, "t2.actions"));
        assert!(!matches(&w.write, "t1x.outcomes"));
        assert!(!matches(&w.configure, "t1.actions.x"));
        assert!(matches(&w.write, "t1.reconcile-requests"));
        let r = permissions(Role::Reconciler, "t1").expect("reconciler");
        assert!(matches(&r.write, "t1.actions") && matches(&r.read, "t1.reconcile"));
        assert!(!matches(&r.write, "amq.default"));
        assert!(!matches(&r.read, "t1.action.email.send"));
        let p = permissions(Role::Producer, "t1").expect("producer");
        assert!(matches(&p.configure, "amq.gen-AbC"));
        assert!(matches(&p.read, "t1.outcomes") && !matches(&w.read, "t1.outcomes"));
        for queue in ["t1.action.email.send", "t1.reconcile", "t1.dead"] {
            assert!(!matches(&p.read, queue), "the producer may consume {queue}");
        }
        assert!(!matches(&p.write, "t2.actions"));
        assert!(permissions(Role::Admin, "t1").is_none());
    }

    #[test]
    fn dots_in_the_prefix_are_literal() {
        let w = permissions(Role::Worker, "prod.eu").expect("worker");
        assert!(matches(&w.configure, "prod.eu.actions"));
        assert!(!matches(&w.configure, "prodXeu.actions"));
    }

    #[test]
    fn commands_quote_for_the_shell() {
        let c = commands("t1", "/", "oncely_");
        assert!(c.contains("rabbitmqctl add_user 'oncely_worker'\n"));
        assert!(c.contains("set_permissions -p '/' 'oncely_producer' '^t1\\.("));
        assert!(!c.contains("admin"));
    }
}
