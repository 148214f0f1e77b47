//! Overload of `POST /allocate` through the real stack on loopback: what admitted requests and
//! refused ones see when the offered load is several times what the stack can serve, how fast the
//! stack recovers, and whether the control service's memory comes back after each burst.
//!
//! 1. Starts the three real binaries: the inference server on `models/default`, an allocator of
//!    20,000 hosts on a fresh store (`http.max_concurrency = 256`, as in `configs/allocator.toml`),
//!    the control service (default `[http]` limits, safeguard off).
//! 2. Unloaded: 1,000 requests at 200/s, open loop: p50 and p99.
//! 3. Sustainable rate: the highest open-loop rate, stepped up by 1.5x from 500/s for 2 s each,
//!    at which every request is admitted and the p99 stays within 5x the unloaded p99 (and no
//!    higher than the saturation throughput of 16 closed-loop clients).
//! 4. Five bursts: `multiplier` x that rate for `burst_s` seconds, open loop (each request sent at
//!    its time on its own task, on an idle kept-alive connection or a new one, up to 2,000 open;
//!    latency counts from the moment a connection is in hand), then 3 s at 200/s to see when the
//!    median is back to normal (the first of five 100 ms windows in a row whose medians are within
//!    twice the probe's own median over its last second, or the unloaded p50 if larger: a burst
//!    leaves thousands of VMs placed, and placing on a fuller zone is slower than on the empty one). The VMs placed are released (not timed), the client's connections
//!    closed, and the control service's RSS read from `/proc` 3 s later.
//!
//! `cargo bench -p control-service --bench overload -- [burst_s] [bursts] [multiplier]
//! [max_concurrency]` (defaults 20, 5, 5 and the control service's default admission limit); the
//! same build as the tests: `cargo test --release -p control-service --bench overload -- 20 5 5`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use test_support::process::rss_kib;
use test_support::stack;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// One request's fate in a burst.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    /// 2xx: admitted and answered; the VM was placed (201) or not (200, rejected).
    Admitted { placed: bool },
    /// 503, with or without `Retry-After`.
    Refused { retry_after: bool },
    /// Any other status.
    OtherStatus(u16),
    /// No answer: connection refused or reset, or the client's timeout.
    Failed,
}

#[derive(Clone, Copy, Debug)]
struct Record {
    /// When the request was due, from the start of its phase.
    due: Duration,
    latency: Duration,
    outcome: Outcome,
}

/// Most connections the load generator opens at once: below the control service's default
/// `http.max_connections` (4,096), so that refusals are the admission limit's.
const MAX_CONNECTIONS: usize = 2_000;

/// CPU time (user + system) the process `pid` has used so far, from `/proc` (clock ticks of 10 ms).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(duration: Duration) -> String {
    format!("{:.2}", duration.as_secs_f64() * 1_000.0)
}

fn latencies(records: &[Record], keep: impl Fn(&Outcome) -> bool) -> Vec<Duration> {
    let mut values: Vec<Duration> = records.iter().filter(|r| keep(&r.outcome)).map(|r| r.latency).collect();
    values.sort_unstable();
    values
}

/// A kept-alive HTTP/1.1 connection of the load generator. Requests are written as prepared bytes
/// and answers parsed just enough (status, `Retry-After`, `Content-Length`): reqwest costs several
/// times more CPU per request, and on 2 shared cores the client's own work would otherwise be what
/// the bench measures at five times the sustainable rate.
struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

/// Status and whether `Retry-After` was present.
type Answer = (u16, bool);

