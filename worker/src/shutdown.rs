//! Shutdown as a value passed in (mini-redis style): a watch channel that flips once.
//!
//! Binaries make one from SIGTERM/SIGINT; tests and the demo make one they trigger
//! themselves. Every loop selects on [`Shutdown::wait`].

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
