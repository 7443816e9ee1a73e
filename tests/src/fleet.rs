//! A whole oncely fleet for one test: a fresh database, an in-process sandbox, a unique
//! broker prefix, a config file, and real `oncely-worker` processes spawned from the
//! workspace's binaries (built on first use if `cargo test` did not build them).

use crate::{TestDb, unique_name};
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection};
use oncely_core::KeyRing;
use oncely_core::config::{
    BrokerTls, Config, ProviderConfig, ReconcilerConfig, WorkerConfig, parse_duration,
};
use oncely_core::topology::Topology;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The secret every test fleet uses.
pub const SECRET: &str = "test-secret-do-not-use";
/// The data key of fleets that seal payloads (a test key: never use it elsewhere).
pub const TEST_DATA_KEY: &str = "7465737464617461206b65792c20646f206e6f742075736520656c7365776821";

/// The test key secret.
pub fn secret() -> KeyRing {
    KeyRing::new(SECRET.as_bytes().to_vec()).unwrap_or_else(|e| panic!("{e}"))
}

/// Path of a workspace binary next to the test executable (`target/<profile>/NAME`; the
/// test harnesses live in `target/<profile>/deps`, the harness's own programs such as
/// `oncely-chaos` in `target/<profile>`),
/// built (or found up to date) once per test process: `cargo test` builds the test
/// harnesses, not these programs, and a binary left from an older checkout would make
/// the tests run old code.
pub fn binary(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let parent = exe.parent().unwrap_or(Path::new("."));
    let dir = if parent.file_name().is_some_and(|n| n == "deps") {
        parent.parent().unwrap_or(parent)
    } else {
        parent
    };
    let path = dir.join(name);
    BUILT.get_or_init(|| {
        let mut cargo = std::process::Command::new(env!("CARGO"));
        // The variables Cargo sets for *this* test crate (CARGO_PKG_NAME, CARGO_MANIFEST_DIR,
        // OUT_DIR, …) must not reach the nested build: build scripts that watch them
        // (ring's `rerun-if-env-changed=CARGO_PKG_NAME`, …) would see them change between
        // a build from a shell and one from here, and every switch would rebuild ring and
        // all that depends on it (rustls, sqlx, lapin, every binary): minutes, inside the
        // deadline of whichever test asked first.
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name == "OUT_DIR"
                || name.starts_with("CARGO_PKG_")
                || name.starts_with("CARGO_BIN_")
                || name.starts_with("CARGO_MANIFEST_")
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                ]
                .contains(&name.as_ref())
            {
                cargo.env_remove(name.as_ref());
            }
        }
        let status = cargo
            .args([
                "build",
                "--bins",
                "-p",
                "oncely-worker",
                "-p",
                "oncely-producer",
                "-p",
                "oncely-sandbox",
                "-p",
                "oncely-gateway",
            ])
            .status()
            .unwrap_or_else(|e| panic!("cargo build: {e}"));
        assert!(status.success(), "building the binaries failed");
    });
    assert!(path.exists(), "{} not found", path.display());
    path
}

/// A spawned process, killed when dropped.
#[derive(Debug)]
pub struct Proc {
    /// The child.
    pub child: Child,
    /// Where its stderr goes.
    pub log: PathBuf,
}

impl Proc {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Send a signal by name (`KILL`, `TERM`, `STOP`, `CONT`).
    pub fn signal(&self, sig: &str) {
        let _ = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status();
    }

