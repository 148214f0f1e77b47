//! `vmreplay`: drives a VM trace through the control service's public API in compressed time:
//! `POST /allocate` at each VM's start, `DELETE /allocate/{vm_id}` at its end, `/v1/stats` sampled
//! as it goes, and a report of what happened. Which VMs, when, and the statistics are
//! the `replay` library's pure logic; this file does the HTTP, the clock and the terminal.

use anyhow::{anyhow, bail, Context, Result};
use clap::{ArgGroup, Parser};
use domain::{AllocationRequest, ControlStats, VmId};
use indicatif::{ProgressBar, ProgressStyle};
use replay::{
    self, Answer, EventKind, LatencySummary, Pacer, Pacing, Plan, PredictionRow, SeriesPoint, Tally, WindowSpec,
};
use reqwest::Url;
use std::collections::HashSet;
use std::io::IsTerminal;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{oneshot, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use traces::synthetic::{generate, SyntheticConfig};
use traces::TraceSource;

mod orchestrator;

/// Exit code of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
const EXIT_INTERRUPTED: u8 = 130;

/// Stand-in for "never" when a schedule reaches absurdly far (a tiny `--speed`): a century.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 86_400);

#[derive(Parser)]
#[command(
    name = "vmreplay",
    version,
    about = "Replay a VM trace through the control service's POST /allocate and report what happened",
    long_about = "Replay a VM trace through the control service's public API: each VM of the window is requested \
                  (POST /allocate) at its trace start and released (DELETE /allocate/{vm_id}) at its trace end, \
                  both compressed by --speed and capped by --max-rate. VMs still placed at the end are released \
                  unless --keep. Prints a summary: outcomes, latency, cache and fallbacks, packing density and \
                  empty hosts over time, and the realized prediction quality per model version (the control \
                  service's quality gate and the allocators' windows of resolved outcomes)."
)]
#[command(group(ArgGroup::new("input").required(true).args(["trace", "synthetic_days"])))]
struct Cli {
    /// The trace: the project's CSV (.csv or .csv.gz, docs/trace-format.md).
    trace: Option<PathBuf>,
    /// Instead of a file, replay a synthetic trace of this many days, generated in memory.
    #[arg(long, value_name = "DAYS")]
    synthetic_days: Option<f64>,
    /// Seed of the synthetic trace.
    #[arg(long, default_value_t = 42, requires = "synthetic_days")]
    seed: u64,
    /// Base URL of the control service.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    control: String,
    /// API key sent as `Authorization: Bearer <key>` [default: $VMREPLAY_API_KEY]. A replay places
    /// VMs of many tenants at trace times, so it needs the operator's key when the control service
    /// requires keys (docs/control-service.md#authentication); none is needed in open mode.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
    /// Trace time to start at, in seconds [default: the first VM's start].
    #[arg(long, allow_negative_numbers = true, value_name = "SECONDS")]
    from_s: Option<f64>,
    /// Trace seconds to replay [default: up to the last VM's start].
    #[arg(long, value_name = "SECONDS")]
    duration_s: Option<f64>,
    /// Request at most this many VMs (the earliest of the window).
    #[arg(long, value_name = "N")]
    max_vms: Option<usize>,
    /// Time compression: trace seconds per real second (1440 = one trace day per real minute).
    #[arg(long, default_value_t = 1440.0)]
    speed: f64,
    /// Most requests (allocations and releases) per real second; evenly spaced, never in bursts
    /// [default: no cap].
    #[arg(long, value_name = "PER_SECOND")]
    max_rate: Option<f64>,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Leave the VMs still placed at the end of the run on their hosts.
    #[arg(long)]
    keep: bool,
    /// Prefix of the VM ids sent (`PREFIX-<trace id>`), so that runs on one allocator store do not
    /// collide: the allocator answers a reused id with the earlier decision. Empty for the trace's
    /// own ids [default: `r<unix time>`].
    #[arg(long, value_name = "PREFIX")]
    vm_id_prefix: Option<String>,
    /// Real seconds between two samples of the control service's /v1/stats.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    sample_every_s: f64,
    /// Budget of one HTTP request, connection included.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    request_timeout_s: f64,
    /// Fail (exit code 1) when more than this share of the allocation requests failed.
    #[arg(long, default_value_t = 0.01, value_name = "SHARE")]
    max_error_rate: f64,
    /// Also write the whole summary as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Also draw packing density and empty hosts over time into this SVG file, and the realized
    /// prediction quality per model version (ROC AUC, average precision, precision, recall) into
    /// PATH-quality.svg beside it.
    #[arg(long, value_name = "PATH.svg")]
    plot: Option<PathBuf>,
    /// Also write each allocation request's VM and the prediction it was placed with as CSV (trace
    /// and sent id, tenant, trace start and end, outcome, p_long, class, model version, source), to
    /// compare the served predictions with an offline evaluation of the same VMs.
    #[arg(long, value_name = "PATH.csv")]
    predictions: Option<PathBuf>,
    /// After the run and its final releases, wait this long and read /v1/stats again for the
    /// realized quality table: the control service reads the zones' quality every `[quality]
    /// poll_ms`, and the final releases can complete the last cohorts. 0: the quality of the
    /// final sample.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    settle_s: f64,
    /// Play the orchestrator of live migrations for an allocator that consolidates (its base URL,
    /// e.g. http://127.0.0.1:8082; docs/allocator.md): confirm each of its consolidation's
    /// migrations once it has run --migration-s of trace time. Needs the allocator's admin token
    /// (--admin-token-file, or $VMREPLAY_ADMIN_TOKEN).
    #[arg(long, value_name = "ALLOCATOR_URL")]
    confirm_migrations: Option<String>,
    /// Trace seconds a live migration takes before vmreplay confirms it.
    #[arg(long, default_value_t = 1200.0, value_name = "SECONDS", requires = "confirm_migrations")]
    migration_s: f64,
    /// File whose first line is the allocator's admin token (--confirm-migrations).
    #[arg(long, value_name = "PATH", requires = "confirm_migrations")]
    admin_token_file: Option<PathBuf>,
    /// No progress bar or progress messages; only the summary.
    #[arg(short, long)]
    quiet: bool,
}

