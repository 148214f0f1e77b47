//! A seeded synthetic trace generator calibrated to the papers' published statistics.
//!
//! Targets ([`calibration`]): median lifetime about 16 minutes and mean over a day (paper 003 s2.2);
//! most VMs short-lived but most core-hours in long-lived VMs; the core mix of Protean's Table 3
//! (zone 1); 94% of tenant requests for a single VM with rare huge gangs; diurnal and weekly arrival
//! cycles with bursts.
//!
//! Lifetimes are predictable but not perfectly: each tenant has its own propensity to run long-lived
//! VMs and its own typical short and long lifetimes, bigger VMs lean long, low-priority VMs lean short,
//! and "workday" tenants start VMs in the morning that live until the evening. On top of that every
//! VM draws its class and lifetime at random, so the best possible classifier stays well below an AUC
//! of 1 (about 0.9 on the 2 h task).
//!
//! Trace time 0 is a Monday, 00:00. Extra columns: `os`, `batch_size` (VMs in the VM's request) and
//! `request_id` (VMs of one gang share it).

use crate::record::{ExtraColumns, VmRecord};
use domain::Priority;
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Beta, Distribution, LogNormal, Normal, Pareto, Poisson};
use std::f64::consts::{LN_10, TAU};
use std::sync::Arc;

const MINUTE: f64 = 60.0;
const HOUR: f64 = 3_600.0;
const DAY: f64 = 86_400.0;

/// The published statistics the generator is calibrated to.
pub mod calibration {
    /// Median VM lifetime (paper 003 s2.2: "about 16 minutes").
    pub const MEDIAN_LIFETIME_S: f64 = 16.0 * 60.0;
    /// The mean lifetime exceeds this (paper 003 s2.2: "more than a day").
    pub const MIN_MEAN_LIFETIME_S: f64 = 86_400.0;
    /// Share of tenant requests that ask for a single VM.
    pub const SINGLE_VM_REQUEST_SHARE: f64 = 0.94;
    /// Share of VMs by core count (Protean Table 3, zone 1: 1, 2, 4, 8, 10-19 and 20+ cores).
    pub const CORE_MIX: [(u32, f64); 6] = [(1, 0.171), (2, 0.374), (4, 0.320), (8, 0.089), (16, 0.043), (32, 0.003)];
    /// Peak-hour over trough-hour arrival rate of the diurnal cycle.
    pub const DIURNAL_PEAK_TO_TROUGH: f64 = 3.0;
}

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticConfig {
    pub seed: u64,
    /// Length of the trace after time 0.
    pub span_days: f64,
    /// VMs arriving this long before time 0 and still running at 0 appear with negative starts.
    pub warmup_days: f64,
    /// Mean tenant requests per hour, before the diurnal and weekly cycles and bursts.
    pub requests_per_hour: f64,
    pub tenants: usize,
    /// Whether VMs still running at the end of the span have an empty end (as in a real trace) or
    /// keep their true end time (for checking the calibration).
    pub censor: bool,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            seed: 42,
            span_days: 7.0,
            warmup_days: 2.0,
            requests_per_hour: 400.0,
            tenants: 1500,
            censor: true,
        }
    }
}

#[derive(Clone, Copy)]
enum Family {
    /// 2 GiB per core.
    Compute,
    /// 4 GiB per core.
    General,
    /// 8 GiB per core.
    Memory,
}

impl Family {
    fn letter(self) -> char {
        match self {
            Family::Compute => 'F',
            Family::General => 'D',
            Family::Memory => 'E',
        }
    }

    fn gib_per_core(self) -> f64 {
        match self {
            Family::Compute => 2.0,
            Family::General => 4.0,
            Family::Memory => 8.0,
        }
    }
}

struct Tenant {
    id: String,
    /// Cumulative popularity, for picking the tenant of a request.
    cumulative_weight: f64,
    p_long: f64,
    /// Typical log10 lifetimes of the tenant's short and long VMs.
    short_mu: f64,
    long_mu: f64,
    home_cores: u32,
    family: Family,
    windows: bool,
    low_priority: bool,
    workday: bool,
    gang_propensity: f64,
}

/// One tenant request before expansion into VMs.
struct Request {
    tenant: usize,
    time_s: f64,
    size: usize,
}

/// A [`SyntheticConfig`] setting out of range: `field` is the setting's name as the CLI's flag
/// spells it without its dashes (`days`, `warmup_days`, `requests_per_hour`, `tenants`), `message`
/// reads after it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field} {message}")]
pub struct InvalidSynthetic {
    pub field: &'static str,
    pub message: String,
}