    /// SIGKILL and reap.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// What it logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// How to build a fleet: the built-in config, pointed at this fleet's database, broker
/// and sandbox, with these changes. Durations are written as in a config file (`5s`).
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Provider request timeout.
    pub timeout: String,
    /// Lease of every action.
    pub lease: String,
    /// `max_reconcile_checks` of every action (`None`: the config's default).
    pub max_reconcile_checks: Option<i32>,
    /// Providers' key retention.
    pub key_retention: String,
    /// The reconciler's tuning (`None`: the config's), e.g. [`FAST_RECONCILER`].
    pub reconciler: Option<ReconcilerConfig>,
    /// Any other change to the typed config, made last, before it is written.
    pub configure: Option<fn(&mut Config)>,
    /// The broker (default: the machine's, [`amqp_url`]); a private node for restart tests.
    pub amqp_url: Option<String>,
    /// A cluster's nodes (`broker.urls`), instead of [`FleetOptions::amqp_url`]:
    /// [`crate::private_cluster::PrivateCluster::urls`].
    pub amqp_urls: Vec<String>,
    /// `[broker.tls]` of every process (with an `amqps://` [`FleetOptions::amqp_url`]).
    pub broker_tls: BrokerTls,
    /// The Postgres server the fleet's database is created on (default: the machine's,
    /// [`crate::server_url`]); its query (`sslmode`, `sslrootcert`, …) is kept in the
    /// database URL every process gets.
    pub database_server: Option<String>,
    /// Providers reached over TLS: when any, a test CA, the sandbox's TLS listener with a
    /// certificate for `localhost`, and these providers at `https://localhost:PORT` with
    /// `ca_file` set to the CA (the others stay on the plain listener).
    pub tls: &'static [&'static str],
    /// Seal payloads at rest: a data-key file for every spawned process
    /// (`ONCELY_DATA_KEYS_FILE`) and for the fleet's SDK producers.
    pub seal_payloads: bool,
}

impl Default for FleetOptions {
    fn default() -> Self {
        Self {
            timeout: "5s".into(),
            lease: "1m".into(),
            max_reconcile_checks: None,
            key_retention: "24h".into(),
            reconciler: None,
            configure: None,
            amqp_url: None,
            amqp_urls: Vec::new(),
            broker_tls: BrokerTls::default(),
            database_server: None,
            tls: &[],
            seal_payloads: false,
        }
    }
}

impl FleetOptions {
    /// The built-in config changed by these options, for a fleet whose database,
    /// broker prefix and sandbox are given.
    pub fn config(
        &self,
        database_url: &str,
        amqp_url: &str,
        prefix: &str,
        sandbox: &str,
    ) -> Config {
        let duration = |field: &str, text: &str| {
            parse_duration(text).unwrap_or_else(|e| panic!("FleetOptions::{field}: {e}"))
        };
        let timeout = duration("timeout", &self.timeout);
        let lease = duration("lease", &self.lease);
        let key_retention = duration("key_retention", &self.key_retention);
        let mut config = Config::builtin().unwrap_or_else(|e| panic!("built-in config: {e}"));
        config.database_url = database_url.to_owned();
        config.broker.url = amqp_url.to_owned();
        if !self.amqp_urls.is_empty() {
            config.broker.url = oncely_core::config::BrokerConfig::default().url;
            config.broker.urls = self.amqp_urls.clone();
        }
        config.broker.prefix = prefix.to_owned();
        config.broker.tls = self.broker_tls.clone();
        config.worker = WorkerConfig {
            prefetch: 64,
            max_in_flight: 32,
            batch: 32,
            db_connections: 4,
            ..WorkerConfig::default()
        };
        config.point_at_sandbox(sandbox);
        for policy in config.actions.values_mut() {
            policy.lease = lease;
            policy.retry_delay = Duration::from_millis(200);
            if let Some(n) = self.max_reconcile_checks {
                policy.max_reconcile_checks = n;
            }
        }
        for provider in config.providers.values_mut() {
            match provider {
                ProviderConfig::Http(http) => {
                    http.connect_timeout = Duration::from_secs(1);
                    http.timeout = timeout;
                    http.key_retention = Some(key_retention);
                }
                ProviderConfig::Smtp(smtp) => {
                    smtp.timeout = timeout;
                    smtp.key_retention = Some(key_retention);
                }
            }
        }
        if let Some(reconciler) = &self.reconciler {
            config.reconciler = reconciler.clone();
        }
        if let Some(configure) = self.configure {
            configure(&mut config);
        }
        config
    }
}

/// A reconciler that sweeps fast (tests wait on it).
pub const FAST_RECONCILER: ReconcilerConfig = ReconcilerConfig {
    sweep_interval: Duration::from_millis(200),
    republish_after: Duration::from_secs(1),
    stale_unknown_after: Duration::from_secs(1),
    check_lease: Duration::from_secs(3),
    recheck_delay: Duration::from_millis(200),
    max_recheck_delay: Duration::from_secs(1),
    ..ReconcilerConfig::DEFAULT
};

