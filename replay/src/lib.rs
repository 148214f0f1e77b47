//! The trace replay client's logic, free of I/O and clocks: which VMs of a trace to request (the
//! [`Plan`], cut by `traces::window` like the simulator's workloads), when to send each allocation
//! and release ([`schedule`]: time compression plus a rate cap), how to read the control service's
//! answers ([`classify_answer`]), and what the run amounted to ([`Tally`], [`percentile`],
//! [`stats_delta`], [`series_point`], [`thin_indices`], the plain-text [`Summary`] and its SVG
//! plots: packing and empty hosts, and the realized prediction quality per model version
//! ([`QualitySummary`], [`QualitySample`], [`write_quality_plot`]); each VM's prediction as CSV
//! ([`PredictionRow`])). The `vmreplay` binary does the HTTP and the waiting.

use domain::quality::{CanaryDecision, QualityFigures, QualityStatus, VersionQuality};
use domain::{AllocationOutcome, ControlDecision, ControlStats, LifetimeClass, LifetimePrediction, Problem, VmRequest};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use traces::stats::format_duration;
use traces::window::{self, InvalidWindow, Warmup, WindowError};
use traces::{TraceError, VmRecord};

/// The window flags (`--from-s`, `--duration-s`, `--max-vms`) and the default `--from-s`.
pub use traces::window::{first_start, WindowSpec};
/// Tenant sent for trace rows without one (the Huawei trace): the wire format requires a tenant.
pub use traces::NO_TENANT;

/// Most rows of the time-series table in the text summary.
pub const TABLE_ROWS: usize = 15;

/// Most distinct error messages kept as examples.
const ERROR_SAMPLES: usize = 5;

/// Why a replay cannot be planned or reported.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{flag} {message}")]
    InvalidFlag { flag: &'static str, message: String },
    #[error("reading the trace: {0}")]
    Trace(#[from] TraceError),
    /// No VM, or none in the window.
    #[error("{}{}", .0, window_hint(.0))]
    Window(WindowError),
    #[error("writing the plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
}

/// What to change when the window holds no VM.
fn window_hint(error: &WindowError) -> &'static str {
    match error {
        WindowError::EmptyWindow { .. } => ": change --from-s or --duration-s",
        _ => "",
    }
}

impl From<InvalidWindow> for ReplayError {
    fn from(error: InvalidWindow) -> Self {
        invalid(error.field.flag(), error.message)
    }
}

impl From<WindowError> for ReplayError {
    fn from(error: WindowError) -> Self {
        match error {
            WindowError::Invalid(error) => error.into(),
            WindowError::Trace(error) => ReplayError::Trace(error),
            other => ReplayError::Window(other),
        }
    }
}

fn invalid(flag: &'static str, message: impl Into<String>) -> ReplayError {
    ReplayError::InvalidFlag { flag, message: message.into() }
}

/// Checks the window flags, naming the flag at fault.
pub fn check_window(window: &WindowSpec) -> Result<(), ReplayError> {
    Ok(window.validate()?)
}

/// One VM to request.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedVm {
    /// The request body's VM, with the run's id prefix.
    pub request: VmRequest,
    /// The VM's id in the trace (without the prefix).
    pub trace_vm_id: String,
    /// Arrival in trace seconds.
    pub start_s: f64,
    /// Departure in trace seconds; `None` when the trace does not know it.
    pub end_s: Option<f64>,
}

/// The VMs of the window, in start order.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub vms: Vec<PlannedVm>,
    /// Trace time the replay starts at (real time 0).
    pub from_s: f64,
    /// Trace time the window ends at: `from_s + duration`, or the last planned start when no duration
    /// was given or `max_vms` cut the window short. VMs ending by then are released on schedule.
    pub to_s: f64,
    /// Trace records read.
    pub records_read: u64,
}

impl Plan {
    /// True when the VM's trace end falls inside the window, so it is released on schedule.
    pub fn releases_in_window(&self, vm: &PlannedVm) -> bool {
        vm.end_s.is_some_and(|end| end <= self.to_s)
    }
}

/// Selects the VMs that start in `[from_s, from_s + duration)`, the earliest `max_vms` of them, in
/// start order (ties in trace order), and builds their requests; `from_s` is the window's start
/// when `window.from_s` gives none (the trace's [`first_start`]). One pass
/// (`traces::window::select`, without warm-up), and with a cap it keeps only `max_vms` records in
/// memory, so a multi-million-row trace costs no more than its window.
pub fn plan(
    records: impl IntoIterator<Item = Result<VmRecord, TraceError>>,
    from_s: f64,
    window: &WindowSpec,
    vm_id_prefix: &str,
) -> Result<Plan, ReplayError> {
    let selected = window::select(records, window, from_s, Warmup::Skip)?;
    let vms = selected
        .vms
        .into_iter()
        .map(|record| {
            Ok(PlannedVm {
                request: record.to_request(vm_id_prefix)?,
                start_s: record.start_s,
                end_s: record.end_s,
                trace_vm_id: record.vm_id,
            })
        })
        .collect::<Result<Vec<_>, ReplayError>>()?;
    Ok(Plan { vms, from_s: selected.from_s, to_s: selected.to_s, records_read: selected.records_read })
}

/// How trace time maps onto real time.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Pacing {
    /// Trace seconds per real second.
    pub speed: f64,
    /// Most requests (allocations and releases together) per real second; `None` for no cap.
    pub max_rate: Option<f64>,
}

impl Pacing {
    pub fn new(speed: f64, max_rate: Option<f64>) -> Result<Self, ReplayError> {
        if !(speed.is_finite() && speed > 0.0) {
            return Err(invalid(
                "--speed",
                format!("must be > 0 (trace seconds per real second, e.g. 1440 for a day per minute), got {speed}"),
            ));
        }
        if let Some(rate) = max_rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(invalid(
                    "--max-rate",
                    format!("must be > 0 requests per second (leave it out for no cap), got {rate}"),
                ));
            }
        }
        Ok(Pacing { speed, max_rate })
    }

    /// Real seconds since the run's start at which trace time `trace_s` comes.
    pub fn real_s(&self, from_s: f64, trace_s: f64) -> f64 {
        (trace_s - from_s) / self.speed
    }
}

/// The rate cap: hands out send times at least `1 / max_rate` apart, never earlier than wanted. A
/// token bucket of depth one, so the cap holds over any interval, however short: no bursts.
#[derive(Clone, Debug, PartialEq)]
pub struct Pacer {
    interval_s: f64,
    next_free_s: f64,
}

impl Pacer {
    pub fn new(max_rate: Option<f64>) -> Self {
        Pacer { interval_s: max_rate.map_or(0.0, |rate| 1.0 / rate), next_free_s: f64::NEG_INFINITY }
    }

    /// Reserves the first send slot at or after `wanted_s` and returns it.
    pub fn reserve(&mut self, wanted_s: f64) -> f64 {
        let at = wanted_s.max(self.next_free_s);
        self.next_free_s = at + self.interval_s;
        at
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Releases sort first: at one instant, the trace's departures free capacity before its arrivals.
    Release,
    Allocate,
}

/// One request of the run.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Event {
    /// Real seconds since the start of the run at which to send, with the rate cap applied.
    pub at_s: f64,
    /// The trace time the event stands for.
    pub trace_s: f64,
    pub kind: EventKind,
    /// Index into [`Plan::vms`].
    pub vm: usize,
}

/// Every allocation at its compressed start time and every in-window release at its compressed end
/// time, in time order, paced by the rate cap. A VM's release never comes before its allocation
/// (a VM that ends when it starts is released right after); releases of VMs that end after the
/// window (or never) are not scheduled: the run releases whatever is left at its end.
pub fn schedule(plan: &Plan, pacing: &Pacing) -> Vec<Event> {
    // (trace time, rank, vm): rank 0 releases, 1 allocations, 2 releases of zero-lifetime VMs.
    let mut pending: Vec<(f64, u8, usize)> = Vec::with_capacity(plan.vms.len() * 2);
    for (i, vm) in plan.vms.iter().enumerate() {
        pending.push((vm.start_s, 1, i));
        if plan.releases_in_window(vm) {
            if let Some(end) = vm.end_s {
                if end > vm.start_s {
                    pending.push((end, 0, i));
                } else {
                    pending.push((vm.start_s, 2, i));
                }
            }
        }
    }
    pending.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut pacer = Pacer::new(pacing.max_rate);
    pending
        .into_iter()
        .map(|(trace_s, rank, vm)| Event {
            at_s: pacer.reserve(pacing.real_s(plan.from_s, trace_s)),
            trace_s,
            kind: if rank == 1 { EventKind::Allocate } else { EventKind::Release },
            vm,
        })
        .collect()
}

/// What one allocation request came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Placed,
    Rejected {
        code: String,
    },
    /// The VM id had been requested before (an earlier run with the same prefix): the allocator
    /// answered that request's decision again.
    Replayed {
        placed: bool,
    },
    Failed {
        kind: String,
        detail: String,
    },
}