impl SyntheticConfig {
    /// Checks every setting, and that the whole trace (generated in memory) stays within sizes the
    /// generator is meant for: at most 366 days in all and 100,000 requests an hour.
    pub fn validate(&self) -> Result<(), InvalidSynthetic> {
        let invalid = |field, message: String| Err(InvalidSynthetic { field, message });
        for (field, value) in
            [("days", self.span_days), ("warmup_days", self.warmup_days), ("requests_per_hour", self.requests_per_hour)]
        {
            if !value.is_finite() || value < 0.0 {
                return invalid(field, format!("must be a non-negative number, got {value}"));
            }
        }
        if self.tenants == 0 {
            return invalid("tenants", "must be at least 1".to_owned());
        }
        if self.span_days + self.warmup_days > 366.0 {
            return invalid(
                "days",
                format!("plus warmup_days must be at most 366, got {}", self.span_days + self.warmup_days),
            );
        }
        if self.requests_per_hour > 100_000.0 {
            return invalid("requests_per_hour", format!("must be at most 100000, got {}", self.requests_per_hour));
        }
        Ok(())
    }
}

/// Generates the whole trace, sorted by start time.
pub fn generate(config: &SyntheticConfig) -> Vec<VmRecord> {
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let tenants = make_tenants(config, &mut rng);
    let requests = make_requests(config, &tenants, &mut rng);
    expand(config, &tenants, requests, &mut rng)
}

fn draw_cores(rng: &mut ChaCha8Rng) -> u32 {
    let mut u: f64 = rng.random();
    for (cores, share) in calibration::CORE_MIX {
        if u < share {
            return cores;
        }
        u -= share;
    }
    calibration::CORE_MIX[0].0
}

fn make_tenants(config: &SyntheticConfig, rng: &mut ChaCha8Rng) -> Vec<Tenant> {
    let popularity = LogNormal::new(0.0, 1.0).expect("valid log-normal");
    // J-shaped: most tenants run mostly short VMs, a minority mostly long ones.
    let p_long = Beta::new(0.1, 0.36).expect("valid beta");
    let short_mu = Normal::new(2.72, 0.3).expect("valid normal");
    let long_mu = Normal::new(5.2, 0.45).expect("valid normal");
    let mut cumulative = 0.0;
    (0..config.tenants.max(1))
        .map(|i| {
            cumulative += popularity.sample(rng);
            let family = match rng.random::<f64>() {
                u if u < 0.3 => Family::Compute,
                u if u < 0.8 => Family::General,
                _ => Family::Memory,
            };
            Tenant {
                id: format!("t{i}"),
                cumulative_weight: cumulative,
                p_long: p_long.sample(rng),
                short_mu: short_mu.sample(rng),
                long_mu: long_mu.sample(rng),
                home_cores: draw_cores(rng),
                family,
                windows: rng.random_bool(0.3),
                low_priority: rng.random_bool(0.1),
                workday: rng.random_bool(0.08),
                gang_propensity: (0.055 * -rng.random::<f64>().ln()).min(0.5),
            }
        })
        .collect()
}

fn pick_tenant(tenants: &[Tenant], rng: &mut ChaCha8Rng) -> usize {
    let total = tenants.last().map_or(0.0, |t| t.cumulative_weight);
    let target = rng.random::<f64>() * total;
    tenants.partition_point(|t| t.cumulative_weight < target).min(tenants.len() - 1)
}

/// Relative arrival rate at trace time `t`: a diurnal cycle peaking mid-afternoon and quieter weekends.
fn arrival_rate_factor(t: f64) -> f64 {
    let hour = t.rem_euclid(DAY) / HOUR;
    let amplitude = (calibration::DIURNAL_PEAK_TO_TROUGH - 1.0) / (calibration::DIURNAL_PEAK_TO_TROUGH + 1.0);
    let diurnal = 1.0 + amplitude * (TAU * (hour - 8.0) / 24.0).sin();
    let weekday = (t.div_euclid(DAY) as i64).rem_euclid(7);
    let weekly = if weekday >= 5 { 0.7 } else { 1.0 };
    diurnal * weekly
}

