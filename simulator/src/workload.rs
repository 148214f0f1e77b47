//! A trace turned into what the simulator replays, and the inventory it replays it on.
//!
//! [`Workload::load`] reads any trace source (the project's CSV, several CSV files as one timeline,
//! the Azure packing-trace sqlite, the synthetic generator), keeps the VMs of a time window and
//! sorts them by start (`traces::window`, the replay client's very windowing). VMs still running at the trace's end are censored: the oracle gives them
//! all one exit ([`Workload::censored_exit_s`]). Each VM keeps
//! its allocation request (built once by [`VmRecord::to_request`], the replay client's very
//! conversion), its true start and end, and the time the simulator places it: VMs already running
//! at the window start (a negative start in the trace, or any start before the window) are the
//! **warm-up** and are all placed at the window start, in start order, before anything else.
//!
//! [`Inventory`] sizes the zone: a fixed number of identical hosts, or just enough hosts for the
//! window's peak concurrent demand (a sweep over arrivals and exits, per dimension) plus headroom.

use domain::{InventorySpec, Resources, VmRequest};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::PathBuf;
use traces::azure_sqlite::MachineType;
use traces::synthetic::SyntheticConfig;
use traces::window::{self, InvalidWindow, Warmup, WindowError, WindowField, WindowSpec};
use traces::{TraceError, TraceSource, VmRecord};

/// Zone name of the simulated inventory: hosts are `sim-h<i>`, racks `sim-r<i>` (the allocator
/// service's `[generate]` naming, so a service configured with `zone = "sim"` has the same ids).
pub const SIM_ZONE: &str = "sim";

/// How far after the trace's end the oracle puts the one common exit of every VM still running
/// there: the cap of paper 002 G.1's lifetimes (14 days). Such a VM never leaves during the
/// simulation and its true end is unknown, so all of them get the same exit time: the oracle must
/// not invent exit-time differences between censored VMs (NILAS and LAVA would read them).
pub const CENSORED_LIFETIME_S: f64 = 14.0 * 86_400.0;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("reading the trace: {0}")]
    Trace(#[from] TraceError),
    /// No VM, or none in the window (`traces::window`).
    #[error("{}{}", .0, window_hint(.0))]
    Window(WindowError),
    #[error("VM id `{0}` appears twice in the trace; the simulator needs unique VM ids")]
    DuplicateVmId(String),
    #[error("{field}: {message}")]
    Invalid { field: &'static str, message: String },
    #[error("this workload's records were given by the caller (trace `provided`); there is no file to load them from")]
    Provided,
}

fn invalid(field: &'static str, message: impl Into<String>) -> WorkloadError {
    WorkloadError::Invalid { field, message: message.into() }
}

/// What to change when the window holds no VM.
fn window_hint(error: &WindowError) -> &'static str {
    match error {
        WindowError::EmptyWindow { .. } => ": change the window's start or duration",
        _ => "",
    }
}

impl From<WindowError> for WorkloadError {
    fn from(error: WindowError) -> Self {
        match error {
            WindowError::Invalid(invalid) => invalid_window(invalid),
            WindowError::Trace(error) => WorkloadError::Trace(error),
            other => WorkloadError::Window(other),
        }
    }
}

/// A window setting out of range, named by its key in the run configuration.
fn invalid_window(error: InvalidWindow) -> WorkloadError {
    let field = match error.field {
        WindowField::FromS => "workload.from_s",
        WindowField::DurationS => "workload.duration_s",
        WindowField::MaxVms => "workload.max_vms",
    };
    WorkloadError::Invalid { field, message: error.message }
}

/// Where the VMs come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TraceSpec {
    /// A trace file: `.csv`/`.csv.gz`, or `.sqlite`/`.db` with the machine type its fractional
    /// sizes refer to.
    File {
        path: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        machine: Option<MachineSpec>,
    },
    /// Several trace files replayed as one timeline (for example a training period and the test
    /// period after it, so that the earlier one warms the inventory up with its long-lived VMs).
    /// VM ids must be unique across the files; a VM still running at the end of its own file
    /// stays censored.
    Timeline { paths: Vec<PathBuf> },
    /// The seeded synthetic generator (`traces::synthetic`).
    Synthetic(SyntheticSpec),
    /// Records handed to [`Workload::from_records`] by the caller (tests, other tools).
    Provided { name: String },
}