/// A fleet's shared pieces.
#[derive(Debug)]
pub struct Fleet {
    /// The database.
    pub db: TestDb,
    /// The sandbox (in process).
    pub sandbox: oncely_sandbox::Sandbox,
    /// The test CA the providers trust, when the fleet reaches the sandbox over TLS.
    pub ca: Option<crate::tls::TestCa>,
    /// The broker prefix.
    pub prefix: String,
    /// A directory for the config file and logs.
    pub dir: PathBuf,
    /// The config file.
    pub config_path: PathBuf,
    /// The loaded config (same as the file).
    pub config: Config,
    /// A broker connection for the test itself.
    pub conn: Connection,
    /// A channel on it.
    pub channel: Channel,
    /// The data-key file, when payloads are sealed ([`FleetOptions::seal_payloads`]).
    pub data_keys_file: Option<PathBuf>,
    /// Least privilege ([`Fleet::least_privilege`]): the database's group roles, and a
    /// login (and, on a private broker, a broker user) per kind of process.
    pub least_privilege: Option<(crate::roles::DbRoles, crate::roles::Logins)>,
    /// The fleet's database through this pgbouncer (transaction pooling) for every
    /// process and SDK producer ([`Fleet::through_pooler`]); checks stay direct.
    pub pooled_url: Option<String>,
    /// A multi-host `DATABASE_URL` (primary and standby) given to every spawned process
    /// and SDK producer ([`Fleet::on_hosts`]).
    pub hosts_url: Option<String>,
    spawned: std::sync::atomic::AtomicUsize,
}

impl Fleet {
    /// A fleet with default options (provider timeout 5s, lease 1m).
    pub async fn new() -> Fleet {
        Self::with(FleetOptions::default()).await
    }