fn make_requests(config: &SyntheticConfig, tenants: &[Tenant], rng: &mut ChaCha8Rng) -> Vec<Request> {
    let start = -config.warmup_days.max(0.0) * DAY;
    let end = config.span_days.max(0.0) * DAY;
    let gang_extra: Pareto<f64> = Pareto::new(1.0, 1.1).expect("valid pareto");
    let burst_len: Normal<f64> = Normal::new(60.0, 25.0).expect("valid normal");
    let mut requests = Vec::new();
    let mut minute = start;
    while minute < end {
        let mean = config.requests_per_hour / 60.0 * arrival_rate_factor(minute);
        let count = if mean > 0.0 { Poisson::new(mean).expect("positive mean").sample(rng) as usize } else { 0 };
        for _ in 0..count {
            let tenant = pick_tenant(tenants, rng);
            let size = if rng.random_bool(tenants[tenant].gang_propensity) {
                // Rare huge gangs: 2 VMs most often, a heavy tail up to 100.
                (1 + gang_extra.sample(rng).floor() as usize).min(100)
            } else {
                1
            };
            requests.push(Request { tenant, time_s: minute + rng.random::<f64>() * MINUTE, size });
        }
        // About three bursts a day: one tenant fires a few dozen single-VM requests within minutes.
        if rng.random_bool(3.0 / (24.0 * 60.0)) {
            let tenant = pick_tenant(tenants, rng);
            let n = burst_len.sample(rng).max(10.0) as usize;
            let window = rng.random_range(2.0..10.0) * MINUTE;
            for _ in 0..n {
                let time_s = minute + rng.random::<f64>() * window;
                if time_s < end {
                    requests.push(Request { tenant, time_s, size: 1 });
                }
            }
        }
        minute += MINUTE;
    }
    requests.sort_by(|a, b| a.time_s.total_cmp(&b.time_s));
    requests
}

/// Lifetime in seconds of a VM started at `t` with `cores` by `tenant`; `shared` is the gang's common
/// draw so that VMs of one request live alike.
fn draw_lifetime(tenant: &Tenant, t: f64, cores: u32, shared: (f64, f64), rng: &mut ChaCha8Rng) -> f64 {
    let hour = t.rem_euclid(DAY) / HOUR;
    let weekday = (t.div_euclid(DAY) as i64).rem_euclid(7) < 5;
    if tenant.workday && weekday && (7.0..11.0).contains(&hour) && shared.0 < 0.8 {
        // Lives until the end of the workday, give or take an hour.
        let until_evening = (18.0 - hour) * HOUR + Normal::new(0.0, HOUR).expect("valid normal").sample(rng);
        return until_evening.max(10.0 * MINUTE);
    }
    let mut p = tenant.p_long + 0.02 * f64::from(cores).log2();
    if tenant.low_priority {
        p *= 0.5;
    }
    let long = shared.0 < p.clamp(0.0, 0.97);
    let (mu, sigma) = if long { (tenant.long_mu, 0.45) } else { (tenant.short_mu, 0.5) };
    let log10 = mu + sigma * shared.1 + Normal::new(0.0, 0.1).expect("valid normal").sample(rng);
    (log10 * LN_10).exp().clamp(30.0, 90.0 * DAY)
}

fn expand(config: &SyntheticConfig, tenants: &[Tenant], requests: Vec<Request>, rng: &mut ChaCha8Rng) -> Vec<VmRecord> {
    let names: Arc<[String]> = ["os", "batch_size", "request_id"].map(String::from).into();
    let standard = Normal::new(0.0, 1.0).expect("valid normal");
    let span_end = config.span_days.max(0.0) * DAY;
    let mut records = Vec::new();
    let mut vm_seq = 0u64;
    for (request_seq, request) in requests.into_iter().enumerate() {
        let tenant = &tenants[request.tenant];
        let cores = if rng.random_bool(0.5) { tenant.home_cores } else { draw_cores(rng) };
        let shared = (rng.random::<f64>(), standard.sample(rng));
        let request_id = format!("r{request_seq}");
        for _ in 0..request.size {
            let lifetime = draw_lifetime(tenant, request.time_s, cores, shared, rng);
            let end = request.time_s + lifetime;
            vm_seq += 1;
            if end <= 0.0 {
                continue; // gone before the trace starts
            }
            records.push(VmRecord {
                vm_id: format!("s{vm_seq}"),
                tenant_id: tenant.id.clone(),
                vm_type: format!("{}{cores}", tenant.family.letter()),
                cores: f64::from(cores),
                memory_gib: f64::from(cores) * tenant.family.gib_per_core(),
                priority: if tenant.low_priority { Priority::Low } else { Priority::Regular },
                start_s: (request.time_s * 1000.0).round() / 1000.0,
                end_s: if config.censor && end > span_end { None } else { Some((end * 1000.0).round() / 1000.0) },
                extra: ExtraColumns::new(
                    Arc::clone(&names),
                    vec![
                        if tenant.windows { "windows" } else { "linux" }.to_owned(),
                        request.size.to_string(),
                        request_id.clone(),
                    ],
                ),
            });
        }
    }
    records
}