/// The machine type of an Azure packing-trace sqlite file (`vmType.machineId`) and its size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSpec {
    pub machine_id: i64,
    pub cores: f64,
    pub memory_gib: f64,
}

/// The synthetic generator's settings (`traces::synthetic::SyntheticConfig`, with serde).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticSpec {
    pub seed: u64,
    pub days: f64,
    pub warmup_days: f64,
    pub requests_per_hour: f64,
    pub tenants: usize,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        let c = SyntheticConfig::default();
        SyntheticSpec {
            seed: c.seed,
            days: c.span_days,
            warmup_days: c.warmup_days,
            requests_per_hour: c.requests_per_hour,
            tenants: c.tenants,
        }
    }
}

impl SyntheticSpec {
    pub fn to_config(&self) -> SyntheticConfig {
        SyntheticConfig {
            seed: self.seed,
            span_days: self.days,
            warmup_days: self.warmup_days,
            requests_per_hour: self.requests_per_hour,
            tenants: self.tenants,
            censor: true,
        }
    }
}

/// The trace and the window of it to replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadConfig {
    pub trace: TraceSpec,
    /// Trace time the simulation starts at; default: the first start, or 0 when VMs run before 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_s: Option<f64>,
    /// Trace seconds to simulate; default: up to the last start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// At most this many VMs starting in the window (the earliest); the warm-up VMs come on top.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_vms: Option<usize>,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            trace: TraceSpec::Synthetic(SyntheticSpec::default()),
            from_s: None,
            duration_s: None,
            max_vms: None,
        }
    }
}

impl WorkloadConfig {
    /// The window of the trace to replay, as `traces::window` cuts it.
    pub fn window(&self) -> WindowSpec {
        WindowSpec { from_s: self.from_s, duration_s: self.duration_s, max_vms: self.max_vms }
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        self.window().validate().map_err(invalid_window)?;
        if let TraceSpec::Timeline { paths } = &self.trace {
            if paths.is_empty() {
                return Err(invalid("workload.trace.paths", "a timeline needs at least one trace file"));
            }
        }
        if let TraceSpec::File { machine: Some(m), .. } = &self.trace {
            if !(m.cores > 0.0 && m.cores.is_finite() && m.memory_gib > 0.0 && m.memory_gib.is_finite()) {
                return Err(invalid("workload.trace.machine", "cores and memory_gib must be positive numbers"));
            }
        }
        Ok(())
    }
}

/// One VM to replay.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadVm {
    /// The allocation request, without a prediction.
    pub request: VmRequest,
    /// True start in trace seconds (before the window for a warm-up VM).
    pub start_s: f64,
    /// When the simulator places it: the start, or the window start for a warm-up VM.
    pub arrival_s: f64,
    /// True end; `None` when it still runs at the end of the trace (censored).
    pub end_s: Option<f64>,
}

/// The VMs of a window, sorted by arrival (warm-up first, in start order; ties in trace order).
#[derive(Clone, Debug)]
pub struct Workload {
    pub vms: Vec<WorkloadVm>,
    /// Window start: the warm-up is placed at this instant.
    pub from_s: f64,
    /// Window end: the simulation stops here (the window's end, or the last arrival when the window
    /// has no duration or `max_vms` cut it short).
    pub to_s: f64,
    /// VMs running at the window start (placed first).
    pub warmup_vms: usize,
    /// Latest start or end in the whole trace: where censored lifetimes are observed up to.
    pub trace_end_s: f64,
    pub records_read: u64,
    /// Records the source skipped on purpose (sqlite VMs the machine cannot host).
    pub records_skipped: u64,
}

/// Peak concurrent demand of a workload, per dimension (not necessarily at the same instant).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakDemand {
    pub cores: f64,
    pub memory_gib: f64,
    pub cores_at_s: f64,
    pub memory_at_s: f64,
}

