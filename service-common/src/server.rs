//! Serving a router on a TCP listener with bounded connections, used by all three binaries instead
//! of `axum::serve`, which has no header-read timeout, no idle timeout and no connection cap.
//!
//! - **Connection cap** (`http.max_connections`): a semaphore taken on accept. A connection accepted
//!   beyond the cap is closed at once (the client sees EOF or a reset immediately, rather than
//!   hanging in the listen backlog) and counted as a `connection_cap` refusal.
//! - **Header-read timeout** (`http.header_read_timeout_ms`): once a connection with no request in
//!   flight has sent the first byte of a request, its head must be complete within this time, or
//!   the connection is closed (`header_timeout` refusal). A slow or partial request cannot hold a
//!   connection.
//! - **Idle timeout** (`http.idle_timeout_ms`): a connection that sends nothing, whether new or kept
//!   alive after its last answer, is closed after this time.
//! - **Admission limit** (`http.max_concurrency`), checked before the request enters the router:
//!   a request beyond it is answered 503 with `Retry-After` at once, without the request id,
//!   tracing span and tower stack of an admitted one, so that refusing costs as little as possible
//!   when refusals are most of the traffic. The probes (`/healthz`, `/readyz`, `/metrics`) are
//!   not counted: they are cheap, and an overloaded service must still say that it is alive,
//!   rather than be restarted or taken out of rotation for answering 503 to its probe.
//! - `TCP_NODELAY` on every connection: small JSON answers leave at once rather than wait for
//!   Nagle's algorithm.
//! - Graceful shutdown: when `shutdown` resolves, the listener stops accepting, idle connections
//!   close, and requests in flight finish before [`serve`] returns.
//!
//! HTTP/1.1 only: every client of these services (reqwest without HTTP/2, curl, the probes) speaks
//! it, and HTTP/2's prior-knowledge detection would read the connection preface before any of
//! these timeouts apply.

use crate::layers::LayerConfig;
use crate::refusals::{self, Refusal};
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

/// The transport limits of [`serve`], from a service's `[http]` section.
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_concurrency: usize,
    max_connections: usize,
    header_read_timeout: Duration,
    idle_timeout: Duration,
}

impl From<&LayerConfig> for Limits {
    fn from(config: &LayerConfig) -> Self {
        Limits {
            max_concurrency: config.max_concurrency.clamp(1, Semaphore::MAX_PERMITS),
            // The semaphore's own maximum is far above any sensible cap; clamp rather than panic.
            max_connections: config.max_connections.clamp(1, Semaphore::MAX_PERMITS),
            header_read_timeout: Duration::from_millis(config.header_read_timeout_ms.max(1)),
            idle_timeout: Duration::from_millis(config.idle_timeout_ms.max(1)),
        }
    }
}

/// Binds `addr` for [`serve`].
pub async fn bind(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `router` (already wrapped in [`crate::layers::apply`]) on `listener` with the connection
/// limits of `config` until `shutdown` resolves, then waits for the connections to finish.
pub async fn serve<F>(listener: TcpListener, router: Router, config: &LayerConfig, shutdown: F) -> io::Result<()>
where
    F: Future<Output = ()>,
{
    let limits = Limits::from(config);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let admission = Arc::new(Semaphore::new(limits.max_concurrency));
    let (stop_sender, stop) = watch::channel(false);
    let reporter = tokio::spawn(refusals::report_every_second());
    let trimmer = tokio::spawn(give_freed_memory_back(Arc::clone(&permits), limits.max_connections));
    let mut shutdown = pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Out of file descriptors or memory, or a connection reset before it was accepted:
                // back off briefly (as axum::serve does) instead of spinning on the same error.
                tracing::debug!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            refusals::record(Refusal::ConnectionCap);
            drop(stream);
            continue;
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        tokio::spawn(serve_connection(stream, router.clone(), Arc::clone(&admission), limits, stop.clone(), permit));
    }
    drop(listener);
    let _ = stop_sender.send(true);
    // Every connection holds a permit until it ends: having them all back means all are done.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _all_closed = permits.acquire_many(all).await;
    reporter.abort();
    trimmer.abort();
    Ok(())
}