/// One answer to `POST /allocate`, read.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub outcome: Outcome,
    /// The control service's own time for the request (`latency_us.total_us`).
    pub server_total_us: Option<u64>,
    /// Each VM's prediction, as the control service answered it.
    pub predictions: Vec<LifetimePrediction>,
}

impl Answer {
    /// Source of each VM's prediction (`model`, `cache`, `fallback_timeout`, ...).
    pub fn prediction_sources(&self) -> Vec<String> {
        self.predictions.iter().map(|p| wire_name(&p.source)).collect()
    }

    /// True when the VM now sits on a host, so it has to be released.
    pub fn is_placed(&self) -> bool {
        matches!(self.outcome, Outcome::Placed | Outcome::Replayed { placed: true })
    }

    /// A request that never got an HTTP answer (connection refused, timeout, ...).
    pub fn transport_error(kind: &str, detail: impl Into<String>) -> Self {
        Answer {
            outcome: Outcome::Failed { kind: format!("transport: {kind}"), detail: detail.into() },
            server_total_us: None,
            predictions: Vec::new(),
        }
    }
}

/// The snake_case wire name of a serde enum value (a rejection code, a prediction source).
fn wire_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// Reads an answer of the control service: a `ControlDecision` on 2xx (201 placed, 200 rejected or
/// replayed), a problem body on anything else.
pub fn classify_answer(status: u16, body: &[u8]) -> Answer {
    let failed = |kind: String, detail: String| Answer {
        outcome: Outcome::Failed { kind, detail },
        server_total_us: None,
        predictions: Vec::new(),
    };
    if !(200..300).contains(&status) {
        let detail = match serde_json::from_slice::<Problem>(body) {
            Ok(problem) => format!("{}: {} ({})", problem.title, problem.detail, problem.problem_type),
            Err(_) => String::from_utf8_lossy(&body[..body.len().min(300)]).trim().to_owned(),
        };
        return failed(format!("HTTP {status}"), detail);
    }
    let decision: ControlDecision = match serde_json::from_slice(body) {
        Ok(decision) => decision,
        Err(err) => return failed(format!("HTTP {status}, unreadable body"), err.to_string()),
    };
    let placed = matches!(decision.decision.outcome, AllocationOutcome::Placed { .. });
    let outcome = match &decision.decision.outcome {
        _ if decision.decision.replayed => Outcome::Replayed { placed },
        AllocationOutcome::Placed { .. } => Outcome::Placed,
        AllocationOutcome::Rejected { rejection } => Outcome::Rejected { code: wire_name(&rejection.code) },
    };
    Answer {
        outcome,
        server_total_us: Some(decision.latency_us.total_us),
        predictions: decision.predictions.into_iter().map(|p| p.prediction).collect(),
    }
}

/// Header of the per-VM predictions CSV (`vmreplay --predictions`): one row per allocation
/// request, in the order the answers came.
pub const PREDICTION_CSV_HEADER: &str =
    "trace_vm_id,vm_id,tenant_id,start_s,end_s,outcome,p_long,class,model_version,source,expected_lifetime_s";

/// One allocation request and the prediction its VM was placed with, for the predictions CSV:
/// what the model said of each VM, to compare with an offline evaluation of the same VMs.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictionRow {
    pub trace_vm_id: String,
    /// The id sent (with the run's prefix).
    pub vm_id: String,
    pub tenant_id: String,
    pub start_s: f64,
    pub end_s: Option<f64>,
    /// `placed`, `rejected`, `replayed` or `failed`.
    pub outcome: &'static str,
    /// `None` when the answer carried none (a failed request).
    pub prediction: Option<LifetimePrediction>,
}

impl PredictionRow {
    pub fn new(vm: &PlannedVm, answer: &Answer) -> Self {
        PredictionRow {
            trace_vm_id: vm.trace_vm_id.clone(),
            vm_id: vm.request.vm_id.as_str().to_owned(),
            tenant_id: vm.request.tenant_id.as_str().to_owned(),
            start_s: vm.start_s,
            end_s: vm.end_s,
            outcome: match answer.outcome {
                Outcome::Placed => "placed",
                Outcome::Rejected { .. } => "rejected",
                Outcome::Replayed { .. } => "replayed",
                Outcome::Failed { .. } => "failed",
            },
            prediction: answer.predictions.first().cloned(),
        }
    }

    /// The row in the order of [`PREDICTION_CSV_HEADER`], without the line break. Numbers are
    /// written in full (shortest round-trip form), absent values as empty fields.
    pub fn csv_line(&self) -> String {
        let number = |value: Option<f64>| value.map_or_else(String::new, |v| v.to_string());
        let p = self.prediction.as_ref();
        [
            csv_field(&self.trace_vm_id),
            csv_field(&self.vm_id),
            csv_field(&self.tenant_id),
            self.start_s.to_string(),
            number(self.end_s),
            self.outcome.to_owned(),
            number(p.map(|p| p.p_long)),
            p.map_or_else(String::new, |p| {
                match p.class {
                    LifetimeClass::Long => "long",
                    LifetimeClass::Short => "short",
                }
                .to_owned()
            }),
            csv_field(p.and_then(|p| p.model_version.as_deref()).unwrap_or("")),
            p.map_or_else(String::new, |p| wire_name(&p.source)),
            number(p.and_then(|p| p.expected_lifetime_s)),
        ]
        .join(",")
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// Releases of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReleaseTally {
    /// `DELETE` requests sent (or attempted).
    pub requests: u64,
    /// Answered 2xx.
    pub released: u64,
    /// Answered 404: the VM was already gone.
    pub not_found: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Of the requests, those sent at the end of the run for VMs still alive.
    pub at_end: u64,
    /// VMs left placed at the end (`--keep`, or releases that failed or were interrupted).
    pub left_placed: u64,
}

/// Everything counted during the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    pub requests: u64,
    pub placed: u64,
    pub rejected: u64,
    pub rejected_by_code: BTreeMap<String, u64>,
    pub replayed: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// The first few distinct error messages, to show what went wrong.
    pub error_samples: Vec<String>,
    pub predictions_by_source: BTreeMap<String, u64>,
    pub client_latency_us: Vec<u64>,
    pub server_total_us: Vec<u64>,
    pub releases: ReleaseTally,
}

impl Tally {
    pub fn record_allocation(&mut self, answer: &Answer, client_us: u64) {
        self.requests += 1;
        self.client_latency_us.push(client_us);
        if let Some(us) = answer.server_total_us {
            self.server_total_us.push(us);
        }
        for source in answer.prediction_sources() {
            *self.predictions_by_source.entry(source).or_default() += 1;
        }
        match &answer.outcome {
            Outcome::Placed => self.placed += 1,
            Outcome::Rejected { code } => {
                self.rejected += 1;
                *self.rejected_by_code.entry(code.clone()).or_default() += 1;
            }
            Outcome::Replayed { .. } => self.replayed += 1,
            Outcome::Failed { kind, detail } => {
                self.errors += 1;
                *self.errors_by_kind.entry(kind.clone()).or_default() += 1;
                self.note_error(format!("POST /allocate: {kind}: {detail}"));
            }
        }
    }

    /// Records a release: its HTTP status, or the transport error's kind and message.
    pub fn record_release(&mut self, answer: Result<u16, (String, String)>, at_end: bool) {
        let releases = &mut self.releases;
        releases.requests += 1;
        releases.at_end += u64::from(at_end);
        let kind = match answer {
            Ok(status) if (200..300).contains(&status) => {
                releases.released += 1;
                return;
            }
            Ok(404) => {
                releases.not_found += 1;
                return;
            }
            Ok(status) => {
                self.note_error(format!("DELETE /allocate: HTTP {status}"));
                format!("HTTP {status}")
            }
            Err((kind, detail)) => {
                self.note_error(format!("DELETE /allocate: transport: {kind}: {detail}"));
                format!("transport: {kind}")
            }
        };
        let releases = &mut self.releases;
        releases.errors += 1;
        *releases.errors_by_kind.entry(kind).or_default() += 1;
    }

    fn note_error(&mut self, message: String) {
        if self.error_samples.len() < ERROR_SAMPLES && !self.error_samples.contains(&message) {
            self.error_samples.push(message);
        }
    }

    /// Share of allocation requests that failed (0 when none was sent).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 / self.requests as f64
        }
    }
}

/// The `q` quantile (0..=1) of sorted values by nearest rank: an observed value, never an
/// interpolation; `None` for no values.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50 / p99 / max of one latency, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl LatencySummary {
    pub fn from_us(samples_us: &[u64]) -> Self {
        let mut ms: Vec<f64> = samples_us.iter().map(|&us| us as f64 / 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        LatencySummary {
            count: ms.len(),
            p50_ms: percentile(&ms, 0.50),
            p99_ms: percentile(&ms, 0.99),
            max_ms: ms.last().copied(),
        }
    }
}