/// The flags checked and turned into what the run needs.
struct Settings {
    window: WindowSpec,
    pacing: Pacing,
    control: Url,
    vm_id_prefix: String,
    sample_every: Duration,
    request_timeout: Duration,
}

fn check_flags(cli: &Cli) -> Result<Settings> {
    let window = WindowSpec { from_s: cli.from_s, duration_s: cli.duration_s, max_vms: cli.max_vms };
    replay::check_window(&window)?;
    let pacing = Pacing::new(cli.speed, cli.max_rate)?;
    if !(1..=10_000).contains(&cli.concurrency) {
        bail!("--concurrency must be between 1 and 10000, got {}", cli.concurrency);
    }
    if !(cli.sample_every_s.is_finite() && cli.sample_every_s >= 0.1) {
        bail!("--sample-every-s must be at least 0.1 seconds, got {}", cli.sample_every_s);
    }
    if !(cli.request_timeout_s.is_finite() && cli.request_timeout_s >= 0.001) {
        bail!("--request-timeout-s must be at least 0.001 seconds, got {}", cli.request_timeout_s);
    }
    if !(cli.settle_s.is_finite() && (0.0..=3600.0).contains(&cli.settle_s)) {
        bail!("--settle-s must be between 0 and 3600 seconds, got {}", cli.settle_s);
    }
    if !(0.0..=1.0).contains(&cli.max_error_rate) {
        bail!("--max-error-rate must be a share between 0 and 1 (0.01 = 1%), got {}", cli.max_error_rate);
    }
    if let Some(days) = cli.synthetic_days {
        if !(days.is_finite() && days > 0.0 && days <= 3650.0) {
            bail!("--synthetic-days must be > 0 and at most 3650, got {days}");
        }
    }
    let control = Url::parse(&cli.control).map_err(|err| {
        anyhow!("--control `{}` is not a URL ({err}); expected e.g. http://127.0.0.1:8080", cli.control)
    })?;
    if !matches!(control.scheme(), "http" | "https") || control.cannot_be_a_base() {
        bail!("--control `{}` must be an http:// URL, e.g. http://127.0.0.1:8080", cli.control);
    }
    let vm_id_prefix = match &cli.vm_id_prefix {
        Some(prefix) => prefix.clone(),
        None => format!("r{}", SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())),
    };
    if vm_id_prefix.len() > 128 || vm_id_prefix.chars().any(char::is_control) {
        bail!("--vm-id-prefix must be at most 128 bytes without control characters, got {vm_id_prefix:?}");
    }
    Ok(Settings {
        window,
        pacing,
        control,
        vm_id_prefix,
        sample_every: Duration::from_secs_f64(cli.sample_every_s),
        request_timeout: Duration::from_secs_f64(cli.request_timeout_s),
    })
}

