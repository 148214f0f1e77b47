//! A TCP proxy under a test's control, between one agent and PostgreSQL, to partition them: it
//! passes bytes both ways, holds them (`hold`: nothing flows either way and the connections stay
//! open, as while packets are dropped and TCP retransmits; what was sent flows once healed), or
//! cuts (`cut`: every connection reset at once, and new ones reset as soon as they are accepted,
//! until healed).

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PASS: u8 = 0;
const HOLD: u8 = 1;
const CUT: u8 = 2;

struct Shared {
    mode: AtomicU8,
    /// Bumped by every cut: a connection opened before it is reset.
    cuts: AtomicU64,
}

/// A running proxy; it stops with the test's runtime.
pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared { mode: AtomicU8::new(PASS), cuts: AtomicU64::new(0) });
        let accepting = Arc::clone(&shared);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let shared = Arc::clone(&accepting);
                tokio::spawn(async move {
                    if shared.mode.load(Ordering::SeqCst) == CUT {
                        reset(client);
                        return;
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        reset(client);
                        return;
                    };
                    relay(client, server, shared).await;
                });
            }
        });
        Proxy { port, shared }
    }

    /// Nothing flows until [`Proxy::heal`]; the connections stay open.
    pub fn hold(&self) {
        self.shared.mode.store(HOLD, Ordering::SeqCst);
    }

    /// Every connection reset now, and every new one until [`Proxy::heal`].
    pub fn cut(&self) {
        self.shared.mode.store(CUT, Ordering::SeqCst);
        self.shared.cuts.fetch_add(1, Ordering::SeqCst);
    }

    pub fn heal(&self) {
        self.shared.mode.store(PASS, Ordering::SeqCst);
    }
}

/// Closes with a TCP reset, as a cut connection ends. (`set_linger` is deprecated because a
/// positive linger blocks the dropping thread; a zero linger resets at once and never blocks.)
#[allow(deprecated)]
fn reset(stream: TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Copies both ways in small steps, checking the proxy's mode before each step.
async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let opened_at = shared.cuts.load(Ordering::SeqCst);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        // Held: wait, reading nothing, so the peers' writes stay in the kernel's buffers.
        while shared.mode.load(Ordering::SeqCst) == HOLD {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if shared.cuts.load(Ordering::SeqCst) != opened_at {
            break;
        }
        tokio::select! {
            read = client_read.read(&mut up) => match read {
                Ok(n) if n > 0 && server_write.write_all(&up[..n]).await.is_ok() => {}
                _ => break,
            },
            read = server_read.read(&mut down) => match read {
                Ok(n) if n > 0 && client_write.write_all(&down[..n]).await.is_ok() => {}
                _ => break,
            },
            // Wake up now and then to notice a hold or a cut.
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    if let (Ok(client), Ok(server)) = (client_read.reunite(client_write), server_read.reunite(server_write)) {
        reset(client);
        reset(server);
    }
}
