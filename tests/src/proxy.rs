//! A TCP proxy that can be cut: every open connection is closed and new ones are closed
//! at once, until it is restored. Used to take Postgres "down" for one process without
//! stopping the server the other tests share. It can also be frozen: connections stay
//! open and nothing is forwarded either way (a partition without resets, or a server that
//! stops answering).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A cuttable proxy to `127.0.0.1:upstream`.
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect.
    pub port: u16,
    up: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Start proxying to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("proxy: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let (frozen, _) = watch::channel(false);
        let (up2, gen2, frozen2) = (up.clone(), generation.clone(), frozen.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cut = gen2.subscribe();
                let mut freeze = frozen2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                        _ = async { let _ = freeze.wait_for(|f| *f).await; } => {
                            // Hold both sockets open, forward nothing, until cut or dropped.
                            let _ = cut.changed().await;
                        }
                    }
                });
            }
        });
        Proxy {
            port,
            up,
            generation,
            frozen,
            task,
        }
    }

    /// Close every connection and refuse new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Stop forwarding, keeping every connection open: the other side stops answering.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Accept connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