/// What the control service counted during the run: the difference of its `/v1/stats` at the start
/// and the end, so that earlier runs do not count.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatsDelta {
    pub requests: u64,
    pub placed: u64,
    pub rejected: u64,
    pub failed: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// hits / (hits + misses); `None` without lookups.
    pub cache_hit_rate: Option<f64>,
    pub fallbacks: BTreeMap<String, u64>,
    pub predictions_by_source: BTreeMap<String, u64>,
    pub safeguard_trips: u64,
    pub safeguard_active_at_end: bool,
    /// Times the quality gate closed during the run.
    pub quality_gate_trips: u64,
    /// Some counter went down: the service restarted during the run, and the figures count from
    /// the restart.
    pub counters_reset: bool,
}

/// `end - start` of one counter; after a restart (the counter went down) the end value, which is
/// what was counted since.
fn counter_delta(start: u64, end: u64, reset: &mut bool) -> u64 {
    if end >= start {
        end - start
    } else {
        *reset = true;
        end
    }
}

fn map_delta(start: &BTreeMap<String, u64>, end: &BTreeMap<String, u64>, reset: &mut bool) -> BTreeMap<String, u64> {
    end.iter()
        .map(|(name, &e)| (name.clone(), counter_delta(start.get(name).copied().unwrap_or(0), e, reset)))
        .filter(|(_, d)| *d > 0)
        .collect()
}

pub fn stats_delta(start: &ControlStats, end: &ControlStats) -> StatsDelta {
    let mut reset = false;
    let cache_hits = counter_delta(start.cache.hits, end.cache.hits, &mut reset);
    let cache_misses = counter_delta(start.cache.misses, end.cache.misses, &mut reset);
    let lookups = cache_hits + cache_misses;
    StatsDelta {
        requests: counter_delta(start.requests, end.requests, &mut reset),
        placed: counter_delta(start.placed, end.placed, &mut reset),
        rejected: counter_delta(start.rejected, end.rejected, &mut reset),
        failed: counter_delta(start.failed, end.failed, &mut reset),
        cache_hits,
        cache_misses,
        cache_hit_rate: (lookups > 0).then(|| cache_hits as f64 / lookups as f64),
        fallbacks: map_delta(&start.fallbacks, &end.fallbacks, &mut reset),
        predictions_by_source: map_delta(&start.predictions_by_source, &end.predictions_by_source, &mut reset),
        safeguard_trips: counter_delta(start.safeguard.trips, end.safeguard.trips, &mut reset),
        safeguard_active_at_end: end.safeguard.active,
        quality_gate_trips: counter_delta(start.quality.trips, end.quality.trips, &mut reset),
        counters_reset: reset,
    }
}

/// One sample of the allocators' state during the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Real seconds since the start of the run.
    pub elapsed_s: f64,
    /// Trace time the replay had reached (the latest request sent).
    pub trace_s: f64,
    /// VMs this run placed and has not released yet.
    pub vms_alive: u64,
    /// VMs on the allocators (every client's), summed over zones.
    pub allocator_vms: Option<u64>,
    pub hosts: Option<u64>,
    pub empty_hosts: Option<u64>,
    /// Used over offered cores of the non-empty hosts, 0..1 (over several zones, weighted by their
    /// non-empty hosts).
    pub packing_density: Option<f64>,
    /// Percent of hosts that are empty.
    pub empty_hosts_pct: Option<f64>,
    /// The realized prediction quality per model version (the control service's `quality`: every
    /// zone's window added up), as it stood at this sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quality: Vec<QualitySample>,
}

/// One model version's realized quality in one `/v1/stats` sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QualitySample {
    pub version: String,
    /// Outcomes in the window (resolved, cohort complete).
    pub resolved: u64,
    pub roc_auc: Option<f64>,
    pub average_precision: Option<f64>,
    pub precision: Option<f64>,
    pub recall: Option<f64>,
}

impl QualitySample {
    pub fn of(version: &VersionQuality) -> Self {
        let f = &version.figures;
        QualitySample {
            version: version.version.clone(),
            resolved: f.resolved,
            roc_auc: f.roc_auc,
            average_precision: f.average_precision,
            precision: f.precision,
            recall: f.recall,
        }
    }
}

/// A time-series point from a `/v1/stats` answer. Zones whose allocator did not answer, and fields
/// an allocator does not report, are left out rather than read as zero.
pub fn series_point(elapsed_s: f64, trace_s: f64, vms_alive: u64, stats: &ControlStats) -> SeriesPoint {
    let mut point = SeriesPoint {
        elapsed_s,
        trace_s,
        vms_alive,
        quality: stats.quality.versions.iter().map(QualitySample::of).collect(),
        ..SeriesPoint::default()
    };
    let (mut density_sum, mut density_weight, mut empty_pct_sum, mut empty_pct_zones) = (0.0, 0.0, 0.0, 0u32);
    let add = |slot: &mut Option<u64>, value: Option<u64>| {
        if let Some(v) = value {
            *slot = Some(slot.unwrap_or(0) + v);
        }
    };
    for zone in stats.zones.values() {
        let Some(zone_stats) = &zone.stats else { continue };
        let uint = |name: &str| zone_stats.get(name).and_then(serde_json::Value::as_u64);
        let float = |name: &str| zone_stats.get(name).and_then(serde_json::Value::as_f64);
        let (hosts, empty) = (uint("hosts"), uint("empty_hosts"));
        add(&mut point.allocator_vms, uint("vms"));
        add(&mut point.hosts, hosts);
        add(&mut point.empty_hosts, empty);
        if let Some(density) = float("packing_density") {
            let weight = match (hosts, empty) {
                (Some(h), Some(e)) => h.saturating_sub(e) as f64,
                _ => 1.0,
            };
            density_sum += density * weight;
            density_weight += weight;
        }
        if let Some(pct) = float("empty_hosts_pct") {
            empty_pct_sum += pct;
            empty_pct_zones += 1;
        }
    }
    point.packing_density = if density_weight > 0.0 {
        Some(density_sum / density_weight)
    } else if stats.zones.len() == 1 {
        // One zone with every host empty: weight 0, and its own figure is the answer.
        stats.zones.values().find_map(|z| z.stats.as_ref()?.get("packing_density")?.as_f64())
    } else {
        None
    };
    point.empty_hosts_pct = match (point.hosts, point.empty_hosts) {
        (Some(hosts), Some(empty)) if hosts > 0 => Some(100.0 * empty as f64 / hosts as f64),
        _ if empty_pct_zones > 0 => Some(empty_pct_sum / f64::from(empty_pct_zones)),
        _ => None,
    };
    point
}

/// Indices of at most `max` of `n` rows, evenly spread, first and last included.
pub fn thin_indices(n: usize, max: usize) -> Vec<usize> {
    if n <= max {
        return (0..n).collect();
    }
    match max {
        0 => Vec::new(),
        1 => vec![n - 1],
        _ => {
            let mut picked: Vec<usize> =
                (0..max).map(|i| ((i as f64 * (n - 1) as f64) / (max - 1) as f64).round() as usize).collect();
            picked.dedup();
            picked
        }
    }
}

/// One model version's realized quality at the end of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct VersionSummary {
    pub version: String,
    /// `stable`, `canary`, or empty for a version no longer deployed.
    pub role: String,
    /// Outcomes resolved since the allocators started, in the window or not (every zone's).
    pub resolved_total: u64,
    /// VMs placed with its predictions whose outcomes are not in the window yet.
    pub pending: u64,
    /// What the zones' windows amount to, added up.
    pub figures: QualityFigures,
}

/// The realized prediction quality at the end of the run (the control service's `/v1/stats`
/// `quality`): the quality gate and, per model version, the figures of every zone's window added
/// up. The windows are the allocators' (outcomes since they started, the last `[quality] window`
/// per version), so they hold this run's VMs only on allocators that started fresh.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct QualitySummary {
    pub gate_enabled: bool,
    pub gated: bool,
    pub gate_reason: Option<String>,
    /// Since the control service started.
    pub gate_trips: u64,
    pub gate_recoveries: u64,
    pub stable_version: Option<String>,
    pub canary_version: Option<String>,
    /// Most recently seen version first, as the service lists them.
    pub versions: Vec<VersionSummary>,
    pub last_canary_decision: Option<CanaryDecision>,
}

impl QualitySummary {
    pub fn of(status: &QualityStatus) -> Self {
        let role = |version: &str| {
            if status.stable_version.as_deref() == Some(version) {
                "stable"
            } else if status.canary_version.as_deref() == Some(version) {
                "canary"
            } else {
                ""
            }
        };
        QualitySummary {
            gate_enabled: status.gate_enabled,
            gated: status.gated,
            gate_reason: status.reason.clone(),
            gate_trips: status.trips,
            gate_recoveries: status.recoveries,
            stable_version: status.stable_version.clone(),
            canary_version: status.canary_version.clone(),
            versions: status
                .versions
                .iter()
                .map(|v| VersionSummary {
                    version: v.version.clone(),
                    role: role(&v.version).to_owned(),
                    resolved_total: v.resolved_total,
                    pending: v.pending,
                    figures: v.figures.clone(),
                })
                .collect(),
            last_canary_decision: status.last_canary_decision.clone(),
        }
    }