/// Reads the trace (or generates it) and plans the window. Returns the plan and a description of
/// the trace for the summary.
fn load_plan(cli: &Cli, settings: &Settings) -> Result<(Plan, String)> {
    let window = &settings.window;
    let prefix = &settings.vm_id_prefix;
    if let Some(days) = cli.synthetic_days {
        let config = SyntheticConfig { seed: cli.seed, span_days: days, ..SyntheticConfig::default() };
        let records = generate(&config);
        let from_s = match window.from_s {
            Some(from) => from,
            None => replay::first_start(records.iter().map(Ok))?,
        };
        let plan = replay::plan(records.into_iter().map(Ok), from_s, window, prefix)?;
        return Ok((plan, format!("synthetic trace ({days} days, seed {})", cli.seed)));
    }
    let Some(path) = &cli.trace else { bail!("give a trace file or --synthetic-days") };
    let source = TraceSource::from_path(path, None).with_context(|| {
        format!(
            "trace {}: vmreplay reads the project's CSV (.csv, .csv.gz); convert other traces with `vmtrace convert`",
            path.display()
        )
    })?;
    let open = || source.open().with_context(|| format!("opening the trace {}", path.display()));
    let from_s = match window.from_s {
        Some(from) => from,
        None => replay::first_start(open()?).with_context(|| format!("trace {}", path.display()))?,
    };
    let plan = replay::plan(open()?, from_s, window, prefix).with_context(|| format!("trace {}", path.display()))?;
    Ok((plan, path.display().to_string()))
}

/// The control service's routes.
struct Endpoints {
    allocate: Url,
    stats: Url,
    readyz: Url,
}

impl Endpoints {
    fn new(base: &Url) -> Result<Self> {
        let at = |segments: &[&str]| -> Result<Url> {
            let mut url = base.clone();
            url.set_query(None);
            url.set_fragment(None);
            url.path_segments_mut()
                .map_err(|()| anyhow!("--control `{base}` cannot take a path; expected e.g. http://127.0.0.1:8080"))?
                .pop_if_empty()
                .extend(segments);
            Ok(url)
        };
        Ok(Endpoints { allocate: at(&["allocate"])?, stats: at(&["v1", "stats"])?, readyz: at(&["readyz"])? })
    }

    /// `DELETE /allocate/{vm_id}?ended_at_s=...`, the id percent-encoded as one path segment, the
    /// end in trace time (the clock of the requests' `requested_at_s`), for the tenants' history.
    fn release(&self, vm_id: &VmId, ended_at_s: f64) -> Url {
        let mut url = self.allocate.clone();
        // `allocate` was built by pushing a segment, so it takes one more.
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.push(vm_id.as_str());
        }
        url.query_pairs_mut().append_pair("ended_at_s", &ended_at_s.to_string());
        url
    }
}

/// A transport error's kind for the counters, and its message with every cause.
fn transport(err: reqwest::Error) -> (String, String) {
    let kind = if err.is_timeout() {
        "timeout"
    } else if err.is_connect() {
        "connect"
    } else if err.is_body() || err.is_decode() {
        "body"
    } else {
        "request"
    };
    (kind.to_owned(), format!("{:#}", anyhow::Error::from(err)))
}

