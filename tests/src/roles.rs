//! Least-privilege set-ups for one test: the group roles of its database under a prefix
//! of its own, login roles in them, and their removal.
//!
//! Postgres roles belong to the whole cluster, not to a database, and every test shares
//! the machine's cluster: each [`DbRoles`] uses a unique prefix (`t_<pid>_<n>_<nanos>_`)
//! and drops its roles when dropped — after giving back what they own in its database,
//! if that database is still there (a dropped database takes its grants with it).

use crate::private_broker::PrivateBroker;
use crate::{TestDb, unique_name};
use oncely_core::roles::{Role, rabbitmq};
use std::collections::HashMap;
use std::sync::Mutex;

/// The group roles of one test database, and the login roles a test made in them.
#[derive(Debug)]
pub struct DbRoles {
    /// The group roles' prefix.
    pub prefix: String,
    db_url: String,
    /// The maintenance database of the test database's server (roles live there).
    server_url: String,
    logins: Mutex<Vec<String>>,
}

/// `url` (`scheme://[userinfo@]host…`) with its user information replaced by `user`
/// (`name`, or `name:password`); the rest (host, path, query) is kept. Postgres logins
/// need no password: the tests' servers trust local connections.
pub fn url_as(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    format!("{scheme}://{user}@{host}")
}

impl DbRoles {
    /// Run `oncely-worker migrate --roles --role-prefix <unique>` on `db` (as the test
    /// superuser) and check that it says so.
    pub async fn create(db: &TestDb) -> DbRoles {
        let prefix = format!("{}_", unique_name("t"));
        let roles = DbRoles {
            prefix: prefix.clone(),
            db_url: db.url.clone(),
            server_url: db.server_url(),
            logins: Mutex::new(Vec::new()),
        };
        let out = tokio::process::Command::new(crate::fleet::binary("oncely-worker"))
            .args(["migrate", "--roles", "--role-prefix", &prefix])
            .env("DATABASE_URL", &db.url)
            .output()
            .await
            .unwrap_or_else(|e| panic!("oncely-worker migrate --roles: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&Role::Worker.name(&prefix)),
            "migrate --roles: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        roles
    }

    /// The name of a group role.
    pub fn group(&self, role: Role) -> String {
        role.name(&self.prefix)
    }

    /// A new login role that is a member of `groups` (none: a login with no grants);
    /// returns its name and a URL of the test database connecting as it.
    pub async fn login(&self, tag: &str, groups: &[Role]) -> (String, String) {
        let name = format!("{}login_{tag}", self.prefix);
        let mut sql = format!("CREATE ROLE \"{name}\" LOGIN");
        if !groups.is_empty() {
            let names: Vec<String> = groups
                .iter()
                .map(|r| format!("\"{}\"", self.group(*r)))
                .collect();
            sql.push_str(&format!(" IN ROLE {}", names.join(", ")));
        }
        let server = sqlx::PgPool::connect(&self.server_url)
            .await
            .unwrap_or_else(|e| panic!("server: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&server)
            .await
            .unwrap_or_else(|e| panic!("create login {name}: {e}"));
        server.close().await;
        self.logins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.clone());
        let url = url_as(&self.db_url, &name);
        (name, url)
    }

    /// A pool on the test database as a new login in `group`.
    pub async fn pool(&self, tag: &str, group: Role) -> (String, sqlx::PgPool) {
        let (name, url) = self.login(tag, &[group]).await;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("connect as {name}: {e}"));
        (name, pool)
    }
}

/// The Postgres URL of each process kind's login and, on a private broker, the AMQP URL
/// of its broker user.
#[derive(Debug)]
pub struct Logins {
    /// Database URL per role.
    pub db: HashMap<Role, String>,
    /// AMQP URL per role (empty on the machine's shared broker: its users are not ours
    /// to create).
    pub amqp: HashMap<Role, String>,
}

impl Logins {
    /// A login in each runtime group role, and, on a private broker, a user per role
    /// that uses RabbitMQ (named `oncely_<role>`), limited to the fleet's prefix; its URL
    /// is the fleet's `amqp_url` (`amqp://` or `amqps://`) with that user.
    pub async fn create(
        roles: &DbRoles,
        broker: Option<&PrivateBroker>,
        prefix: &str,
        amqp_url: &str,
    ) -> Logins {
        let mut db = HashMap::new();
        for role in [
            Role::Worker,
            Role::Reconciler,
            Role::Producer,
            Role::Admin,
            Role::Desk,
        ] {
            db.insert(role, roles.login(role.suffix(), &[role]).await.1);
        }
        let mut amqp = HashMap::new();
        for role in [Role::Worker, Role::Reconciler, Role::Producer] {
            let Some(broker) = broker else { break };
            let p = rabbitmq::permissions(role, prefix)
                .unwrap_or_else(|| panic!("no broker user for {role:?}"));
            let user = format!("oncely_{}", role.suffix());
            broker
                .add_user(&user, "pw", &p.configure, &p.write, &p.read)
                .await;
            amqp.insert(role, url_as(amqp_url, &format!("{user}:pw")));
        }
        Logins { db, amqp }
    }

    /// The environment of a process of `role`'s kind.
    pub fn env(&self, role: Role) -> Vec<(&'static str, &str)> {
        let mut env = vec![("DATABASE_URL", self.db[&role].as_str())];
        if let Some(url) = self.amqp.get(&role) {
            env.push(("ONCELY_AMQP_URL", url.as_str()));
        }
        env
    }

    /// The role of a process started as `oncely-worker <subcommand>` or
    /// `oncely-gateway <subcommand>`.
    pub fn role_of(subcommand: &str) -> Option<Role> {
        match subcommand {
            "run" => Some(Role::Worker),
            "reconcile" => Some(Role::Reconciler),
            "admin" => Some(Role::Admin),
            "serve" | "mcp" => Some(Role::Producer),
            _ => None,
        }
    }
}

impl Drop for DbRoles {
    fn drop(&mut self) {
        let logins = std::mem::take(&mut *self.logins.lock().unwrap_or_else(|p| p.into_inner()));
        let groups: Vec<String> = Role::ALL.iter().map(|r| self.group(*r)).collect();
        let db_url = self.db_url.clone();
        let server_url = self.server_url.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let quoted = |names: &[String]| {
                    names
                        .iter()
                        .map(|n| format!("\"{n}\""))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let all: Vec<String> = logins.iter().chain(&groups).cloned().collect();
                // In the test database, if it is still there: hand the objects back to the
                // superuser and drop every privilege the roles hold.
                if let Ok(db) = sqlx::PgPool::connect(&db_url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "REASSIGN OWNED BY {} TO CURRENT_USER",
                        quoted(&all)
                    )))
                    .execute(&db)
                    .await;
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP OWNED BY {}",
                        quoted(&all)
                    )))
                    .execute(&db)
                    .await;
                    db.close().await;
                }
                let server = sqlx::PgPool::connect(&server_url).await.ok()?;
                for name in &all {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP ROLE IF EXISTS \"{name}\""
                    )))
                    .execute(&server)
                    .await;
                }
                server.close().await;
                Some(())
            })
        })
        .join();
    }
}