    /// The gate's state in words.
    fn gate_state(&self) -> String {
        if !self.gate_enabled {
            "off (measured only)".to_owned()
        } else if self.gated {
            format!("CLOSED: {}", self.gate_reason.as_deref().unwrap_or("no reason given"))
        } else {
            "open".to_owned()
        }
    }
}

/// What was replayed and how.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunInfo {
    pub control: String,
    /// The trace file, or `synthetic (D days, seed S)`.
    pub trace: String,
    pub vm_id_prefix: String,
    pub from_s: f64,
    pub to_s: f64,
    pub vms_planned: usize,
    pub releases_planned: usize,
    pub speed: f64,
    pub max_rate: Option<f64>,
    pub concurrency: usize,
    pub keep: bool,
    /// Real seconds from the first request to the end of the last release.
    pub wall_s: f64,
    /// Stopped early by Ctrl-C.
    pub interrupted: bool,
    /// `/v1/stats` samples that failed.
    pub sample_errors: u64,
}

/// Allocation requests and their answers.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestSummary {
    pub total: u64,
    pub placed: u64,
    pub rejected: u64,
    pub rejected_by_code: BTreeMap<String, u64>,
    pub replayed: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    pub error_rate: f64,
    pub error_samples: Vec<String>,
    /// Allocation requests per real second over the run.
    pub rate_per_s: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latencies {
    /// Measured by the client around each `POST /allocate`, body included.
    pub client: LatencySummary,
    /// The control service's `latency_us.total_us`.
    pub server_total: LatencySummary,
}

/// The whole report of a run; `--json` writes it as is.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub run: RunInfo,
    pub requests: RequestSummary,
    pub releases: ReleaseTally,
    pub latency: Latencies,
    /// Each VM's prediction source, from the answers.
    pub predictions_by_source: BTreeMap<String, u64>,
    /// From the control service's `/v1/stats`; `None` when the end snapshot failed.
    pub control_stats: Option<StatsDelta>,
    /// The realized prediction quality at the end; `None` when the end snapshot failed.
    pub quality: Option<QualitySummary>,
    /// The SVG files written (`--plot` and its quality plot), named in the text.
    pub plots: Vec<String>,
    pub series: Vec<SeriesPoint>,
}

impl Summary {
    pub fn new(run: RunInfo, tally: Tally, control_stats: Option<StatsDelta>, series: Vec<SeriesPoint>) -> Self {
        let rate_per_s = if run.wall_s > 0.0 { tally.requests as f64 / run.wall_s } else { 0.0 };
        Summary {
            requests: RequestSummary {
                total: tally.requests,
                placed: tally.placed,
                rejected: tally.rejected,
                error_rate: tally.error_rate(),
                rejected_by_code: tally.rejected_by_code,
                replayed: tally.replayed,
                errors: tally.errors,
                errors_by_kind: tally.errors_by_kind,
                error_samples: tally.error_samples,
                rate_per_s,
            },
            releases: tally.releases,
            latency: Latencies {
                client: LatencySummary::from_us(&tally.client_latency_us),
                server_total: LatencySummary::from_us(&tally.server_total_us),
            },
            predictions_by_source: tally.predictions_by_source,
            control_stats,
            quality: None,
            plots: Vec::new(),
            series,
            run,
        }
    }

    /// The same summary with the realized quality of `stats` (the end of the run, or later).
    pub fn with_quality(mut self, stats: Option<&ControlStats>) -> Self {
        self.quality = stats.map(|stats| QualitySummary::of(&stats.quality));
        self
    }

    /// The readable plain-text report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = self.render_into(&mut out);
        out
    }

    fn render_into(&self, out: &mut String) -> std::fmt::Result {
        let run = &self.run;
        let req = &self.requests;
        let rate = run.max_rate.map_or_else(|| "no rate cap".to_owned(), |r| format!("at most {r} requests/s"));
        writeln!(out, "vmreplay against {}", run.control)?;
        writeln!(
            out,
            "trace     {}: {} VMs starting in trace time [{:.0} s, {:.0} s] ({}), {}",
            run.trace,
            run.vms_planned,
            run.from_s,
            run.to_s,
            format_duration(run.to_s - run.from_s),
            if run.vm_id_prefix.is_empty() {
                "the trace's VM ids".to_owned()
            } else {
                format!("VM ids prefixed `{}-`", run.vm_id_prefix)
            }
        )?;
        writeln!(out, "pacing    speed {}x, {rate}, concurrency {}", run.speed, run.concurrency)?;
        let state = if run.interrupted { "interrupted (Ctrl-C)" } else { "completed" };
        writeln!(out, "run       {state} in {:.1} s real ({:.1} allocations/s)", run.wall_s, req.rate_per_s)?;
        writeln!(out)?;
        writeln!(out, "requests  {:>8}", req.total)?;
        writeln!(out, "  placed  {:>8}", req.placed)?;
        writeln!(out, "  rejected{:>8}{}", req.rejected, breakdown(&req.rejected_by_code))?;
        writeln!(out, "  replayed{:>8}", req.replayed)?;
        writeln!(out, "  errors  {:>8}{}", req.errors, breakdown(&req.errors_by_kind))?;
        for sample in &req.error_samples {
            writeln!(out, "      e.g. {sample}")?;
        }
        let rel = &self.releases;
        writeln!(
            out,
            "releases  {:>8}   released {}, not found {}, errors {}{} (at the end of the run: {}; left placed: {})",
            rel.requests,
            rel.released,
            rel.not_found,
            rel.errors,
            breakdown(&rel.errors_by_kind),
            rel.at_end,
            rel.left_placed
        )?;
        writeln!(out)?;
        writeln!(out, "latency (ms)        p50       p99       max")?;
        for (name, lat) in [("client", &self.latency.client), ("server total", &self.latency.server_total)] {
            writeln!(out, "  {name:<12} {:>9} {:>9} {:>9}", ms(lat.p50_ms), ms(lat.p99_ms), ms(lat.max_ms))?;
        }
        writeln!(out)?;
        match &self.control_stats {
            Some(delta) => {
                let hit_rate = delta.cache_hit_rate.map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0));
                writeln!(
                    out,
                    "cache     hit rate {hit_rate} ({} hits, {} misses)",
                    delta.cache_hits, delta.cache_misses
                )?;
                writeln!(out, "fallbacks {}", list_or_none(&delta.fallbacks))?;
                let active = if delta.safeguard_active_at_end { "active" } else { "inactive" };
                writeln!(out, "safeguard {} trips ({active} at the end)", delta.safeguard_trips)?;
                if delta.counters_reset {
                    writeln!(
                        out,
                        "          (the control service restarted during the run: its figures count from then)"
                    )?;
                }
            }
            None => writeln!(out, "cache, fallbacks, safeguard: unknown (the final /v1/stats failed)")?,
        }
        writeln!(out, "predictions {}", list_or_none(&self.predictions_by_source))?;
        writeln!(out)?;
        self.render_quality(out)?;
        self.render_series(out)?;
        self.render_quality_series(out)?;
        if !self.plots.is_empty() {
            writeln!(out)?;
            writeln!(out, "plots     {}", self.plots.join(", "))?;
        }
        Ok(())
    }

    fn render_quality(&self, out: &mut String) -> std::fmt::Result {
        let Some(quality) = &self.quality else {
            return writeln!(out, "realized quality: unknown (the final /v1/stats failed)\n");
        };
        let trips = self.control_stats.as_ref().map_or(0, |d| d.quality_gate_trips);
        writeln!(
            out,
            "realized quality (each zone's window of resolved outcomes, cohorts complete, added up per model version)"
        )?;
        writeln!(
            out,
            "  gate    {}; {trips} trips during the run ({} trips, {} recoveries since the service started)",
            quality.gate_state(),
            quality.gate_trips,
            quality.gate_recoveries
        )?;
        if let Some(decision) = &quality.last_canary_decision {
            writeln!(
                out,
                "  canary  last decision: {} {} (AP {:.3} vs stable {} {:.3}, {} / {} resolved{})",
                decision.verdict,
                decision.canary_version,
                decision.canary_average_precision,
                decision.stable_version,
                decision.stable_average_precision,
                decision.canary_resolved,
                decision.stable_resolved,
                if decision.applied { "" } else { ", not applied" }
            )?;
        }
        if quality.versions.is_empty() {
            writeln!(out, "  no model version has resolved outcomes yet")?;
            return writeln!(out);
        }
        writeln!(
            out,
            "  {:<20} {:<6} {:>9} {:>8} {:>9} {:>7} {:>7} {:>7} {:>14} {:>7} {:>7}",
            "version",
            "role",
            "resolved",
            "pending",
            "precision",
            "recall",
            "ROC AUC",
            "AP",
            "long realized",
            "pred.",
            "mean p"
        )?;
        for v in &quality.versions {
            let f = &v.figures;
            writeln!(
                out,
                "  {:<20} {:<6} {:>9} {:>8} {:>9} {:>7} {:>7} {:>7} {:>14} {:>7} {:>7}",
                v.version,
                v.role,
                f.resolved,
                v.pending,
                fig(f.precision),
                fig(f.recall),
                fig(f.roc_auc),
                fig(f.average_precision),
                pct(f.realized_long_share),
                pct(f.predicted_long_share),
                fig(f.mean_p_long),
            )?;
        }
        writeln!(out)
    }

    fn render_quality_series(&self, out: &mut String) -> std::fmt::Result {
        let sampled: Vec<&SeriesPoint> = self.series.iter().filter(|p| !p.quality.is_empty()).collect();
        if sampled.is_empty() {
            return Ok(());
        }
        let rows = thin_indices(sampled.len(), TABLE_ROWS);
        writeln!(out)?;
        writeln!(out, "realized quality over time ({} of {} samples)", rows.len(), sampled.len())?;
        writeln!(
            out,
            "  {:>8}  {:>14}  {:<20} {:>9} {:>7} {:>7} {:>9} {:>7}",
            "real s", "trace s", "version", "resolved", "ROC AUC", "AP", "precision", "recall"
        )?;
        for i in rows {
            let p = sampled[i];
            for q in &p.quality {
                writeln!(
                    out,
                    "  {:>8.1}  {:>14.0}  {:<20} {:>9} {:>7} {:>7} {:>9} {:>7}",
                    p.elapsed_s,
                    p.trace_s,
                    q.version,
                    q.resolved,
                    fig(q.roc_auc),
                    fig(q.average_precision),
                    fig(q.precision),
                    fig(q.recall)
                )?;
            }
        }
        Ok(())
    }

    fn render_series(&self, out: &mut String) -> std::fmt::Result {
        if self.series.is_empty() {
            return writeln!(out, "time series: no /v1/stats sample");
        }
        let rows = thin_indices(self.series.len(), TABLE_ROWS);
        writeln!(out, "time series ({} of {} samples)", rows.len(), self.series.len())?;
        writeln!(
            out,
            "  {:>8}  {:>14}  {:>9}  {:>13}  {:>7}  {:>11}",
            "real s", "trace s", "VMs alive", "allocator VMs", "density", "empty hosts"
        )?;
        for i in rows {
            let p = &self.series[i];
            writeln!(
                out,
                "  {:>8.1}  {:>14.0}  {:>9}  {:>13}  {:>7}  {:>11}",
                p.elapsed_s,
                p.trace_s,
                p.vms_alive,
                p.allocator_vms.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                p.packing_density.map_or_else(|| "-".to_owned(), |d| format!("{:.1}%", d * 100.0)),
                p.empty_hosts_pct.map_or_else(|| "-".to_owned(), |e| format!("{e:.1}%")),
            )?;
        }
        Ok(())
    }
}

