//! A TCP proxy that can be cut: every open connection is closed and new ones are closed
//! at once, until it is restored. Used to take Postgres "down" for one process without
//! stopping the server the other tests share.

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
        let (up2, gen2) = (up.clone(), generation.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut cut = gen2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            port,
            up,
            generation,
            task,
        }
    }

    /// Close every connection and refuse new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
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