/// A burst that opened at least this many connections is worth giving memory back after.
const TRIM_AFTER_CONNECTIONS: usize = 64;

/// Freed memory is given back at least this often, burst or not.
const TRIM_EVERY: Duration = Duration::from_secs(60);

/// Gives freed memory back to the operating system: once a burst of connections has gone (when at
/// most half of the recent peak of open connections remain), and every [`TRIM_EVERY`]. glibc keeps
/// freed memory in its per-thread arenas, so without this the resident size follows the highest
/// working set the process ever had, not the one it has: it ratchets up with every burst of
/// connections (docs/benchmarks.md, "Overload") and, in a soak, with every high of the running
/// VMs an allocator holds and every model bundle swapped out (docs/benchmarks.md, "Soak").
async fn give_freed_memory_back(permits: Arc<Semaphore>, max_connections: usize) {
    let mut peak = 0;
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut trimmed = tokio::time::Instant::now();
    loop {
        ticker.tick().await;
        let open = max_connections.saturating_sub(permits.available_permits());
        peak = peak.max(open);
        let burst_over = peak >= TRIM_AFTER_CONNECTIONS && open <= peak / 2;
        if burst_over || trimmed.elapsed() >= TRIM_EVERY {
            // Walks every arena: off the async workers.
            let _ = tokio::task::spawn_blocking(release_free_memory).await;
            peak = open;
            trimmed = tokio::time::Instant::now();
        }
    }
}

/// Returns free heap pages to the operating system (glibc's `malloc_trim`); nothing elsewhere.
/// Walks every arena: call it off the async workers, after something large was freed (a burst's
/// connections, a retired model bundle).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists under its locks; it takes no
    // pointer and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Turns glibc's fast bins off (`mallopt(M_MXFAST, 0)`) for a process whose heap holds millions of
/// small records that come and go (the allocator's VMs, their repredictions, their hosts' vectors);
/// nothing elsewhere. Call it first in `main`, before any thread starts.
///
/// Why: freed small chunks wait in the fast bins unmerged, and glibc merges all of them at once
/// (`malloc_consolidate`) whenever a request finds neither a bin nor room at the heap's top, which
/// in such a heap is often: a fifth of a NILAS placement's samples at 100,000 hosts, and most of
/// its p99 (docs/benchmarks.md, "glibc's fast bins"). The per-thread cache (tcache) still serves
/// the small requests that repeat, so the common case does not slow down.
pub fn tune_malloc_for_churn() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt changes the allocator's own settings under its lock and takes no pointer.
    unsafe {
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

/// What ended a connection early.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expiry {
    HeaderTimeout,
    Idle,
}

/// Where a connection is between requests, shared by its I/O wrapper, its service and its watchdog.
#[derive(Debug)]
struct Activity {
    /// Requests whose head was read and whose answer is not yet ready.
    in_flight: usize,
    /// Since when no request has been in flight (the connection's start, or its last answer).
    waiting_since: Instant,
    /// The first byte read while no request was in flight: a request head has begun.
    head_started: Option<Instant>,
}

#[derive(Clone, Debug)]
struct SharedActivity(Arc<Mutex<Activity>>);