async fn check_ready(client: &reqwest::Client, endpoints: &Endpoints, control: &str) -> Result<()> {
    let response =
        client.get(endpoints.readyz.clone()).timeout(Duration::from_secs(5)).send().await.map_err(|err| {
            anyhow!(
                "cannot reach the control service at {control} (--control): {}\nStart the stack with \
             `scripts/stack.sh up`, or point --control at a running control service.",
                transport(err).1
            )
        })?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        bail!(
            "the control service at {control} (--control) is not ready: GET /readyz answered {status}: {}\n\
             Wait until its allocators and inference servers are up (`scripts/stack.sh up` starts them all).",
            body.trim()
        );
    }
    Ok(())
}

async fn get_stats(client: &reqwest::Client, url: &Url) -> Result<ControlStats> {
    let response = client.get(url.clone()).send().await.map_err(|err| anyhow!("GET {url}: {}", transport(err).1))?;
    let status = response.status();
    let body = response.bytes().await.with_context(|| format!("GET {url}: reading the body"))?;
    if matches!(status.as_u16(), 401 | 403) {
        bail!(
            "GET {url} answered {status}: this control service requires the operator's API key; pass it with \
             --api-key or ${API_KEY_ENV}"
        );
    }
    if !status.is_success() {
        bail!("GET {url} answered {status}: {}", String::from_utf8_lossy(&body).trim());
    }
    serde_json::from_slice(&body).with_context(|| format!("GET {url}: not the control service's statistics"))
}

/// Where the API key comes from when `--api-key` is not given.
const API_KEY_ENV: &str = "VMREPLAY_API_KEY";

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking task already fails the run; the counters it left are still worth reporting.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `start + seconds`, saturating at [`FAR_FUTURE`] instead of panicking on absurd schedules.
fn instant_after(start: Instant, seconds: f64) -> tokio::time::Instant {
    let offset = Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(FAR_FUTURE).min(FAR_FUTURE);
    tokio::time::Instant::from_std(start + offset)
}

/// What the request tasks share.
struct Shared {
    client: reqwest::Client,
    endpoints: Endpoints,
    plan: Plan,
    start: Instant,
    pacer: Mutex<Pacer>,
    tally: Mutex<Tally>,
    /// VMs (indices into the plan) placed and not yet released.
    alive: Mutex<HashSet<usize>>,
    /// Trace time of the latest event dispatched, as `f64` bits.
    trace_now: AtomicU64,
    /// How many allocation latencies the previous sample covered.
    latency_mark: AtomicUsize,
    /// Each allocation's prediction, when `--predictions` asks for them.
    predictions: Option<Mutex<Vec<PredictionRow>>>,
    bar: ProgressBar,
}

impl Shared {
    fn elapsed_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Waits for this request's slot under the rate cap. Every request passes here right before it
    /// is sent, so the cap holds whatever the scheduling delays were.
    async fn pace(&self) {
        let now = self.elapsed_s();
        let at = lock(&self.pacer).reserve(now);
        if at > now {
            tokio::time::sleep_until(instant_after(self.start, at)).await;
        }
    }

    /// A sample of the run and the control service's statistics; its interval latency covers the
    /// allocations answered since the previous call.
    fn point(&self, stats: &ControlStats) -> SeriesPoint {
        let trace_s = f64::from_bits(self.trace_now.load(Ordering::Relaxed));
        let alive = lock(&self.alive).len() as u64;
        let interval_latency = {
            let tally = lock(&self.tally);
            let answered = tally.client_latency_us.len();
            let from = self.latency_mark.swap(answered, Ordering::Relaxed).min(answered);
            LatencySummary::from_us(&tally.client_latency_us[from..])
        };
        SeriesPoint {
            interval_latency: Some(interval_latency),
            ..replay::series_point(self.elapsed_s(), trace_s, alive, stats)
        }
    }
}