impl Connection {
    async fn open(addr: &str) -> std::io::Result<Connection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection { stream, buffer: Vec::with_capacity(4096) })
    }

    /// Sends `request` and reads its whole answer; `None` in the answer's place means the server
    /// closes the connection after it.
    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<(Answer, bool)> {
        self.stream.write_all(request).await?;
        self.buffer.clear();
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&self.buffer[..head_end]).to_ascii_lowercase();
        let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let header =
            |name: &str| head.lines().find_map(|line| line.strip_prefix(name).map(str::trim).map(str::to_owned));
        let length: usize = header("content-length:").and_then(|v| v.parse().ok()).unwrap_or(0);
        let retry_after = header("retry-after:").is_some();
        let closes = header("connection:").is_some_and(|v| v == "close");
        while self.buffer.len() < head_end + length {
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
        Ok(((status, retry_after), closes))
    }
}

struct Bench {
    addr: String,
    next_vm: AtomicUsize,
    tenants: usize,
    /// Idle kept-alive connections.
    idle: Mutex<Vec<Connection>>,
    /// Connections open (idle or busy), at most `max_connections`.
    open: Arc<Semaphore>,
}

impl Bench {
    /// A new VM's `POST /allocate`, as bytes, and its id.
    fn request(&self) -> (String, Vec<u8>) {
        let i = self.next_vm.fetch_add(1, Ordering::Relaxed);
        let vm_id = format!("overload-{}-{i}", std::process::id());
        let tenant = format!("tenant-{}", i % self.tenants);
        let body = stack::vm(&vm_id, &tenant, "D2", 1.0).to_string();
        let request = format!(
            "POST /allocate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        (vm_id, request.into_bytes())
    }

    /// One request on an idle connection, or a new one: its outcome, and its latency from the
    /// moment a connection was in hand (opening one included).
    async fn send(self: &Arc<Self>, request: &[u8]) -> (Outcome, Duration) {
        let Ok(permit) = Arc::clone(&self.open).acquire_owned().await else { return (Outcome::Failed, Duration::ZERO) };
        let reused = self.idle.lock().map(|mut idle| idle.pop()).unwrap_or(None);
        let started = Instant::now();
        let connection = match reused {
            Some(connection) => Ok(connection),
            None => Connection::open(&self.addr).await,
        };
        let Ok(mut connection) = connection else { return (Outcome::Failed, started.elapsed()) };
        let outcome = match connection.exchange(request).await {
            Ok(((status, retry_after), closes)) => {
                if !closes {
                    if let Ok(mut idle) = self.idle.lock() {
                        idle.push(connection);
                    }
                }
                match status {
                    200..=299 => Outcome::Admitted { placed: status == 201 },
                    503 => Outcome::Refused { retry_after },
                    other => Outcome::OtherStatus(other),
                }
            }
            Err(_) => Outcome::Failed,
        };
        let latency = started.elapsed();
        drop(permit);
        (outcome, latency)
    }

    /// Closes every idle connection, as clients going away after a burst do.
    fn close_idle(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }

    /// Sends at `rate` per second for `duration`, open loop; returns every request's record and the
    /// ids of the VMs placed.
    async fn open_loop(self: &Arc<Self>, rate: f64, duration: Duration) -> (Vec<Record>, Vec<String>) {
        let total = (rate * duration.as_secs_f64()).round() as usize;
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(total);
        for k in 0..total {
            let due = Duration::from_secs_f64(k as f64 / rate);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                if wait > Duration::from_micros(500) {
                    tokio::time::sleep(wait).await;
                }
            }
            let (vm_id, request) = self.request();
            let bench = Arc::clone(self);
            tasks.push(tokio::spawn(async move {
                let (outcome, latency) = bench.send(&request).await;
                (Record { due, latency, outcome }, vm_id)
            }));
        }
        let mut records = Vec::with_capacity(total);
        let mut placed = Vec::new();
        for task in tasks {
            let (record, vm_id) = task.await.expect("request task");
            if matches!(record.outcome, Outcome::Admitted { .. }) {
                placed.push(vm_id);
            }
            records.push(record);
        }
        (records, placed)
    }