impl Workload {
    /// Reads the configured trace and keeps the window.
    pub fn load(config: &WorkloadConfig) -> Result<Workload, WorkloadError> {
        config.validate()?;
        let sources = match &config.trace {
            TraceSpec::File { path, machine } => vec![TraceSource::from_path(
                path,
                machine.as_ref().map(|m| MachineType {
                    machine_id: m.machine_id,
                    cores: m.cores,
                    memory_gib: m.memory_gib,
                    ssd_gib: 0.0,
                }),
            )?],
            TraceSpec::Timeline { paths } => {
                paths.iter().map(|path| TraceSource::from_path(path, None)).collect::<Result<_, _>>()?
            }
            TraceSpec::Synthetic(spec) => vec![TraceSource::Synthetic(spec.to_config())],
            TraceSpec::Provided { .. } => return Err(WorkloadError::Provided),
        };
        let mut records: Vec<VmRecord> = Vec::new();
        let mut skipped = 0;
        for source in sources {
            let mut reader = source.open()?;
            for record in reader.by_ref() {
                records.push(record?);
            }
            skipped += reader.skipped();
        }
        let mut workload = Self::from_records(records, config)?;
        workload.records_skipped = skipped;
        Ok(workload)
    }

    /// Keeps the window of `records` (any order) that `config` describes (`traces::window::select`
    /// with the warm-up; the window starts by default at the first start, or at 0 when VMs run
    /// before 0); `config.trace` is not read.
    pub fn from_records(records: Vec<VmRecord>, config: &WorkloadConfig) -> Result<Workload, WorkloadError> {
        config.validate()?;
        let first_start_s = window::first_start(records.iter().map(Ok))?;
        let mut seen = HashSet::with_capacity(records.len());
        for r in &records {
            if !seen.insert(r.vm_id.as_str()) {
                return Err(WorkloadError::DuplicateVmId(r.vm_id.clone()));
            }
        }
        drop(seen);
        let window =
            window::select(records.into_iter().map(Ok), &config.window(), first_start_s.max(0.0), Warmup::Keep)?;
        let from_s = window.from_s;
        let warmup_vms = window.warmup.len();
        let vms = window
            .warmup
            .into_iter()
            .chain(window.vms)
            .map(|r| {
                Ok(WorkloadVm {
                    request: r.to_request("")?,
                    start_s: r.start_s,
                    arrival_s: r.start_s.max(from_s),
                    end_s: r.end_s,
                })
            })
            .collect::<Result<Vec<_>, TraceError>>()?;
        Ok(Workload {
            vms,
            from_s,
            to_s: window.to_s,
            warmup_vms,
            trace_end_s: window.trace_end_s,
            records_read: window.records_read,
            records_skipped: 0,
        })
    }

    /// A VM's lifetime from the moment the simulator places it: its end minus its arrival, or for a
    /// censored VM the time to [`Workload::censored_exit_s`], the exit all censored VMs share.
    /// This is what the oracle predicts.
    pub fn lifetime_s(&self, vm: &WorkloadVm) -> f64 {
        match vm.end_s {
            Some(end) => (end - vm.arrival_s).max(0.0),
            None => (self.censored_exit_s() - vm.arrival_s).max(0.0),
        }
    }

    /// The one exit time the oracle gives every VM still running at the end of the trace:
    /// [`CENSORED_LIFETIME_S`] after it.
    pub fn censored_exit_s(&self) -> f64 {
        self.trace_end_s + CENSORED_LIFETIME_S
    }

    /// VMs that leave before the window ends: how many exit events a run has at most.
    pub fn exits_in_window(&self) -> usize {
        self.vms.iter().filter(|vm| vm.end_s.is_some_and(|end| end <= self.to_s)).count()
    }

