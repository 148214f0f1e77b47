//! A latency-injecting TCP proxy: the round trip between lab hosts, since this kernel has no
//! `netem` (what toxiproxy's latency toxic does, in process).
//!
//! Each accepted connection is forwarded to one upstream address. Each direction is a queue of
//! timestamped chunks: bytes read at time `t` are written at `t + delay + U[0, jitter]`, but never
//! before the chunk read ahead of them, so jitter can hold bytes back and never reorders them. The
//! end of a stream (FIN) is queued like data, so it arrives after the last byte, delayed the same.
//! The delay is a floor: the wait is measured with a timerfd (microseconds late, not tokio's 1 ms
//! tick), and a round trip through the proxy takes at least twice the delay plus what the two
//! endpoints take.
//!
//! The proxy runs on a thread of its own with a current-thread tokio runtime, so it serves
//! whether the caller is synchronous or async, and it runs in the network namespace of a lab host
//! ([`DelayProxy::start_in`]): it listens there and connects upstream from there. Put it on the
//! path: e.g. in the database's host, listening on another port of the host's address and
//! forwarding to the database's own port, with the agents connecting to the proxy's port; or in a
//! host of its own ("a proxy host" between clients and server).
//!
//! Faults: [`DelayProxy::cut`] stops forwarding (an application-level partition: open connections
//! hang with their bytes held; new connections are accepted but get nothing, not even an upstream
//! connection, until [`DelayProxy::heal`], which delivers what was held). The TCP connections
//! themselves stay healthy with the proxy, so keepalives and retransmission timeouts do *not*
//! fire: for those, take a host's link down ([`crate::Lab::link_down`]). [`DelayProxy::close_all`]
//! resets every connection (RST both ways), like a proxy or middlebox restarting.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use crate::error::ProxyError;
use crate::lab::Host;
use crate::netns;
use crate::timer::PreciseTimer;

/// The most bytes one read takes, and so one queued chunk holds.
const CHUNK: usize = 64 * 1024;

/// Chunks in flight per direction (up to 16 MiB); a full queue stops reading, so a fast sender
/// feels back-pressure as through a real path with a bounded bandwidth-delay product.
const QUEUE_CHUNKS: usize = 256;

/// The jitter's default seed: runs are repeatable unless asked otherwise.
const DEFAULT_SEED: u64 = 0x6e65_746c_6162; // "netlab"

/// How a [`DelayProxy`] delays: the same one-way delay and jitter on each direction, drawn
/// independently per direction and connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The fixed one-way delay: a round trip gets it twice.
    pub delay: Duration,
    /// Each chunk's extra delay is uniform in `[0, jitter]` (never reordering bytes).
    pub jitter: Duration,
    /// Seed of the jitter's random draws.
    pub seed: u64,
}

impl ProxyConfig {
    /// A fixed one-way delay, no jitter.
    pub fn delay(delay: Duration) -> Self {
        ProxyConfig { delay, jitter: Duration::ZERO, seed: DEFAULT_SEED }
    }

    /// With uniform jitter in `[0, jitter]` on top of the delay.
    pub fn with_jitter(self, jitter: Duration) -> Self {
        ProxyConfig { jitter, ..self }
    }

    /// With another seed for the jitter.
    pub fn with_seed(self, seed: u64) -> Self {
        ProxyConfig { seed, ..self }
    }
}

impl Default for ProxyConfig {
    /// No delay: a plain forwarding proxy (still with `cut` and `close_all`).
    fn default() -> Self {
        ProxyConfig::delay(Duration::ZERO)
    }
}

/// A [`DelayProxy`]'s counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted since the start.
    pub connections_accepted: u64,
    /// Connections open now (accepted, not yet closed).
    pub connections_active: u64,
    /// Accepted connections whose upstream connect failed (the client was reset).
    pub upstream_failures: u64,
    /// Bytes written to the upstream, all connections together.
    pub bytes_to_upstream: u64,
    /// Bytes written back to the clients.
    pub bytes_to_client: u64,
}

/// What the caller's handle and the proxy's thread share.
struct Shared {
    upstream: SocketAddr,
    delay_ns: AtomicU64,
    jitter_ns: AtomicU64,
    seed: u64,
    cut: watch::Sender<bool>,
    /// Bumped by `close_all`: every connection open at that moment resets.
    close: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
    accepted: AtomicU64,
    active: AtomicU64,
    upstream_failures: AtomicU64,
    to_upstream: AtomicU64,
    to_client: AtomicU64,
}