    /// A fleet from options.
    pub async fn with(o: FleetOptions) -> Fleet {
        let amqp_url = o.amqp_url.clone().unwrap_or_else(crate::amqp_url);
        let db = match &o.database_server {
            Some(server) => TestDb::on(server).await,
            None => TestDb::new().await,
        };
        let local = || "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}"));
        let mut sandbox = oncely_sandbox::spawn(local())
            .await
            .unwrap_or_else(|e| panic!("sandbox: {e}"));
        let prefix = unique_name("t");
        let dir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let mut config = o.config(&db.url, &amqp_url, &prefix, &sandbox.base_url());
        let ca = if o.tls.is_empty() {
            None
        } else {
            let ca = crate::tls::TestCa::new(&dir, "ca");
            let server = ca.server_config(&["localhost"], crate::tls::Validity::Current);
            let addr = sandbox
                .serve_tls(local(), server)
                .await
                .unwrap_or_else(|e| panic!("sandbox TLS: {e}"));
            for name in o.tls {
                match config.providers.get_mut(*name) {
                    Some(ProviderConfig::Http(http)) => {
                        http.base_url = format!("https://localhost:{}", addr.port());
                        http.ca_file = Some(ca.ca_file().to_owned());
                    }
                    _ => panic!("FleetOptions::tls: no http provider {name}"),
                }
            }
            Some(ca)
        };
        let toml = config
            .to_toml()
            .unwrap_or_else(|e| panic!("test config: {e}"));
        let config_path = dir.join("oncely.toml");
        std::fs::write(&config_path, &toml).unwrap_or_else(|e| panic!("{e}"));
        // What the spawned processes will load (and validate): the same config.
        let loaded = Config::from_toml(&toml, "test", std::iter::empty())
            .unwrap_or_else(|e| panic!("test config: {e}"));
        assert_eq!(loaded, config, "the written config reads back differently");
        let conn = oncely_core::topology::connect(&config.broker, "oncely-test")
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ: {e}"));
        let channel = conn
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let topology = Topology::new(&config.broker);
        let actions: Vec<&str> = config.actions.keys().map(String::as_str).collect();
        topology
            .declare(&channel, &actions)
            .await
            .unwrap_or_else(|e| panic!("declare: {e}"));
        let data_keys_file = o.seal_payloads.then(|| {
            let path = dir.join("data-keys.toml");
            std::fs::write(
                &path,
                format!(
                    "[[key]]\nid = \"test-dk\"\nstate = \"current\"\nhex = \"{TEST_DATA_KEY}\"\n"
                ),
            )
            .unwrap_or_else(|e| panic!("{e}"));
            path
        });
        Fleet {
            db,
            sandbox,
            ca,
            prefix,
            dir,
            config_path,
            config,
            conn,
            channel,
            data_keys_file,
            least_privilege: None,
            pooled_url: None,
            hosts_url: None,
            spawned: Default::default(),
        }
    }

    /// Change the config every process spawned from now on reads (the file is written
    /// again; the processes already running keep theirs).
    pub fn reconfigure(&mut self, change: impl FnOnce(&mut Config)) {
        change(&mut self.config);
        let toml = self
            .config
            .to_toml()
            .unwrap_or_else(|e| panic!("test config: {e}"));
        std::fs::write(&self.config_path, toml).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Names for this fleet.
    pub fn topology(&self) -> Topology {
        Topology::new(&self.config.broker)
    }

    /// The secrets every process of the fleet gets: the key secret, and the data-key
    /// file when payloads are sealed.
    pub fn secrets_env(&self) -> Vec<(&'static str, std::ffi::OsString)> {
        let mut env = vec![("ONCELY_KEY_SECRET", SECRET.into())];
        if let Some(p) = &self.data_keys_file {
            env.push(("ONCELY_DATA_KEYS_FILE", p.clone().into_os_string()));
        }
        env
    }

    /// From now on every process of the fleet connects as its own kind's login (and
    /// broker user, when `broker` is the fleet's private node): `oncely-worker migrate
    /// --roles` on the fleet's database, then a login per group role.
    pub async fn least_privilege(&mut self, broker: Option<&crate::private_broker::PrivateBroker>) {
        let roles = crate::roles::DbRoles::create(&self.db).await;
        let logins =
            crate::roles::Logins::create(&roles, broker, &self.prefix, &self.config.broker.url)
                .await;
        self.least_privilege = Some((roles, logins));
    }

    /// From now on, every process and SDK producer reaches the fleet's database through
    /// `bouncer` (transaction pooling; `database_pooler = "transaction"`). Not with
    /// least privilege (the bouncer's users are the machine's).
    pub fn through_pooler(&mut self, bouncer: &crate::pgbouncer::Pgbouncer) {
        assert!(
            self.least_privilege.is_none(),
            "a pooled fleet runs on the machine's users"
        );
        self.pooled_url = Some(bouncer.url_for(&self.db.url));
    }

    /// From now on every process and SDK producer connects with the multi-host URL `url`
    /// (`postgres://u@primary,standby/db`: the writable host, followed through a
    /// failover), and so does the fleet's own pool (a failover watcher follows the
    /// promotion, so checks read the new primary).
    pub async fn on_hosts(&mut self, url: String) {
        assert!(
            self.pooled_url.is_none() && self.least_privilege.is_none(),
            "a multi-host fleet runs on the machine's users, without a pooler"
        );
        self.db.pool = oncely_core::db::connect(
            &url,
            &oncely_core::db::PoolSettings {
                max_connections: 16,
                ..oncely_core::db::PoolSettings::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("multi-host pool: {e}"));
        self.hosts_url = Some(url);
    }

    /// The connection environment of a process started with `subcommand` (`run`,
    /// `reconcile`, `admin`, `serve`…): its kind's login under least privilege, the
    /// pooler's URL through a pooler, else nothing (the config's URLs).
    pub fn role_env(&self, subcommand: &str) -> Vec<(&'static str, String)> {
        if let Some(url) = &self.hosts_url {
            return vec![("DATABASE_URL", url.clone())];
        }
        if let Some(url) = &self.pooled_url {
            return vec![
                ("DATABASE_URL", url.clone()),
                ("ONCELY_DATABASE_POOLER", "transaction".into()),
            ];
        }
        match (
            &self.least_privilege,
            crate::roles::Logins::role_of(subcommand),
        ) {
            (Some((_, logins)), Some(role)) => logins
                .env(role)
                .into_iter()
                .map(|(k, v)| (k, v.to_owned()))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The config an SDK producer of this fleet uses: the fleet's, with the producer's
    /// login and broker user under least privilege.
    pub fn producer_config(&self) -> Config {
        let mut config = self.config.clone();
        if let Some(url) = &self.hosts_url {
            config.database_url = url.clone();
        }
        if let Some(url) = &self.pooled_url {
            config.database_url = url.clone();
            config.database_pooler = oncely_core::config::DatabasePooler::Transaction;
        }
        if let Some((_, logins)) = &self.least_privilege {
            let role = oncely_core::roles::Role::Producer;
            config.database_url = logins.db[&role].clone();
            if let Some(url) = logins.amqp.get(&role) {
                config.broker.url = url.clone();
            }
        }
        config
    }

    /// The fleet's data keys, when payloads are sealed.
    pub fn data_keys(&self) -> Option<oncely_core::DataKeys> {
        self.data_keys_file
            .as_ref()
            .map(|p| oncely_core::DataKeys::load(p).unwrap_or_else(|e| panic!("data keys: {e}")))
    }

    /// An SDK producer for this fleet.
    pub async fn producer(&self) -> oncely_producer::Producer {
        oncely_producer::Producer::connect_with_data_keys(
            &self.producer_config(),
            secret(),
            self.data_keys(),
        )
        .await
        .unwrap_or_else(|e| panic!("producer: {e}"))
    }

    /// Spawn `oncely-worker <args…>` with this fleet's config; stderr goes to a log file.
    pub fn spawn(&self, args: &[&str]) -> Proc {
        self.spawn_with_env(args, &[])
    }

    /// [`Fleet::spawn`] with extra environment (e.g. `ONCELY_FAILPOINTS`).
    pub fn spawn_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Proc {
        self.spawn_program(&binary("oncely-worker"), args, env)
    }

    /// [`Fleet::spawn_with_env`] of another build of `oncely-worker` (e.g. the
    /// fail-point worker, [`crate::failpoint_worker::path`]).
    pub fn spawn_program(&self, program: &Path, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let n = self
            .spawned
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = self.dir.join(format!(
            "{}-{n}.log",
            args.first().copied().unwrap_or("proc")
        ));
        let file = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}"));
        let child = Command::new(program)
            .arg("--config")
            .arg(&self.config_path)
            .args(args)
            .envs(self.secrets_env())
            .envs(self.role_env(args.first().copied().unwrap_or_default()))
            .env("ONCELY_LOG_FORMAT", "json")
            .env(
                "RUST_LOG",
                std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn oncely-worker: {e}"));
        Proc { child, log }
    }

    /// `a` and `b` enqueued at once by two SDK producers; how many were new (recorded by
    /// this call, not duplicates), every enqueue checked.
    pub async fn enqueue_from_two(
        &self,
        a: Vec<oncely_core::Intent>,
        b: Vec<oncely_core::Intent>,
    ) -> usize {
        let (pa, pb) = (self.producer().await, self.producer().await);
        let (ra, rb) = tokio::join!(pa.enqueue_many(a), pb.enqueue_many(b));
        ra.expect("producer a")
            .into_iter()
            .chain(rb.expect("producer b"))
            .map(|r| r.expect("enqueue"))
            .filter(|r| matches!(r, oncely_producer::Enqueued::Enqueued { .. }))
            .count()
    }

    /// Spawn an action worker.
    pub fn worker(&self) -> Proc {
        self.spawn(&["run"])
    }

    /// Spawn a reconciler (with its sweeper).
    pub fn reconciler(&self) -> Proc {
        self.spawn(&["reconcile"])
    }

    /// Run `oncely-worker admin <args…>` to completion: (exit code, stdout, stderr).
    pub async fn admin(&self, args: &[&str]) -> (i32, String, String) {
        self.admin_with_env(args, &[]).await
    }

    /// [`Fleet::admin`] with extra environment (e.g. the admin role's `DATABASE_URL`).
    pub async fn admin_with_env(
        &self,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, String, String) {
        let out = Command::new(binary("oncely-worker"))
            .arg("--config")
            .arg(&self.config_path)
            .envs(self.secrets_env())
            .envs(self.role_env("admin"))
            .arg("admin")
            .args(args)
            .envs(env.iter().copied())
            .output()
            .await
            .unwrap_or_else(|e| panic!("admin: {e}"));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The operation for a key.
    pub async fn op(
        &self,
        key: &oncely_core::IdempotencyKey,
    ) -> Option<oncely_core::journal::Operation> {
        self.db
            .journal()
            .get(key)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Publish raw bytes to the actions exchange with `routing_key` (confirmed).
    pub async fn publish_raw(&self, routing_key: &str, body: &[u8]) {
        let ch = self
            .conn
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        ch.confirm_select(Default::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let confirm = ch
            .basic_publish(
                self.topology().actions_exchange().into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(confirm, lapin::Confirmation::Ack(None)),
            "publish not routed: {confirm:?}"
        );
        let _ = ch.close(200, "done".into()).await;
    }

    /// Listen to the outcomes exchange for routing keys matching `pattern`
    /// (`email.send.*`, `#`) on an exclusive queue of this test; read with
    /// [`next_outcome`].
    pub async fn listen_outcomes(&self, pattern: &str) -> lapin::Consumer {
        use lapin::options::{BasicConsumeOptions, QueueBindOptions};
        let q = unique_name(&format!("{}.listener", self.prefix));
        self.channel
            .queue_declare(
                q.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("queue");
        self.channel
            .queue_bind(
                q.as_str().into(),
                self.topology().outcomes_exchange().into(),
                pattern.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind");
        self.channel
            .basic_consume(
                q.as_str().into(),
                "listener".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("consume")
    }

    /// Ready messages in a queue (passive declare).
    pub async fn ready(&self, queue: &str) -> u32 {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("{queue}: {e}"));
        q.message_count()
    }

    /// Ready + unacknowledged messages of a queue, from `rabbitmqctl` (the broker's view).
    pub fn depth(&self, queue: &str) -> (u64, u64) {
        let out = std::process::Command::new("rabbitmqctl")
            .args([
                "-q",
                "list_queues",
                "name",
                "messages_ready",
                "messages_unacknowledged",
            ])
            .output()
            .unwrap_or_else(|e| panic!("rabbitmqctl: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.len() == 3 && cols[0] == queue {
                return (
                    cols[1].parse().unwrap_or(u64::MAX),
                    cols[2].parse().unwrap_or(u64::MAX),
                );
            }
        }
        panic!("queue {queue} not listed by rabbitmqctl");
    }

    /// Count of operations in a status.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM agent_operations WHERE status = $1")
            .bind(status)
            .fetch_one(&self.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let topology = self.topology();
        let actions: Vec<String> = self.config.actions.keys().cloned().collect();
        let channel = self.channel.clone();
        let broker = self.config.broker.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                // The test's own channel may be closed by then: use a fresh connection.
                let _ = channel;
                let conn = oncely_core::topology::connect(&broker, "oncely-test-cleanup")
                    .await
                    .ok()?;
                let ch = conn.create_channel().await.ok()?;
                let refs: Vec<&str> = actions.iter().map(String::as_str).collect();
                let _ = topology.delete(&ch, &refs).await;
                let _ = conn.close(200, "bye".into()).await;
                Some(())
            })
        })
        .join();
        // Keep the logs of a failed test for reading.
        if std::thread::panicking() {
            eprintln!("fleet logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The next outcome a [`Fleet::listen_outcomes`] consumer hears: its routing key and
/// body. Panics after 30 s without one.
pub async fn next_outcome(c: &mut lapin::Consumer) -> (String, serde_json::Value) {
    use futures_util::StreamExt;
    let d = tokio::time::timeout(Duration::from_secs(30), c.next())
        .await
        .expect("an outcome in time")
        .expect("stream")
        .expect("delivery");
    (
        d.routing_key.to_string(),
        serde_json::from_slice(&d.data).expect("json"),
    )
}