    /// `clients` closed-loop clients for `duration`: admitted answers (2xx) per second, and the VMs
    /// placed.
    async fn sustainable_rate(self: &Arc<Self>, clients: usize, duration: Duration) -> (f64, Vec<String>) {
        let started = Instant::now();
        let workers: Vec<_> = (0..clients)
            .map(|_| {
                let bench = Arc::clone(self);
                tokio::spawn(async move {
                    let mut placed = Vec::new();
                    let (mut answered, mut rejected) = (0usize, 0usize);
                    while started.elapsed() < duration {
                        let (vm_id, request) = bench.request();
                        // Only what the stack served counts; a refusal is not throughput.
                        match bench.send(&request).await.0 {
                            Outcome::Admitted { placed: true } => {
                                placed.push(vm_id);
                                answered += 1;
                            }
                            Outcome::Admitted { placed: false } => rejected += 1,
                            _ => {}
                        }
                    }
                    (answered, rejected, placed)
                })
            })
            .collect();
        let (mut answered, mut rejected) = (0, 0);
        let mut placed = Vec::new();
        for worker in workers {
            let (count, not_placed, vms) = worker.await.expect("worker");
            answered += count;
            rejected += not_placed;
            placed.extend(vms);
        }
        if rejected > 0 {
            eprintln!("sustainable rate: {rejected} requests answered 200 rejected, not counted");
        }
        (answered as f64 / started.elapsed().as_secs_f64(), placed)
    }
}