impl Shared {
    fn one_way(&self, rng: &mut SplitMix64) -> Duration {
        let delay = self.delay_ns.load(Ordering::Relaxed);
        let jitter = self.jitter_ns.load(Ordering::Relaxed);
        let extra = if jitter == 0 { 0 } else { rng.next() % (jitter + 1) };
        Duration::from_nanos(delay.saturating_add(extra))
    }
}

/// A latency-injecting TCP proxy (see the module docs). Dropping it stops it: its listener closes
/// and its connections close.
pub struct DelayProxy {
    shared: Arc<Shared>,
    local_addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for DelayProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelayProxy")
            .field("local_addr", &self.local_addr)
            .field("upstream", &self.shared.upstream)
            .field("stats", &self.stats())
            .finish()
    }
}

impl DelayProxy {
    /// Starts a proxy in the calling thread's network namespace (e.g. on loopback), listening on
    /// `listen` (port 0: any free port, see [`DelayProxy::local_addr`]) and forwarding to `upstream`.
    pub fn start(listen: SocketAddr, upstream: SocketAddr, config: ProxyConfig) -> Result<DelayProxy, ProxyError> {
        DelayProxy::launch(None, listen, upstream, config)
    }

    /// Starts a proxy inside `host`'s namespace: it listens on `listen` there (usually an address
    /// of `host`, e.g. `host.socket_addr(15432)`) and connects to `upstream` from there.
    pub fn start_in(
        host: &Host,
        listen: SocketAddr,
        upstream: SocketAddr,
        config: ProxyConfig,
    ) -> Result<DelayProxy, ProxyError> {
        let file = netns::open(host.netns())?;
        DelayProxy::launch(Some((file, host.netns().to_owned())), listen, upstream, config)
    }