    /// The peak concurrent demand in the window, per dimension: a sweep over arrivals and exits
    /// (exits first at equal times, as the simulator orders them).
    pub fn peak_demand(&self) -> PeakDemand {
        // (time, is arrival, cores, memory) in base units.
        let mut events: Vec<(f64, bool, u64, u64)> = Vec::with_capacity(2 * self.vms.len());
        for vm in &self.vms {
            let [cores, memory, _] = vm.request.facts.demand.base_units();
            events.push((vm.arrival_s, true, cores, memory));
            if let Some(end) = vm.end_s.filter(|&end| end <= self.to_s) {
                events.push((end.max(vm.arrival_s), false, cores, memory));
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut cores, mut memory) = (0u64, 0u64);
        let mut peak = PeakDemand { cores: 0.0, memory_gib: 0.0, cores_at_s: self.from_s, memory_at_s: self.from_s };
        let (mut peak_cores, mut peak_memory) = (0u64, 0u64);
        for (time, arrival, c, m) in events {
            if arrival {
                cores += c;
                memory += m;
            } else {
                cores = cores.saturating_sub(c);
                memory = memory.saturating_sub(m);
            }
            if cores > peak_cores {
                peak_cores = cores;
                peak.cores_at_s = time;
            }
            if memory > peak_memory {
                peak_memory = memory;
                peak.memory_at_s = time;
            }
        }
        let whole = Resources::from_base_units([peak_cores, peak_memory, 0]);
        peak.cores = whole.cores();
        peak.memory_gib = whole.memory_gib();
        peak
    }
}

fn default_hosts_per_rack() -> usize {
    40
}

/// The simulated zone: identical hosts, `hosts_per_rack` to a rack.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "sizing", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Inventory {
    /// Exactly `hosts` hosts.
    Fixed {
        hosts: usize,
        cores: f64,
        memory_gib: f64,
        #[serde(default = "default_hosts_per_rack")]
        hosts_per_rack: usize,
    },
    /// Enough hosts for the window's peak demand: max over CPU and memory of peak / host capacity,
    /// times 1 + `headroom`, rounded up.
    Auto {
        cores: f64,
        memory_gib: f64,
        headroom: f64,
        #[serde(default = "default_hosts_per_rack")]
        hosts_per_rack: usize,
    },
}

impl Default for Inventory {
    fn default() -> Self {
        Inventory::Auto { cores: 48.0, memory_gib: 384.0, headroom: 0.25, hosts_per_rack: default_hosts_per_rack() }
    }
}

/// The inventory a run uses.
#[derive(Clone, Debug, PartialEq)]
pub struct SizedInventory {
    pub spec: InventorySpec,
    pub hosts: usize,
    pub host_capacity: Resources,
    pub peak: PeakDemand,
}

impl Inventory {
    fn parts(&self) -> (f64, f64, usize) {
        match *self {
            Inventory::Fixed { cores, memory_gib, hosts_per_rack, .. }
            | Inventory::Auto { cores, memory_gib, hosts_per_rack, .. } => (cores, memory_gib, hosts_per_rack),
        }
    }

    pub fn host_capacity(&self) -> Result<Resources, WorkloadError> {
        let (cores, memory_gib, _) = self.parts();
        if !(cores > 0.0 && memory_gib > 0.0) {
            return Err(invalid(
                "inventory",
                format!("host cores and memory_gib must be > 0, got {cores} and {memory_gib}"),
            ));
        }
        Resources::from_whole(cores, memory_gib, 0.0)
            .map_err(|(kind, e)| invalid("inventory", format!("host {}: {e}", kind.field_name())))
    }

    /// The hosts of this inventory for `workload`.
    pub fn size(&self, workload: &Workload) -> Result<SizedInventory, WorkloadError> {
        let capacity = self.host_capacity()?;
        let (_, _, hosts_per_rack) = self.parts();
        if hosts_per_rack == 0 {
            return Err(invalid("inventory.hosts_per_rack", "must be at least 1"));
        }
        let peak = workload.peak_demand();
        let hosts = match *self {
            Inventory::Fixed { hosts, .. } => hosts,
            Inventory::Auto { headroom, .. } => {
                if !(headroom.is_finite() && headroom >= 0.0) {
                    return Err(invalid("inventory.headroom", format!("must be a number >= 0, got {headroom}")));
                }
                let need = (peak.cores / capacity.cores()).max(peak.memory_gib / capacity.memory_gib());
                ((need * (1.0 + headroom)).ceil() as usize).max(1)
            }
        };
        if hosts == 0 {
            return Err(invalid("inventory.hosts", "must be at least 1"));
        }
        Ok(SizedInventory {
            spec: InventorySpec::homogeneous(SIM_ZONE, hosts, hosts_per_rack, capacity),
            hosts,
            host_capacity: capacity,
            peak,
        })
    }
}