async fn allocate(shared: Arc<Shared>, vm: usize, done: Option<oneshot::Sender<bool>>, _permit: OwnedSemaphorePermit) {
    let body = AllocationRequest::Vm(shared.plan.vms[vm].request.clone());
    shared.pace().await;
    let sent = Instant::now();
    let answer = match shared.client.post(shared.endpoints.allocate.clone()).json(&body).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(bytes) => replay::classify_answer(status, &bytes),
                Err(err) => {
                    let (kind, detail) = transport(err);
                    Answer::transport_error(&kind, detail)
                }
            }
        }
        Err(err) => {
            let (kind, detail) = transport(err);
            Answer::transport_error(&kind, detail)
        }
    };
    let client_us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
    if let Some(rows) = &shared.predictions {
        let row = PredictionRow::new(&shared.plan.vms[vm], &answer);
        lock(rows).push(row);
    }
    let placed = answer.is_placed();
    if placed {
        lock(&shared.alive).insert(vm);
    }
    let message = {
        let mut tally = lock(&shared.tally);
        tally.record_allocation(&answer, client_us);
        format!(
            "placed {}, rejected {}, replayed {}, errors {}",
            tally.placed, tally.rejected, tally.replayed, tally.errors
        )
    };
    shared.bar.inc(1);
    shared.bar.set_message(message);
    if let Some(done) = done {
        // The release task may be gone (interrupted run): nobody to tell.
        let _ = done.send(placed);
    }
}

/// Releases a VM once its allocation has answered, if it was placed.
async fn release(
    shared: Arc<Shared>,
    vm: usize,
    allocated: Option<oneshot::Receiver<bool>>,
    _permit: OwnedSemaphorePermit,
    at_end: bool,
) {
    if let Some(allocated) = allocated {
        if !allocated.await.unwrap_or(false) {
            return;
        }
    }
    if !lock(&shared.alive).contains(&vm) {
        return;
    }
    shared.pace().await;
    let planned = &shared.plan.vms[vm];
    // A VM released at the end of the window (still running in the trace) ends there.
    let ended_at_s = planned.end_s.filter(|_| !at_end).unwrap_or(shared.plan.to_s);
    let url = shared.endpoints.release(&planned.request.vm_id, ended_at_s);
    let result = match shared.client.delete(url).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            // Read the (small) body so the connection goes back to the pool.
            let _ = response.bytes().await;
            Ok(status)
        }
        Err(err) => Err(transport(err)),
    };
    if matches!(result, Ok(status) if (200..300).contains(&status) || status == 404) {
        lock(&shared.alive).remove(&vm);
    }
    lock(&shared.tally).record_release(result, at_end);
}

/// Waits for every task; a panic in one is re-raised, since its counts would be wrong.
async fn join_all(tasks: &mut JoinSet<()>) {
    while let Some(joined) = tasks.join_next().await {
        if let Err(err) = joined {
            if err.is_panic() {
                std::panic::resume_unwind(err.into_panic());
            }
        }
    }
}

/// Sends every event at its time; stops early at the first Ctrl-C. Returns whether it was
/// interrupted.
async fn dispatch(
    shared: &Arc<Shared>,
    events: &[replay::Event],
    concurrency: usize,
    interrupts: &mut watch::Receiver<u32>,
) -> bool {
    let vms = shared.plan.vms.len();
    // An in-window release waits for its VM's allocation answer through a one-shot channel.
    let mut senders: Vec<Option<oneshot::Sender<bool>>> = (0..vms).map(|_| None).collect();
    let mut receivers: Vec<Option<oneshot::Receiver<bool>>> = (0..vms).map(|_| None).collect();
    for event in events.iter().filter(|e| e.kind == EventKind::Release) {
        let (tx, rx) = oneshot::channel();
        senders[event.vm] = Some(tx);
        receivers[event.vm] = Some(rx);
    }
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    let mut interrupted = false;
    for event in events {
        let due = instant_after(shared.start, event.at_s);
        // Taking the permit here, before spawning, is the back-pressure: when the service is slower
        // than the schedule, the dispatcher waits instead of piling up tasks.
        let permit = tokio::select! {
            Ok(_) = interrupts.wait_for(|&n| n >= 1) => {
                interrupted = true;
                break;
            }
            permit = async {
                tokio::time::sleep_until(due).await;
                Arc::clone(&permits).acquire_owned().await
            } => permit,
        };
        let Ok(permit) = permit else { break };
        shared.trace_now.store(event.trace_s.to_bits(), Ordering::Relaxed);
        match event.kind {
            EventKind::Allocate => {
                tasks.spawn(allocate(Arc::clone(shared), event.vm, senders[event.vm].take(), permit))
            }
            EventKind::Release => {
                tasks.spawn(release(Arc::clone(shared), event.vm, receivers[event.vm].take(), permit, false))
            }
        };
        while tasks.try_join_next().is_some() {}
    }
    // Undispatched releases will never hear from their allocations; dropping the senders is fine.
    drop(senders);
    join_all(&mut tasks).await;
    interrupted
}