/// Releases `vms` straight at the allocator, 32 at a time (not measured).
async fn release(client: &reqwest::Client, allocator: &str, vms: Vec<String>) {
    let gate = Arc::new(Semaphore::new(32));
    let mut tasks = Vec::with_capacity(vms.len());
    for vm in vms {
        let permit = Arc::clone(&gate).acquire_owned().await.expect("semaphore open");
        let request = client.delete(format!("{allocator}/v1/allocations/{vm}"));
        tasks.push(tokio::spawn(async move {
            let _ = request.send().await;
            drop(permit);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

/// Time from the end of the burst until the median is back to normal: the start of the first of
/// five 100 ms windows in a row of the probe whose medians are all within `normal`.
fn recovery(probe: &[Record], normal: Duration) -> Option<Duration> {
    let window = Duration::from_millis(100);
    let windows = probe.iter().map(|r| r.due.as_millis() / window.as_millis()).max().unwrap_or(0) as usize + 1;
    let medians: Vec<Option<Duration>> = (0..windows)
        .map(|w| {
            let mut values: Vec<Duration> = probe
                .iter()
                .filter(|r| r.due.as_millis() / window.as_millis() == w as u128)
                .filter(|r| !matches!(r.outcome, Outcome::Failed))
                .map(|r| r.latency)
                .collect();
            values.sort_unstable();
            (!values.is_empty()).then(|| percentile(&values, 50.0))
        })
        .collect();
    // Back to normal: five windows in a row (half a second) with a normal median.
    let steady = 5.min(windows);
    let first_good =
        (0..=windows - steady).find(|&w| medians[w..w + steady].iter().all(|m| m.is_some_and(|m| m <= normal)))?;
    Some(window * first_good as u32)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let burst = Duration::from_secs(args.first().and_then(|a| a.parse().ok()).unwrap_or(20));
    let bursts: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let multiplier: f64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5.0);
    // Optional: an explicit admission limit instead of the default, to compare settings.
    let max_concurrency: Option<usize> = args.get(3).and_then(|a| a.parse().ok());

    let dir = tempfile::tempdir().unwrap();
    let inference = stack::start_inference(dir.path(), &stack::default_models(dir.path())).await;
    // The allocator's admission limit as in configs/allocator.toml: its group commit batches what
    // is in flight, and the control service in front bounds its own share.
    let allocator = stack::start_allocator_with(dir.path(), 20_000, "[http]\nmax_concurrency = 256\n").await;
    let control = stack::start_control(
        dir.path(),
        &[&inference.base],
        &allocator.base,
        20,
        // Unknown tenants are mostly predicted long; the safeguard would trip and hide the model.
        &format!(
            "[safeguard]\nenabled = false\n{}",
            max_concurrency.map_or_else(String::new, |limit| format!("[http]\nmax_concurrency = {limit}\n"))
        ),
    )
    .await;
    let control_pid = control.id().expect("control service running");
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(usize::MAX)
        // For the releases sent to the allocator directly; the control service (open mode) ignores it.
        .default_headers(stack::service_credential())
        .build()
        .expect("HTTP client");
    let bench = Arc::new(Bench {
        addr: control.base.trim_start_matches("http://").to_owned(),
        next_vm: AtomicUsize::new(0),
        tenants: 200,
        idle: Mutex::new(Vec::new()),
        open: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
    });
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at start: {}", load.trim());

    // Warm up: pools, caches (200 tenants, so most predictions are then cache hits).
    let (_, warm) = bench.open_loop(200.0, Duration::from_secs(2)).await;
    release(&client, &allocator.base, warm).await;

    let (unloaded, placed) = bench.open_loop(200.0, Duration::from_secs(5)).await;
    release(&client, &allocator.base, placed).await;
    let unloaded_latencies = latencies(&unloaded, |o| matches!(o, Outcome::Admitted { .. }));
    let (unloaded_p50, unloaded_p99) = (percentile(&unloaded_latencies, 50.0), percentile(&unloaded_latencies, 99.0));
    println!(
        "unloaded (200/s, {} requests): p50 {} ms, p99 {} ms; control service RSS {} KiB",
        unloaded.len(),
        ms(unloaded_p50),
        ms(unloaded_p99),
        rss_kib(control_pid).unwrap_or(0)
    );

    let (saturation, placed) = bench.sustainable_rate(16, Duration::from_secs(5)).await;
    release(&client, &allocator.base, placed).await;
    println!("saturation throughput (16 closed-loop clients, 5 s): {saturation:.0}/s");
    // Sustainable: the highest open-loop rate, in steps of 1.5x from 500/s, at which every request
    // is admitted and the p99 stays within 5x the unloaded p99 (the bar the bursts are held to),
    // and at most the saturation throughput.
    let mut rate = 500.0;
    loop {
        let next = rate * 1.5;
        if next > saturation {
            break;
        }
        let (records, placed) = bench.open_loop(next, Duration::from_secs(2)).await;
        release(&client, &allocator.base, placed).await;
        let admitted = latencies(&records, |o| matches!(o, Outcome::Admitted { .. }));
        let p99 = percentile(&admitted, 99.0);
        let served_all = admitted.len() == records.len();
        eprintln!("step {next:.0}/s: admitted {} of {}, p99 {} ms", admitted.len(), records.len(), ms(p99));
        if !served_all || p99 > unloaded_p99 * 5 {
            break;
        }
        rate = next;
    }
    let offered = rate * multiplier;
    println!(
        "sustainable rate (open loop, steps of 1.5x, all admitted, p99 <= 5x unloaded): {rate:.0}/s; bursts at {offered:.0}/s for {burst:?}"
    );
    println!();
    println!(
        "| burst | sent | admitted | admitted p50 ms | admitted p99 ms | refused 503 | 503 p99 ms | 503 with Retry-After | other / failed | p50 normal again after | RSS after (KiB) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rss_after = Vec::new();
    let mut worst = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for round in 1..=bursts {
        let cpu_before = cpu_time(control_pid);
        let (records, placed) = bench.open_loop(offered, burst).await;
        let cpu_used = cpu_time(control_pid).saturating_sub(cpu_before);
        let (probe, probe_placed) = bench.open_loop(200.0, Duration::from_secs(3)).await;
        release(&client, &allocator.base, placed).await;
        release(&client, &allocator.base, probe_placed).await;
        bench.close_idle();
        // The service gives memory back within a second or two of the connections closing.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let rss = rss_kib(control_pid).unwrap_or(0);
        rss_after.push(rss);

        let admitted = latencies(&records, |o| matches!(o, Outcome::Admitted { .. }));
        let refused = latencies(&records, |o| matches!(o, Outcome::Refused { .. }));
        let with_retry_after =
            records.iter().filter(|r| matches!(r.outcome, Outcome::Refused { retry_after: true })).count();
        let other: Vec<u16> = records
            .iter()
            .filter_map(|r| if let Outcome::OtherStatus(status) = r.outcome { Some(status) } else { None })
            .collect();
        let other = if other.is_empty() {
            "0".to_owned()
        } else {
            let codes: std::collections::BTreeSet<u16> = other.iter().copied().collect();
            format!("{} ({codes:?})", other.len())
        };
        let failed = records.iter().filter(|r| matches!(r.outcome, Outcome::Failed)).count();
        // Normal: the same probe's median over its last second, when the stack is at rest with the
        // same inventory (a burst leaves thousands of VMs placed, which makes placing slower than
        // in the unloaded run on an empty zone).
        let settled = latencies(&probe[probe.len() * 2 / 3..], |o| !matches!(o, Outcome::Failed));
        let settled_p50 = percentile(&settled, 50.0);
        let recovered = recovery(&probe, settled_p50.max(unloaded_p50) * 2);
        eprintln!(
            "burst {round}: {} admitted requests answered 200 rejected; control service CPU {:.2} s ({:.1} us per request); probe p50 in its first 0.5 s {} ms, \
             in its last second {} ms",
            records.iter().filter(|r| matches!(r.outcome, Outcome::Admitted { placed: false })).count(),
            cpu_used.as_secs_f64(),
            cpu_used.as_secs_f64() * 1e6 / records.len().max(1) as f64,
            ms(percentile(&latencies(&probe[..probe.len() / 6], |o| !matches!(o, Outcome::Failed)), 50.0)),
            ms(settled_p50)
        );
        let (admitted_p99, refused_p99) = (percentile(&admitted, 99.0), percentile(&refused, 99.0));
        worst = (
            worst.0.max(admitted_p99),
            worst.1.max(refused_p99),
            worst.2.max(recovered.unwrap_or(Duration::from_secs(3))),
        );
        println!(
            "| {round} | {} | {} | {} | {} | {} | {} | {with_retry_after} | {other} / {failed} | {} | {rss} |",
            records.len(),
            admitted.len(),
            ms(percentile(&admitted, 50.0)),
            ms(admitted_p99),
            refused.len(),
            ms(refused_p99),
            recovered.map_or_else(|| "> 3 s".to_owned(), |d| format!("{} ms", d.as_millis())),
        );
    }
    println!();
    let verdict = |ok: bool| if ok { "holds" } else { "MISSED" };
    let ratio = worst.0.as_secs_f64() / unloaded_p99.as_secs_f64().max(1e-9);
    println!(
        "admitted p99 <= 5x unloaded p99 ({} ms): worst {} ms = {ratio:.1}x: {}",
        ms(unloaded_p99),
        ms(worst.0),
        verdict(ratio <= 5.0)
    );
    println!("503 p99 < 10 ms: worst {} ms: {}", ms(worst.1), verdict(worst.1 < Duration::from_millis(10)));
    println!(
        "p50 normal again within 1 s: worst {} ms: {}",
        worst.2.as_millis(),
        verdict(worst.2 <= Duration::from_secs(1))
    );
    if let (Some(first), Some(last)) = (rss_after.first(), rss_after.last()) {
        let growth = *last as f64 / (*first).max(1) as f64 - 1.0;
        println!(
            "RSS after the last burst vs the first: {last} vs {first} KiB ({:+.1}%): {}",
            growth * 100.0,
            verdict(growth <= 0.2)
        );
    }
}
