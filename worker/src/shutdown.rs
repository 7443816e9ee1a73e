//! Shutdown as a value passed in (mini-redis style): a watch channel that flips once.
//!
//! Binaries make one from SIGTERM/SIGINT; tests and the demo make one they trigger
//! themselves. Every loop selects on [`Shutdown::wait`]; [`supervise`] rebuilds a broker
//! session until shutdown.

use tokio::sync::watch;

/// The receiving side: clone it into every task.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// The sending side.
#[derive(Debug)]
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    /// Ask everything to stop.
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

impl Shutdown {
    /// A new pair.
    pub fn new() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (Trigger(tx), Shutdown(rx))
    }

    /// One that fires on SIGTERM or SIGINT (Ctrl-C).
    pub fn on_signals() -> Shutdown {
        let (trigger, shutdown) = Self::new();
        tokio::spawn(async move {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot listen for SIGTERM");
                        return;
                    }
                };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            }
            trigger.fire();
            // Keep the sender alive so receivers see `true`, not a closed channel.
            std::future::pending::<()>().await;
        });
        shutdown
    }

    /// Whether it has fired.
    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolve once it fires (or its trigger is dropped).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|v| *v).await;
    }
}

/// Run `session` until shutdown, rebuilding it with a backoff whenever it ends with an
/// error (the broker connection died). The backoff starts afresh after a session that
/// lived a while; the warning is logged once per doubling, not per attempt.
pub async fn supervise<F, Fut>(
    what: &'static str,
    mut shutdown: Shutdown,
    mut session: F,
) -> anyhow::Result<()>
where
    F: FnMut(Shutdown) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut failures = 0u32;
    loop {
        if shutdown.is_triggered() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        match session(shutdown.clone()).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                if started.elapsed() > std::time::Duration::from_secs(30) {
                    failures = 0;
                }
                failures += 1;
                let delay = std::time::Duration::from_millis(200 * u64::from(failures.min(25)));
                if failures == 1 || failures.is_power_of_two() {
                    tracing::warn!(process = what, error = %e, failures, retry_in = ?delay, "broker session ended; reconnecting");
                }
                metrics::counter!(oncely_core::metrics::CONNECTIONS, "kind" => "amqp", "result" => "lost").increment(1);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait() => return Ok(()),
                }
            }
        }
    }
}