/// Releases the VMs still placed, until done or a second Ctrl-C.
async fn release_leftovers(
    shared: &Arc<Shared>,
    concurrency: usize,
    interrupts: &mut watch::Receiver<u32>,
    quiet: bool,
) {
    let mut leftover: Vec<usize> = lock(&shared.alive).iter().copied().collect();
    leftover.sort_unstable();
    if leftover.is_empty() {
        return;
    }
    if !quiet {
        eprintln!("vmreplay: releasing the {} VMs still placed (Ctrl-C to leave them)", leftover.len());
    }
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for vm in leftover {
        let permit = tokio::select! {
            Ok(_) = interrupts.wait_for(|&n| n >= 2) => break,
            permit = Arc::clone(&permits).acquire_owned() => permit,
        };
        let Ok(permit) = permit else { break };
        tasks.spawn(release(Arc::clone(shared), vm, None, permit, true));
        while tasks.try_join_next().is_some() {}
    }
    join_all(&mut tasks).await;
}

/// Counts Ctrl-C presses: the first stops sending, the second stops the final releases, the third
/// exits at once.
fn watch_interrupts() -> watch::Receiver<u32> {
    let (tx, rx) = watch::channel(0u32);
    tokio::spawn(async move {
        let mut presses = 0;
        while tokio::signal::ctrl_c().await.is_ok() {
            presses += 1;
            if presses >= 3 {
                std::process::exit(i32::from(EXIT_INTERRUPTED));
            }
            if tx.send(presses).is_err() {
                break;
            }
        }
    });
    rx
}

async fn sample_loop(shared: Arc<Shared>, every: Duration, mut stop: oneshot::Receiver<()>) -> (Vec<SeriesPoint>, u64) {
    let mut points = Vec::new();
    let mut errors = 0;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = ticker.tick() => {}
        }
        match get_stats(&shared.client, &shared.endpoints.stats).await {
            Ok(stats) => points.push(shared.point(&stats)),
            Err(err) => {
                errors += 1;
                if errors == 1 {
                    shared.bar.suspend(|| eprintln!("vmreplay: warning: sampling /v1/stats failed: {err:#}"));
                }
            }
        }
    }
    (points, errors)
}