/// A figure in [0, 1] to three decimals, `-` when absent.
fn fig(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

/// A share as a percentage, `-` when absent.
fn pct(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{:.1}%", v * 100.0))
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn list_or_none(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        "none".to_owned()
    } else {
        counts.iter().map(|(name, n)| format!("{name} {n}")).collect::<Vec<_>>().join(", ")
    }
}

fn breakdown(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        String::new()
    } else {
        format!("   ({})", list_or_none(counts))
    }
}

/// Draws packing density and empty hosts (both in percent) over trace time, in hours, as SVG.
pub fn write_plot(series: &[SeriesPoint], path: &Path) -> Result<(), ReplayError> {
    draw_plot(series, path).map_err(|err| ReplayError::Plot { path: path.to_owned(), message: err.to_string() })
}

fn draw_plot(series: &[SeriesPoint], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let hours = |p: &SeriesPoint| p.trace_s / 3_600.0;
    let x_min = series.iter().map(hours).fold(f64::INFINITY, f64::min);
    let x_max = series.iter().map(hours).fold(f64::NEG_INFINITY, f64::max);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min { (x_min, x_max) } else { (0.0, 1.0) };
    let density: Vec<(f64, f64)> = series.iter().filter_map(|p| Some((hours(p), p.packing_density? * 100.0))).collect();
    let empty: Vec<(f64, f64)> = series.iter().filter_map(|p| Some((hours(p), p.empty_hosts_pct?))).collect();
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Packing density and empty hosts during the replay", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x_min..x_max, 0.0..100.0)?;
    chart.configure_mesh().x_desc("trace time (h)").y_desc("%").draw()?;
    for (name, points, color) in [("packing density", density, BLUE), ("empty hosts", empty, RED)] {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}

/// Where the quality plot goes beside the `--plot` file: `replay.svg` -> `replay-quality.svg`.
pub fn quality_plot_path(plot: &Path) -> PathBuf {
    let stem = plot.file_stem().map_or_else(|| "replay".into(), |s| s.to_string_lossy().into_owned());
    plot.with_file_name(format!("{stem}-quality.svg"))
}

/// True when some sample carries a model version's realized quality (worth a plot).
pub fn has_quality(series: &[SeriesPoint]) -> bool {
    series.iter().any(|p| !p.quality.is_empty())
}

/// Draws the realized quality of each model version over trace time, in hours, as SVG: four
/// panels (ROC AUC, average precision, precision, recall of the long-lived class), one line per
/// version. A sample without a figure (too few outcomes, one class only) leaves a gap.
pub fn write_quality_plot(series: &[SeriesPoint], path: &Path) -> Result<(), ReplayError> {
    draw_quality_plot(series, path).map_err(|err| ReplayError::Plot { path: path.to_owned(), message: err.to_string() })
}

/// Reads one figure of a sample.
type Figure = fn(&QualitySample) -> Option<f64>;

/// A version's line: runs of (trace hours, value) between missing values.
type VersionLine = (String, Vec<Vec<(f64, f64)>>);

/// The figures the quality plot draws, with their panel titles.
const QUALITY_PANELS: [(&str, Figure); 4] = [
    ("ROC AUC", |q| q.roc_auc),
    ("average precision", |q| q.average_precision),
    ("precision (long-lived)", |q| q.precision),
    ("recall (long-lived)", |q| q.recall),
];

/// Each version's points of one figure, in sample order, cut into runs at missing values.
fn quality_lines(series: &[SeriesPoint], figure: Figure) -> Vec<VersionLine> {
    let mut versions: Vec<String> = Vec::new();
    for point in series {
        for q in &point.quality {
            if !versions.contains(&q.version) {
                versions.push(q.version.clone());
            }
        }
    }
    versions
        .into_iter()
        .map(|version| {
            let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
            let mut run: Vec<(f64, f64)> = Vec::new();
            for point in series {
                match point.quality.iter().find(|q| q.version == version).and_then(figure).filter(|v| v.is_finite()) {
                    Some(v) => run.push((point.trace_s / 3_600.0, v)),
                    None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
                    None => {}
                }
            }
            if !run.is_empty() {
                runs.push(run);
            }
            (version, runs)
        })
        .collect()
}

fn draw_quality_plot(series: &[SeriesPoint], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let hours = |p: &SeriesPoint| p.trace_s / 3_600.0;
    let x_min = series.iter().map(hours).fold(f64::INFINITY, f64::min);
    let x_max = series.iter().map(hours).fold(f64::NEG_INFINITY, f64::max);
    let (x_min, x_max) = if x_min.is_finite() && x_max > x_min { (x_min, x_max) } else { (0.0, 1.0) };
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled("Realized prediction quality during the replay, per model version", ("sans-serif", 20))?;
    for (area, (title, figure)) in root.split_evenly((2, 2)).iter().zip(QUALITY_PANELS) {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(45)
            .build_cartesian_2d(x_min..x_max, 0.0..1.0)?;
        chart.configure_mesh().x_desc("trace time (h)").draw()?;
        for (k, (version, runs)) in quality_lines(series, figure).into_iter().enumerate() {
            let color = Palette99::pick(k).to_rgba();
            let mut labelled = false;
            for run in runs {
                let drawn = chart.draw_series(LineSeries::new(run, color.stroke_width(2)))?;
                if !labelled {
                    labelled = true;
                    drawn
                        .label(version.clone())
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::{CacheStats, SafeguardStatus, ZoneStats};
    use std::sync::Arc;
    use traces::ExtraColumns;

    fn record(id: &str, start_s: f64, end_s: Option<f64>) -> VmRecord {
        VmRecord {
            vm_id: id.to_owned(),
            tenant_id: "t1".to_owned(),
            vm_type: "D2".to_owned(),
            cores: 2.0,
            memory_gib: 8.0,
            priority: domain::Priority::Regular,
            start_s,
            end_s,
            extra: ExtraColumns::default(),
        }
    }

    fn model_prediction(p_long: f64) -> LifetimePrediction {
        LifetimePrediction {
            p_long,
            class: if p_long >= 0.5 { LifetimeClass::Long } else { LifetimeClass::Short },
            interval_class: None,
            expected_lifetime_s: None,
            model_version: Some("m-1".into()),
            source: domain::PredictionSource::Model,
        }
    }

    fn ok(records: Vec<VmRecord>) -> impl Iterator<Item = Result<VmRecord, TraceError>> {
        records.into_iter().map(Ok)
    }

    fn window(from_s: Option<f64>, duration_s: Option<f64>, max_vms: Option<usize>) -> WindowSpec {
        WindowSpec { from_s, duration_s, max_vms }
    }

    #[test]
    fn the_plan_keeps_the_window_in_start_order() {
        let records = vec![
            record("late", 500.0, None),
            record("b", 20.0, Some(30.0)),
            record("before", 5.0, Some(8.0)),
            record("a", 10.0, Some(400.0)),
            record("a2", 10.0, None),
        ];
        let plan = plan(ok(records), 10.0, &window(Some(10.0), Some(100.0), None), "run").unwrap();
        let ids: Vec<&str> = plan.vms.iter().map(|v| v.request.vm_id.as_str()).collect();
        assert_eq!(ids, ["run-a", "run-a2", "run-b"]);
        assert_eq!(plan.vms[0].trace_vm_id, "a", "the trace's own id is kept beside the prefixed one");
        assert_eq!((plan.from_s, plan.to_s, plan.records_read), (10.0, 110.0, 5));
        assert!(plan.releases_in_window(&plan.vms[2]));
        assert!(!plan.releases_in_window(&plan.vms[0]), "ends after the window");
        assert!(!plan.releases_in_window(&plan.vms[1]), "no end");
    }

    #[test]
    fn max_vms_keeps_the_earliest_and_ends_the_window_at_the_last_of_them() {
        let records = (0..10).rev().map(|i| record(&format!("v{i}"), f64::from(i) * 10.0, None)).collect();
        let plan = plan(ok(records), 0.0, &window(None, Some(1000.0), Some(3)), "").unwrap();
        let ids: Vec<&str> = plan.vms.iter().map(|v| v.request.vm_id.as_str()).collect();
        assert_eq!(ids, ["v0", "v1", "v2"]);
        assert_eq!(plan.to_s, 20.0);
    }

    #[test]
    fn first_start_is_the_minimum_and_an_empty_window_says_where_the_trace_is() {
        let records = || ok(vec![record("a", 50.0, None), record("b", -20.0, None)]);
        assert_eq!(first_start(records()).unwrap(), -20.0);
        let err = plan(records(), 1000.0, &window(Some(1000.0), None, None), "p").unwrap_err();
        let message = err.to_string();
        assert!(message.contains("from 1000 s on") && message.contains("between -20 s and 50 s"), "{message}");
        let err = plan(records(), 60.0, &window(None, Some(10.0), None), "p").unwrap_err();
        assert!(err.to_string().contains("window [60 s, 70 s)"), "{err}");
        assert!(err.to_string().ends_with(": change --from-s or --duration-s"), "{err}");
        assert!(matches!(first_start(ok(Vec::new())), Err(WindowError::EmptyTrace)));
        let err = plan(ok(Vec::new()), 0.0, &window(None, None, None), "p").unwrap_err();
        assert!(matches!(err, ReplayError::Window(WindowError::EmptyTrace)), "{err:?}");
        assert_eq!(err.to_string(), "the trace holds no VM");
    }

    #[test]
    fn the_request_carries_prefix_features_os_and_start_time() {
        let names: Arc<[String]> = ["os", "batch_size", "pool", "empty"].map(str::to_owned).into();
        let mut rec = record("vm7", 123.5, Some(200.0));
        rec.tenant_id = String::new();
        rec.extra = ExtraColumns::new(names, ["linux", "3", "gpu-a", ""].map(str::to_owned).to_vec());
        let vm = rec.to_request("r1").unwrap();
        let json = serde_json::to_value(domain::AllocationRequest::Vm(vm)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"vm": {
                "vm_id": "r1-vm7", "tenant_id": NO_TENANT, "vm_type": "D2",
                "demand": {"cores": 2.0, "memory_gib": 8.0, "ssd_gib": 0.0},
                "priority": "regular", "os": "linux", "requested_at_s": 123.5,
                "features": {"batch_size": 3.0, "pool": "gpu-a"}
            }})
        );
        // What we send passes the service's own validation.
        let body = serde_json::to_vec(&json).unwrap();
        domain::decode_json::<domain::AllocationRequest>(&body, &domain::ValidationLimits::default()).unwrap();
    }

    #[test]
    fn flags_are_checked_with_their_names() {
        assert!(Pacing::new(0.0, None).unwrap_err().to_string().starts_with("--speed must be > 0"));
        assert!(Pacing::new(1.0, Some(-1.0)).unwrap_err().to_string().starts_with("--max-rate must be > 0"));
        let flag_error = |window: WindowSpec| check_window(&window).unwrap_err().to_string();
        assert!(flag_error(window(None, Some(0.0), None)).starts_with("--duration-s must be > 0"));
        assert!(flag_error(window(None, None, Some(0))).starts_with("--max-vms must be at least 1"));
        assert!(flag_error(window(Some(f64::NAN), None, None)).starts_with("--from-s must be a finite number"));
        assert!(check_window(&window(Some(-3.0), Some(1.0), Some(1))).is_ok());
        // plan checks them too, in the same terms.
        let err = plan(ok(vec![record("a", 0.0, None)]), 0.0, &window(None, None, Some(0)), "p").unwrap_err();
        assert!(err.to_string().starts_with("--max-vms must be at least 1"), "{err}");
    }

    fn plan_of(vms: &[(f64, Option<f64>)], from_s: f64, to_s: f64) -> Plan {
        let vms = vms
            .iter()
            .enumerate()
            .map(|(i, &(start_s, end_s))| PlannedVm {
                request: record(&format!("v{i}"), start_s, end_s).to_request("").unwrap(),
                start_s,
                end_s,
                trace_vm_id: format!("v{i}"),
            })
            .collect();
        Plan { vms, from_s, to_s, records_read: 0 }
    }

    fn times(events: &[Event]) -> Vec<(f64, EventKind, usize)> {
        events.iter().map(|e| ((e.at_s * 1e6).round() / 1e6, e.kind, e.vm)).collect()
    }

    #[test]
    fn compression_maps_trace_time_and_releases_come_at_end_times() {
        use EventKind::{Allocate as A, Release as R};
        // speed 10: 10 trace seconds per real second, from trace time 100.
        let plan =
            plan_of(&[(100.0, Some(150.0)), (120.0, None), (130.0, Some(150.0)), (140.0, Some(900.0))], 100.0, 200.0);
        let events = schedule(&plan, &Pacing::new(10.0, None).unwrap());
        assert_eq!(
            times(&events),
            [(0.0, A, 0), (2.0, A, 1), (3.0, A, 2), (4.0, A, 3), (5.0, R, 0), (5.0, R, 2)],
            "no release for the VM without an end nor for the one ending after the window"
        );
        assert_eq!(events[4].trace_s, 150.0);
    }

    #[test]
    fn releases_free_capacity_before_arrivals_at_one_instant_but_never_before_their_own_allocation() {
        use EventKind::{Allocate as A, Release as R};
        let plan = plan_of(&[(0.0, Some(10.0)), (10.0, Some(10.0)), (10.0, Some(20.0))], 0.0, 20.0);
        let events = schedule(&plan, &Pacing::new(1.0, None).unwrap());
        assert_eq!(times(&events), [(0.0, A, 0), (10.0, R, 0), (10.0, A, 1), (10.0, A, 2), (10.0, R, 1), (20.0, R, 2)]);
    }

    #[test]
    fn the_rate_cap_spaces_every_request_and_never_bursts() {
        use EventKind::{Allocate as A, Release as R};
        // Five VMs at the same instant, then one much later; 2 requests/s at most.
        let plan =
            plan_of(&[(0.0, Some(1.0)), (0.0, None), (0.0, None), (0.0, None), (0.0, None), (100.0, None)], 0.0, 100.0);
        let events = schedule(&plan, &Pacing::new(1.0, Some(2.0)).unwrap());
        assert_eq!(
            times(&events),
            [(0.0, A, 0), (0.5, A, 1), (1.0, A, 2), (1.5, A, 3), (2.0, A, 4), (2.5, R, 0), (100.0, A, 5)],
            "the release waits for its slot; the late VM keeps its own time"
        );
        for pair in events.windows(2) {
            assert!(pair[1].at_s - pair[0].at_s >= 0.5 - 1e-9);
        }
    }

    #[test]
    fn the_pacer_never_hands_out_two_slots_closer_than_the_interval() {
        let mut pacer = Pacer::new(Some(4.0));
        assert_eq!(pacer.reserve(1.0), 1.0);
        assert_eq!(pacer.reserve(1.0), 1.25);
        assert_eq!(pacer.reserve(1.3), 1.5);
        assert_eq!(pacer.reserve(9.0), 9.0);
        let mut free = Pacer::new(None);
        assert_eq!((free.reserve(3.0), free.reserve(3.0)), (3.0, 3.0));
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.5), Some(50.0));
        assert_eq!(percentile(&values, 0.99), Some(99.0));
        assert_eq!(percentile(&values, 1.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
        let lat = LatencySummary::from_us(&[3000, 1000, 2000]);
        assert_eq!((lat.count, lat.p50_ms, lat.p99_ms, lat.max_ms), (3, Some(2.0), Some(3.0), Some(3.0)));
    }

    fn stats(hits: u64, misses: u64, fallbacks: &[(&str, u64)], trips: u64) -> ControlStats {
        ControlStats {
            requests: hits + misses,
            cache: CacheStats { hits, misses, hit_rate: 0.0, entries: 0 },
            fallbacks: fallbacks.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
            safeguard: SafeguardStatus { trips, ..SafeguardStatus::default() },
            ..ControlStats::default()
        }
    }

    #[test]
    fn the_stats_delta_counts_only_this_run() {
        let start = stats(100, 50, &[("timeout", 4)], 1);
        let end = stats(180, 70, &[("timeout", 9), ("error", 2)], 3);
        let delta = stats_delta(&start, &end);
        assert_eq!((delta.cache_hits, delta.cache_misses), (80, 20));
        assert_eq!(delta.cache_hit_rate, Some(0.8));
        assert_eq!(delta.fallbacks, BTreeMap::from([("error".to_owned(), 2), ("timeout".to_owned(), 5)]));
        assert_eq!((delta.safeguard_trips, delta.requests, delta.counters_reset), (2, 100, false));
        assert_eq!(stats_delta(&end, &end).cache_hit_rate, None);
        // A restart in between: the counters start over and the end values are what counted.
        let after_restart = stats_delta(&end, &stats(5, 5, &[], 0));
        assert!(after_restart.counters_reset);
        assert_eq!((after_restart.cache_hits, after_restart.cache_hit_rate), (5, Some(0.5)));
    }

    #[test]
    fn series_points_read_and_combine_the_zones_stats() {
        let zone =
            |stats: serde_json::Value| ZoneStats { allocator: "http://a".into(), stats: Some(stats), error: None };
        let mut control = ControlStats::default();
        control.zones.insert(
            "z1".into(),
            zone(serde_json::json!({"packing_density": 0.9, "empty_hosts_pct": 50.0, "vms": 10, "empty_hosts": 5, "hosts": 10})),
        );
        let one = series_point(1.0, 2.0, 3, &control);
        assert_eq!(
            (one.packing_density, one.empty_hosts_pct, one.allocator_vms, one.vms_alive),
            (Some(0.9), Some(50.0), Some(10), 3)
        );
        control.zones.insert(
            "z2".into(),
            zone(serde_json::json!({"packing_density": 0.6, "empty_hosts_pct": 0.0, "vms": 30, "empty_hosts": 0, "hosts": 10})),
        );
        control.zones.insert("down".into(), ZoneStats { allocator: "x".into(), stats: None, error: Some("no".into()) });
        let two = series_point(1.0, 2.0, 3, &control);
        // Density weighted by non-empty hosts: (0.9 * 5 + 0.6 * 10) / 15.
        assert!((two.packing_density.unwrap() - 0.7).abs() < 1e-12);
        assert_eq!((two.empty_hosts_pct, two.allocator_vms, two.hosts), (Some(25.0), Some(40), Some(20)));
        assert_eq!(series_point(0.0, 0.0, 0, &ControlStats::default()).packing_density, None);
    }

    #[test]
    fn thinning_spreads_rows_evenly_and_keeps_both_ends() {
        assert_eq!(thin_indices(5, 15), [0, 1, 2, 3, 4]);
        assert_eq!(thin_indices(100, 5), [0, 25, 50, 74, 99]);
        let many = thin_indices(1000, 15);
        assert_eq!((many.len(), many[0], many[14]), (15, 0, 999));
        assert_eq!(thin_indices(16, 15).len(), 15);
        assert_eq!(thin_indices(10, 1), [9]);
        assert!(thin_indices(10, 0).is_empty());
    }

    #[test]
    fn answers_are_classified_by_status_and_body() {
        let placed = br#"{"zone":"z","status":"placed","placements":[{"vm_id":"v","host_id":"h","rack_id":"r","cluster_id":"c"}],
            "predictions":[{"vm_id":"v","prediction":{"p_long":0.1,"class":"short","source":"cache"}}],
            "latency_us":{"validate_us":1,"cache_us":1,"inference_us":0,"allocator_us":5,"total_us":9}}"#;
        let answer = classify_answer(201, placed);
        assert_eq!(answer.outcome, Outcome::Placed);
        assert_eq!((answer.server_total_us, answer.prediction_sources()), (Some(9), vec!["cache".to_owned()]));
        assert!(answer.is_placed());

        let rejected = br#"{"zone":"z","status":"rejected","rejection":{"code":"no_feasible_host","detail":"full"},
            "predictions":[],"latency_us":{"validate_us":1,"cache_us":1,"inference_us":0,"allocator_us":5,"total_us":7}}"#;
        let answer = classify_answer(200, rejected);
        assert_eq!(answer.outcome, Outcome::Rejected { code: "no_feasible_host".into() });
        assert!(!answer.is_placed());

        let replayed =
            String::from_utf8(placed.to_vec()).unwrap().replace(r#""zone":"z","#, r#""zone":"z","replayed":true,"#);
        let answer = classify_answer(200, replayed.as_bytes());
        assert_eq!(answer.outcome, Outcome::Replayed { placed: true });
        assert!(answer.is_placed());

        let problem = br#"{"type":"urn:problem:allocator-unavailable","title":"Allocator unavailable","status":503,"detail":"zone-1 down"}"#;
        let answer = classify_answer(503, problem);
        assert_eq!(
            answer.outcome,
            Outcome::Failed {
                kind: "HTTP 503".into(),
                detail: "Allocator unavailable: zone-1 down (urn:problem:allocator-unavailable)".into()
            }
        );
        assert!(
            matches!(classify_answer(500, b"oops").outcome, Outcome::Failed { ref detail, .. } if detail == "oops")
        );
        assert!(
            matches!(classify_answer(201, b"{}").outcome, Outcome::Failed { ref kind, .. } if kind.contains("unreadable"))
        );
    }

    #[test]
    fn the_tally_counts_outcomes_releases_and_the_error_rate() {
        let mut tally = Tally::default();
        let answer = |outcome| Answer { outcome, server_total_us: Some(5), predictions: vec![model_prediction(0.7)] };
        tally.record_allocation(&answer(Outcome::Placed), 10);
        tally.record_allocation(&answer(Outcome::Rejected { code: "no_feasible_host".into() }), 10);
        tally.record_allocation(&answer(Outcome::Replayed { placed: false }), 10);
        tally.record_allocation(&Answer::transport_error("connect", "refused"), 10);
        assert_eq!((tally.requests, tally.placed, tally.rejected, tally.replayed, tally.errors), (4, 1, 1, 1, 1));
        assert_eq!(tally.error_rate(), 0.25);
        assert_eq!(tally.predictions_by_source["model"], 3);
        assert_eq!(tally.server_total_us.len(), 3);
        assert_eq!(tally.error_samples, ["POST /allocate: transport: connect: refused"]);
        tally.record_release(Ok(204), false);
        tally.record_release(Ok(404), true);
        tally.record_release(Ok(503), true);
        tally.record_release(Err(("timeout".into(), "slow".into())), false);
        let r = &tally.releases;
        assert_eq!((r.requests, r.released, r.not_found, r.errors, r.at_end), (4, 1, 1, 2, 2));
        assert_eq!(r.errors_by_kind.len(), 2);
    }

    #[test]
    fn the_summary_renders_every_section_and_serializes() {
        let mut tally = Tally::default();
        tally.record_allocation(
            &Answer { outcome: Outcome::Placed, server_total_us: Some(1500), predictions: vec![model_prediction(0.2)] },
            2345,
        );
        let series: Vec<SeriesPoint> = (0..40)
            .map(|i| SeriesPoint { elapsed_s: f64::from(i), packing_density: Some(0.5), ..SeriesPoint::default() })
            .collect();
        let run = RunInfo { control: "http://c".into(), wall_s: 2.0, vm_id_prefix: "r1".into(), ..RunInfo::default() };
        let delta = stats_delta(&stats(0, 0, &[], 0), &stats(3, 1, &[("timeout", 1)], 0));
        let summary = Summary::new(run, tally, Some(delta), series);
        let text = summary.render();
        for needle in
            ["placed         1", "2.35", "1.50", "hit rate 75.0%", "timeout 1", "model 1", "15 of 40 samples", "50.0%"]
        {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert_eq!(text.lines().filter(|l| l.trim_start().starts_with("39.0")).count(), 1, "the last sample is shown");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["requests"]["placed"], 1);
        assert_eq!(json["latency"]["client"]["p50_ms"], 2.345);
        assert_eq!(json["series"].as_array().unwrap().len(), 40);
    }

    #[test]
    fn the_plot_is_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replay.svg");
        let series: Vec<SeriesPoint> = (0..5)
            .map(|i| SeriesPoint {
                trace_s: f64::from(i) * 3600.0,
                packing_density: Some(0.8),
                empty_hosts_pct: Some(f64::from(i) * 10.0),
                ..SeriesPoint::default()
            })
            .collect();
        write_plot(&series, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg") && svg.contains("empty hosts"));
        write_plot(&[], &dir.path().join("empty.svg")).unwrap();
        let err = write_plot(&series, &dir.path().join("missing/dir/x.svg")).unwrap_err();
        assert!(err.to_string().contains("missing/dir/x.svg"), "{err}");
    }

    fn version_quality(version: &str, resolved: u64, auc: Option<f64>) -> VersionQuality {
        VersionQuality {
            version: version.into(),
            resolved_total: resolved + 5,
            pending: 3,
            window: domain::quality::QualityTally::default(),
            figures: QualityFigures {
                resolved,
                realized_long_share: Some(0.25),
                predicted_long_share: Some(0.2),
                mean_p_long: Some(0.3),
                precision: Some(0.6),
                recall: Some(0.55),
                roc_auc: auc,
                average_precision: auc.map(|a| a - 0.1),
                ..QualityFigures::default()
            },
        }
    }

    fn quality_stats(versions: Vec<VersionQuality>, gated: bool, trips: u64) -> ControlStats {
        ControlStats {
            quality: QualityStatus {
                gate_enabled: true,
                gated,
                reason: gated.then(|| "precision 0.300 < 0.5 over 250 VMs".to_owned()),
                trips,
                recoveries: 0,
                stable_version: Some("m-1".into()),
                canary_version: Some("m-2".into()),
                versions,
                last_canary_decision: None,
            },
            ..ControlStats::default()
        }
    }

    #[test]
    fn series_points_carry_each_versions_realized_quality() {
        let stats =
            quality_stats(vec![version_quality("m-2", 40, None), version_quality("m-1", 900, Some(0.8))], false, 0);
        let point = series_point(3.0, 7_200.0, 1, &stats);
        assert_eq!(point.quality.len(), 2);
        assert_eq!(
            point.quality[1],
            QualitySample {
                version: "m-1".into(),
                resolved: 900,
                roc_auc: Some(0.8),
                average_precision: Some(0.8 - 0.1),
                precision: Some(0.6),
                recall: Some(0.55)
            }
        );
        assert_eq!(point.quality[0].roc_auc, None, "a figure the window cannot tell stays absent");
        assert!(series_point(0.0, 0.0, 0, &ControlStats::default()).quality.is_empty());
        // Without quality the sample's JSON is as before.
        let json = serde_json::to_value(series_point(0.0, 0.0, 0, &ControlStats::default())).unwrap();
        assert!(json.get("quality").is_none());
    }

    #[test]
    fn the_quality_summary_names_roles_and_the_gate_and_counts_trips_of_the_run() {
        let start = quality_stats(Vec::new(), false, 1);
        let end =
            quality_stats(vec![version_quality("m-1", 900, Some(0.8)), version_quality("old", 10, None)], true, 3);
        assert_eq!(stats_delta(&start, &end).quality_gate_trips, 2);
        let quality = QualitySummary::of(&end.quality);
        let roles: Vec<(&str, &str)> = quality.versions.iter().map(|v| (v.version.as_str(), v.role.as_str())).collect();
        assert_eq!(roles, [("m-1", "stable"), ("old", "")]);
        assert_eq!((quality.versions[0].resolved_total, quality.versions[0].pending), (905, 3));
        assert!(quality.gate_state().starts_with("CLOSED: precision 0.300"));
        let off = QualitySummary::of(&QualityStatus::default());
        assert_eq!(off.gate_state(), "off (measured only)");
        assert_eq!(QualitySummary::of(&quality_stats(Vec::new(), false, 0).quality).gate_state(), "open");
    }

    #[test]
    fn the_summary_renders_the_quality_table_and_its_series() {
        let series: Vec<SeriesPoint> = (0..30)
            .map(|i| SeriesPoint {
                elapsed_s: f64::from(i),
                trace_s: f64::from(i) * 600.0,
                quality: if i < 5 {
                    Vec::new()
                } else {
                    vec![QualitySample {
                        version: "m-1".into(),
                        resolved: i as u64 * 10,
                        roc_auc: Some(0.8),
                        ..QualitySample::default()
                    }]
                },
                ..SeriesPoint::default()
            })
            .collect();
        let end = quality_stats(vec![version_quality("m-1", 900, Some(0.812))], false, 0);
        let delta = stats_delta(&end, &end);
        let mut summary =
            Summary::new(RunInfo::default(), Tally::default(), Some(delta), series).with_quality(Some(&end));
        summary.plots = vec!["r.svg".into(), "r-quality.svg".into()];
        let text = summary.render();
        for needle in [
            "realized quality (each zone's window",
            "gate    open; 0 trips during the run",
            "ROC AUC",
            "long realized",
            "0.812",
            "0.712",
            "25.0%",
            "20.0%",
            "realized quality over time (15 of 25 samples)",
            "plots     r.svg, r-quality.svg",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        let row = text.lines().find(|l| l.trim_start().starts_with("m-1")).unwrap();
        assert!(
            row.contains("stable") && row.contains("900") && row.contains("0.600") && row.contains("0.550"),
            "{row}"
        );
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["quality"]["versions"][0]["figures"]["roc_auc"], 0.812);
        assert_eq!(json["quality"]["stable_version"], "m-1");
        // No end snapshot: said so, and no quality table.
        let unknown = Summary::new(RunInfo::default(), Tally::default(), None, Vec::new()).with_quality(None);
        assert!(unknown.render().contains("realized quality: unknown"));
        // No version yet.
        let empty = Summary::new(RunInfo::default(), Tally::default(), None, Vec::new())
            .with_quality(Some(&quality_stats(Vec::new(), false, 0)));
        assert!(empty.render().contains("no model version has resolved outcomes yet"));
    }

    #[test]
    fn prediction_rows_are_csv_with_every_field() {
        let mut rec = record("vm,7", 100.5, Some(7300.0));
        rec.tenant_id = "t\"1".into();
        let vm = PlannedVm {
            request: rec.to_request("r1").unwrap(),
            start_s: 100.5,
            end_s: Some(7300.0),
            trace_vm_id: "vm,7".into(),
        };
        let mut prediction = model_prediction(0.123456789);
        prediction.expected_lifetime_s = Some(3600.0);
        let placed = Answer { outcome: Outcome::Placed, server_total_us: Some(1), predictions: vec![prediction] };
        let line = PredictionRow::new(&vm, &placed).csv_line();
        assert_eq!(line, r#""vm,7","r1-vm,7","t""1",100.5,7300,placed,0.123456789,short,m-1,model,3600"#);
        assert_eq!(line.matches(',').count() - 2, PREDICTION_CSV_HEADER.matches(',').count(), "two commas quoted");
        let mut open_ended = vm.clone();
        open_ended.end_s = None;
        let failed = PredictionRow::new(&open_ended, &Answer::transport_error("timeout", "slow")).csv_line();
        assert!(failed.ends_with(",100.5,,failed,,,,,"), "{failed}");
    }

    #[test]
    fn the_quality_plot_sits_beside_the_plot_and_draws_gaps_for_missing_figures() {
        assert_eq!(quality_plot_path(Path::new("out/replay.svg")), Path::new("out/replay-quality.svg"));
        assert_eq!(quality_plot_path(Path::new("plot")), Path::new("plot-quality.svg"));
        let sample = |version: &str, auc: Option<f64>| QualitySample {
            version: version.into(),
            roc_auc: auc,
            ..QualitySample::default()
        };
        let series: Vec<SeriesPoint> = [
            vec![],
            vec![sample("a", Some(0.7))],
            vec![sample("a", Some(0.8)), sample("b", None)],
            vec![sample("a", None), sample("b", Some(0.6))],
            vec![sample("a", Some(0.9)), sample("b", Some(0.65))],
        ]
        .into_iter()
        .enumerate()
        .map(|(i, quality)| SeriesPoint { trace_s: i as f64 * 3_600.0, quality, ..SeriesPoint::default() })
        .collect();
        assert!(has_quality(&series) && !has_quality(&series[..1]));
        let lines = quality_lines(&series, |q| q.roc_auc);
        assert_eq!(
            lines,
            [
                ("a".to_owned(), vec![vec![(1.0, 0.7), (2.0, 0.8)], vec![(4.0, 0.9)]]),
                ("b".to_owned(), vec![vec![(3.0, 0.6), (4.0, 0.65)]]),
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.svg");
        write_quality_plot(&series, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for needle in ["<svg", "ROC AUC", "average precision", "recall (long-lived)"] {
            assert!(svg.contains(needle), "missing {needle:?}");
        }
        for version in ["a", "b"] {
            assert!(svg.lines().any(|line| line.trim() == version), "no legend entry for {version}");
        }
        write_quality_plot(&[], &dir.path().join("empty.svg")).unwrap();
        assert!(write_quality_plot(&series, &dir.path().join("no/dir/q.svg")).is_err());
    }
}