    fn launch(
        namespace: Option<(File, String)>,
        listen: SocketAddr,
        upstream: SocketAddr,
        config: ProxyConfig,
    ) -> Result<DelayProxy, ProxyError> {
        let shared = Arc::new(Shared {
            upstream,
            delay_ns: AtomicU64::new(nanos(config.delay)),
            jitter_ns: AtomicU64::new(nanos(config.jitter)),
            seed: config.seed,
            cut: watch::Sender::new(false),
            close: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            accepted: AtomicU64::new(0),
            active: AtomicU64::new(0),
            upstream_failures: AtomicU64::new(0),
            to_upstream: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
        });
        let (started_tx, started_rx) = std::sync::mpsc::sync_channel::<Result<SocketAddr, ProxyError>>(1);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("delay-proxy {listen}"))
            .spawn(move || {
                if let Some((file, name)) = namespace {
                    if let Err(e) = netns::enter(&file, &name) {
                        let _ = started_tx.send(Err(e.into()));
                        return;
                    }
                }
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started_tx.send(Err(ProxyError::Runtime(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let bound = TcpListener::bind(listen).await.and_then(|l| Ok((l.local_addr()?, l)));
                    let listener = match bound {
                        Ok((local, listener)) => {
                            let _ = started_tx.send(Ok(local));
                            listener
                        }
                        Err(source) => {
                            let _ = started_tx.send(Err(ProxyError::Bind { addr: listen, source }));
                            return;
                        }
                    };
                    serve(listener, thread_shared).await;
                });
                // Dropping the runtime here drops every connection task, closing their sockets.
            })
            .map_err(ProxyError::Runtime)?;
        match started_rx.recv() {
            Ok(Ok(local_addr)) => Ok(DelayProxy { shared, local_addr, thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(ProxyError::Exited)
            }
        }
    }

    /// Where the proxy listens (with the port chosen if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Changes the one-way delay and jitter for bytes read from now on (bytes already queued keep
    /// their times; order is kept either way).
    pub fn set_delay(&self, delay: Duration, jitter: Duration) {
        self.shared.delay_ns.store(nanos(delay), Ordering::Relaxed);
        self.shared.jitter_ns.store(nanos(jitter), Ordering::Relaxed);
    }

    /// Stops forwarding: open connections hang (their bytes are held), new connections are
    /// accepted but get nothing until [`DelayProxy::heal`]. Only the application sees the
    /// partition: see the module docs.
    pub fn cut(&self) {
        self.shared.cut.send_replace(true);
    }

    /// Resumes forwarding: held bytes go on at once (their delay has passed) and held connections
    /// connect upstream.
    pub fn heal(&self) {
        self.shared.cut.send_replace(false);
    }

    /// Whether the proxy is cut.
    pub fn is_cut(&self) -> bool {
        *self.shared.cut.borrow()
    }

    /// Resets every connection open now, both sides (RST, so reads fail with "connection reset"),
    /// dropping whatever was queued. The proxy goes on accepting.
    pub fn close_all(&self) {
        self.shared.close.send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    /// The counters now.
    pub fn stats(&self) -> ProxyStats {
        let shared = &self.shared;
        ProxyStats {
            connections_accepted: shared.accepted.load(Ordering::Relaxed),
            connections_active: shared.active.load(Ordering::Relaxed),
            upstream_failures: shared.upstream_failures.load(Ordering::Relaxed),
            bytes_to_upstream: shared.to_upstream.load(Ordering::Relaxed),
            bytes_to_client: shared.to_client.load(Ordering::Relaxed),
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        if let Some(thread) = self.thread.take() {
            // The accept loop watches `shutdown`, so this returns promptly.
            let _ = thread.join();
        }
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut next_id = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    // Subscribed here, at accept, so a close_all after this point reaches it.
                    let close = shared.close.subscribe();
                    next_id += 1;
                    tokio::spawn(connection(client, Arc::clone(&shared), close, next_id));
                }
                // E.g. out of descriptors: wait a little instead of spinning on the error.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
    }
}

/// Counts a connection as active while it lives.
struct Active<'a>(&'a AtomicU64);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(mut client: TcpStream, shared: Arc<Shared>, mut close: watch::Receiver<u64>, id: u64) {
    shared.accepted.fetch_add(1, Ordering::Relaxed);
    shared.active.fetch_add(1, Ordering::Relaxed);
    let _active = Active(&shared.active);
    // The proxy adds its delay and nothing else: no Nagle waiting on small writes.
    let _ = client.set_nodelay(true);
    let mut cut = shared.cut.subscribe();
    let connected = tokio::select! {
        _ = close.changed() => {
            reset(&client);
            return;
        }
        connected = async {
            // A cut path: accepted, but not even the upstream connect happens until healed.
            let _ = cut.wait_for(|cut| !*cut).await;
            TcpStream::connect(shared.upstream).await
        } => connected,
    };
    let mut server = match connected {
        Ok(server) => server,
        Err(_) => {
            shared.upstream_failures.fetch_add(1, Ordering::Relaxed);
            reset(&client);
            return;
        }
    };
    let _ = server.set_nodelay(true);
    let clean = {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let seed = shared.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let to_upstream = pump(&mut client_read, &mut server_write, &shared, seed, &shared.to_upstream);
        let to_client = pump(&mut server_read, &mut client_write, &shared, seed ^ 1, &shared.to_client);
        tokio::select! {
            both = async { tokio::try_join!(to_upstream, to_client) } => both.is_ok(),
            _ = close.changed() => false,
        }
    };
    if !clean {
        // close_all, or one side failed (e.g. reset by its peer): the other side learns it as a reset.
        reset(&client);
        reset(&server);
    }
    // Dropping the streams closes them: after a clean end both FINs have been passed on already.
}

/// Makes the coming close send RST instead of FIN.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// One queued chunk; `None` is the end of the stream (FIN), queued like data to keep its place.
struct Chunk {
    due: Instant,
    data: Option<Vec<u8>>,
}

/// One direction: a reader that stamps each chunk with its due time, a writer that waits for it.
async fn pump(
    from: &mut ReadHalf<'_>,
    to: &mut WriteHalf<'_>,
    shared: &Shared,
    seed: u64,
    forwarded: &AtomicU64,
) -> io::Result<()> {
    let (queue, mut queued) = mpsc::channel::<Chunk>(QUEUE_CHUNKS);
    let mut cut = shared.cut.subscribe();
    let reading = async move {
        let mut rng = SplitMix64(seed);
        let mut buffer = vec![0u8; CHUNK];
        let mut last_due = Instant::now();
        loop {
            let n = from.read(&mut buffer).await?;
            // Never before the chunk ahead: jitter holds bytes back, it does not reorder them.
            let due = (Instant::now() + shared.one_way(&mut rng)).max(last_due);
            last_due = due;
            let data = (n > 0).then(|| buffer[..n].to_vec());
            let end = data.is_none();
            if queue.send(Chunk { due, data }).await.is_err() || end {
                // The writer is gone (it failed, and said so) or the stream ended.
                return Ok::<(), io::Error>(());
            }
        }
    };
    let writing = async move {
        let mut timer = PreciseTimer::new()?;
        while let Some(chunk) = queued.recv().await {
            timer.sleep_until(chunk.due).await?;
            let _ = cut.wait_for(|cut| !*cut).await;
            match chunk.data {
                Some(data) => {
                    to.write_all(&data).await?;
                    forwarded.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                None => {
                    to.shutdown().await?;
                    break;
                }
            }
        }
        Ok::<(), io::Error>(())
    };
    tokio::try_join!(reading, writing).map(|_| ())
}

/// The jitter's random numbers (SplitMix64): tiny, seeded, good enough for uniform delays.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}