fn progress_bar(len: usize, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} requests ({per_sec}, eta {eta}) {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// Writes the predictions CSV (`--predictions`).
fn write_predictions(path: &std::path::Path, rows: &[PredictionRow]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{}", replay::PREDICTION_CSV_HEADER)?;
    for row in rows {
        writeln!(out, "{}", row.csv_line())?;
    }
    out.flush()
}

/// `Authorization: Bearer <token>`, kept out of debug output; `what` names the setting a token
/// that is not printable ASCII came from.
fn bearer_headers(token: &str, what: &str) -> Result<reqwest::header::HeaderMap> {
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| anyhow!("{what} must be printable ASCII"))?;
    value.set_sensitive(true);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    Ok(headers)
}

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let settings = check_flags(&cli)?;
    if !cli.quiet {
        eprintln!("vmreplay: reading the trace");
    }
    let (plan, trace) = load_plan(&cli, &settings)?;
    let events = replay::schedule(&plan, &settings.pacing);
    let releases_planned = events.iter().filter(|e| e.kind == EventKind::Release).count();

    let api_key = cli.api_key.clone().or_else(|| std::env::var(API_KEY_ENV).ok()).filter(|key| !key.is_empty());
    let headers = match api_key {
        Some(key) => bearer_headers(&key, &format!("--api-key (or ${API_KEY_ENV})"))?,
        None => reqwest::header::HeaderMap::new(),
    };
    let client = reqwest::Client::builder()
        .default_headers(headers)
        .timeout(settings.request_timeout)
        .pool_max_idle_per_host(cli.concurrency)
        .build()
        .context("building the HTTP client")?;
    let endpoints = Endpoints::new(&settings.control)?;
    check_ready(&client, &endpoints, &cli.control).await?;
    let start_stats = get_stats(&client, &endpoints.stats).await.context(
        "the control service is up but its statistics are not readable (--control points at something else?)",
    )?;
    let orchestrator = match &cli.confirm_migrations {
        Some(allocator) => {
            let token = orchestrator::admin_token(cli.admin_token_file.as_deref())?;
            Some(
                orchestrator::Orchestrator::connect(allocator, &token, cli.migration_s, settings.request_timeout)
                    .await?,
            )
        }
        None => None,
    };

    if !cli.quiet {
        let planned_s = events.last().map_or(0.0, |e| e.at_s);
        eprintln!(
            "vmreplay: {} VMs from {trace}, trace time {:.0} s .. {:.0} s, {releases_planned} releases in the window; \
             about {:.0} s at {}x; VM ids `{}`",
            plan.vms.len(),
            plan.from_s,
            plan.to_s,
            planned_s,
            settings.pacing.speed,
            if settings.vm_id_prefix.is_empty() {
                "as in the trace".to_owned()
            } else {
                format!("{}-...", settings.vm_id_prefix)
            },
        );
    }

    let mut run = replay::RunInfo {
        control: cli.control.clone(),
        trace,
        vm_id_prefix: settings.vm_id_prefix.clone(),
        from_s: plan.from_s,
        to_s: plan.to_s,
        vms_planned: plan.vms.len(),
        releases_planned,
        speed: settings.pacing.speed,
        max_rate: settings.pacing.max_rate,
        concurrency: cli.concurrency,
        keep: cli.keep,
        ..replay::RunInfo::default()
    };
    let from_s = plan.from_s;
    let shared = Arc::new(Shared {
        client,
        endpoints,
        bar: progress_bar(plan.vms.len(), cli.quiet),
        plan,
        start: Instant::now(),
        pacer: Mutex::new(Pacer::new(settings.pacing.max_rate)),
        tally: Mutex::new(Tally::default()),
        alive: Mutex::new(HashSet::new()),
        trace_now: AtomicU64::new(from_s.to_bits()),
        latency_mark: AtomicUsize::new(0),
        predictions: cli.predictions.as_ref().map(|_| Mutex::new(Vec::new())),
    });
    let mut series = vec![replay::series_point(0.0, from_s, 0, &start_stats)];
    let (stop_sampling, stop) = oneshot::channel();
    let sampler = tokio::spawn(sample_loop(Arc::clone(&shared), settings.sample_every, stop));
    let mut interrupts = watch_interrupts();
    // A migration of --migration-s takes that over --speed in real time: looked at twice as often.
    let confirm_every = Duration::from_secs_f64((cli.migration_s / settings.pacing.speed / 2.0).clamp(0.05, 1.0));
    let (stop_confirming, stop) = oneshot::channel();
    let confirmer = orchestrator.map(|orchestrator| {
        let shared = Arc::clone(&shared);
        let trace_now = move || f64::from_bits(shared.trace_now.load(Ordering::Relaxed));
        tokio::spawn(orchestrator.run(trace_now, confirm_every, stop))
    });

    run.interrupted = dispatch(&shared, &events, cli.concurrency, &mut interrupts).await;
    let _ = stop_sampling.send(());
    let (points, sample_errors) = sampler.await.context("the /v1/stats sampler failed")?;
    series.extend(points);
    let end_stats = match get_stats(&shared.client, &shared.endpoints.stats).await {
        Ok(stats) => {
            let point = shared.point(&stats);
            // A periodic sample taken just before the end says the same as the final one.
            if series.len() > 1 && series.last().is_some_and(|last| point.elapsed_s - last.elapsed_s < 0.5) {
                series.pop();
            }
            series.push(point);
            Some(stats)
        }
        Err(err) => {
            shared.bar.suspend(|| eprintln!("vmreplay: warning: the final /v1/stats failed: {err:#}"));
            None
        }
    };
    run.sample_errors = sample_errors + u64::from(end_stats.is_none());
    shared.bar.finish_and_clear();

    if !cli.keep {
        release_leftovers(&shared, cli.concurrency, &mut interrupts, cli.quiet).await;
    }
    run.wall_s = shared.elapsed_s();
    let _ = stop_confirming.send(());
    let migrations = match confirmer {
        Some(task) => Some(task.await.context("confirming migrations failed")?),
        None => None,
    };
    let quality_stats = if cli.settle_s > 0.0 {
        if !cli.quiet {
            eprintln!("vmreplay: waiting {} s before reading the realized quality (--settle-s)", cli.settle_s);
        }
        tokio::time::sleep(Duration::from_secs_f64(cli.settle_s)).await;
        match get_stats(&shared.client, &shared.endpoints.stats).await {
            Ok(stats) => Some(stats),
            Err(err) => {
                eprintln!("vmreplay: warning: /v1/stats after --settle-s failed: {err:#}");
                run.sample_errors += 1;
                end_stats.clone()
            }
        }
    } else {
        end_stats.clone()
    };
    let mut tally = std::mem::take(&mut *lock(&shared.tally));
    tally.releases.left_placed = lock(&shared.alive).len() as u64;
    let mut delta = end_stats.as_ref().map(|end| replay::stats_delta(&start_stats, end));
    if let (Some(delta), Some(later)) = (delta.as_mut(), quality_stats.as_ref()) {
        // Gate trips until the quality was read still belong to the run.
        delta.quality_gate_trips = later.quality.trips.saturating_sub(start_stats.quality.trips);
    }
    let mut summary = replay::Summary::new(run, tally, delta, series).with_quality(quality_stats.as_ref());
    summary.migrations = migrations;

    if let Some(path) = &cli.plot {
        replay::write_plot(&summary.series, path).context("--plot")?;
        summary.plots.push(path.display().to_string());
        if replay::has_quality(&summary.series) {
            let quality_path = replay::quality_plot_path(path);
            replay::write_quality_plot(&summary.series, &quality_path).context("--plot (realized quality)")?;
            summary.plots.push(quality_path.display().to_string());
        }
    }
    if let (Some(path), Some(rows)) = (&cli.predictions, &shared.predictions) {
        write_predictions(path, &lock(rows)).with_context(|| format!("writing --predictions {}", path.display()))?;
    }
    print!("{}", summary.render());
    if let Some(path) = &cli.json {
        let json = serde_json::to_vec_pretty(&summary).context("serializing the summary")?;
        std::fs::write(path, json).with_context(|| format!("writing --json {}", path.display()))?;
    }
    let requests = &summary.requests;
    if requests.error_rate > cli.max_error_rate {
        bail!(
            "{} of {} allocation requests failed ({:.1}%), more than --max-error-rate {} ({:.1}%); see the errors above",
            requests.errors,
            requests.total,
            requests.error_rate * 100.0,
            cli.max_error_rate,
            cli.max_error_rate * 100.0
        );
    }
    if summary.run.interrupted {
        eprintln!("vmreplay: interrupted by Ctrl-C; the summary covers the requests sent until then");
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    Ok(ExitCode::SUCCESS)
}