impl SharedActivity {
    fn new() -> Self {
        SharedActivity(Arc::new(Mutex::new(Activity {
            in_flight: 0,
            waiting_since: Instant::now(),
            head_started: None,
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Activity> {
        // The state is a few plain fields updated in single statements: usable even if a holder panicked.
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bytes_read(&self) {
        let mut activity = self.lock();
        if activity.in_flight == 0 && activity.head_started.is_none() {
            activity.head_started = Some(Instant::now());
        }
    }

    fn request_started(&self) {
        let mut activity = self.lock();
        activity.in_flight += 1;
        activity.head_started = None;
    }

    fn request_answered(&self) {
        let mut activity = self.lock();
        activity.in_flight = activity.in_flight.saturating_sub(1);
        if activity.in_flight == 0 {
            activity.waiting_since = Instant::now();
        }
    }

    /// Resolves when the connection has waited too long for a request head, or sat idle too long.
    async fn expired(&self, limits: Limits) -> Expiry {
        loop {
            let (deadline, expiry) = {
                let activity = self.lock();
                if activity.in_flight > 0 {
                    // The request timeout bounds a request in flight; look again later.
                    (Instant::now() + limits.header_read_timeout.min(limits.idle_timeout), None)
                } else if let Some(started) = activity.head_started {
                    (started + limits.header_read_timeout, Some(Expiry::HeaderTimeout))
                } else {
                    (activity.waiting_since + limits.idle_timeout, Some(Expiry::Idle))
                }
            };
            if let Some(expiry) = expiry.filter(|_| Instant::now() >= deadline) {
                return expiry;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A TCP stream that tells its connection's [`Activity`] when bytes arrive.
struct WatchedStream {
    stream: TcpStream,
    activity: SharedActivity,
}

impl AsyncRead for WatchedStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        result
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Routes that answer from memory and that orchestrators poll: never refused for overload.
fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// Serves one connection until the client closes it, it expires, or the server shuts down.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    admission: Arc<Semaphore>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let activity = SharedActivity::new();
    let io = TokioIo::new(WatchedStream { stream, activity: activity.clone() });
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        service_activity.request_started();
        let answered = AnsweredOnDrop(service_activity.clone());
        let admitted = Arc::clone(&admission).try_acquire_owned().ok();
        let response = (admitted.is_some() || is_probe(request.uri().path())).then(|| router.clone().oneshot(request));
        async move {
            let response = match response {
                Some(response) => response.await,
                None => {
                    refusals::record(Refusal::Overloaded);
                    Ok(crate::layers::overloaded())
                }
            };
            // The request leaves the admission limit when its answer is ready, as with tower's
            // concurrency limit.
            drop(admitted);
            drop(answered);
            response
        }
    });
    let connection = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    let mut connection = pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    // Clients that vanish mid-request are routine; nothing for an operator to do.
                    tracing::debug!(%error, "connection ended with an error");
                }
                return;
            }
            changed = stop.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    // Finishes the request in flight, if any, then closes.
                    connection.as_mut().graceful_shutdown();
                }
            }
            expiry = activity.expired(limits) => {
                if expiry == Expiry::HeaderTimeout {
                    refusals::record(Refusal::HeaderTimeout);
                }
                // No request in flight: dropping the connection closes it.
                return;
            }
        }
    }
}

/// Marks the request answered when its handler finishes, or when hyper drops it unfinished (the
/// client went away), so that a connection never counts a request in flight forever.
struct AnsweredOnDrop(SharedActivity);

impl Drop for AnsweredOnDrop {
    fn drop(&mut self) {
        self.0.request_answered();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_concurrency: 1,
            max_connections: 1,
            header_read_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(300),
        }
    }

    #[tokio::test]
    async fn a_silent_connection_expires_as_idle() {
        let activity = SharedActivity::new();
        let started = Instant::now();
        assert_eq!(activity.expired(limits()).await, Expiry::Idle);
        assert!(started.elapsed() >= Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_started_head_expires_after_the_header_timeout() {
        let activity = SharedActivity::new();
        activity.bytes_read();
        let started = Instant::now();
        assert_eq!(activity.expired(limits()).await, Expiry::HeaderTimeout);
        assert!(started.elapsed() < Duration::from_millis(300));
    }

    #[tokio::test]
    async fn a_request_in_flight_never_expires() {
        let activity = SharedActivity::new();
        activity.bytes_read();
        activity.request_started();
        let expired = tokio::time::timeout(Duration::from_secs(1), activity.expired(limits())).await;
        assert!(expired.is_err(), "a connection with a request in flight expired");
        activity.request_answered();
        assert_eq!(activity.expired(limits()).await, Expiry::Idle);
    }
}
