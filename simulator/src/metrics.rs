//! The simulator's bin-packing metrics (SPEC section 7): what one instant of the inventory looks
//! like, the offline lower bound on hosts, inflation stranding, and their time averages.
//!
//! Definitions (the same as the allocator's `GET /v1/stats`, computed from
//! [`placement::InventoryState::totals`]):
//!
//! - **allocated** resources are the sum of the placed VMs' demands, plus the reservations of VMs
//!   migrating in (a migrating VM holds room on its source and its target until the move ends,
//!   exactly as the inventory books it).
//! - a host is **empty** when it has no VM and no incoming migration
//!   ([`placement::HostRecord::is_empty`]), whatever its state: an empty unavailable host still
//!   counts as empty, as in the allocator's stats.
//! - **packing density** (paper 003 s4.2, 002 s D) = allocated cores / cores of the non-empty hosts,
//!   a fraction in [0, 1]; 0 when every host is empty.
//! - **empty hosts %** = 100 * empty hosts / hosts (paper 000's main metric); 0 with no host.
//! - **empty-to-free** (paper 002 s D) = free cores on empty hosts / all free cores, a fraction in
//!   [0, 1]; 0 when nothing is free.
//! - the **offline bound** ([`offline_bound`]) is the fewest hosts that could hold the allocated
//!   resources if VMs could be split freely: the maximum over dimensions of
//!   ceil(allocated / host capacity). Its density and empty % are what a perfect packer would
//!   reach at that instant. For a mixed inventory, [`instant`] uses the mean host, i.e.
//!   ceil(allocated * hosts / total capacity) per dimension, which is exact for identical hosts.
//!   Dimensions in which hosts have no capacity (usually SSD) are ignored.
//! - **stranding** ([`inflation_stranding`], paper 000 s3 "resource stranding"): a copy of the
//!   free capacity of the available hosts is filled with a representative VM mix ([`VmMix`], the
//!   most frequent shapes weighted by count) until no shape of the mix fits anywhere ([`inflate`]:
//!   shapes drawn in proportion to their weights, each on the first host where it fits); what is
//!   left free is stranded, in percent of the capacity of all hosts. Unavailable hosts take no VM,
//!   so their free capacity is out of service, not stranded.
//! - **time averages** ([`MetricsRecorder`]): a sample describes the inventory from its time until
//!   the next sample's, and is weighted by the part of that interval after the warm-up
//!   (`skip_until_s`); the last sample has no weight, so a run should record one at its end.
//!   Stranding, computed at fewer samples, is averaged the same way over the samples that carry
//!   it, the last of them standing until the last sample of all. A sample earlier than the one
//!   before it is taken as at that one's time.
//!
//! Densities and empty-to-free are fractions, empty hosts and stranding percentages, as in the
//! allocator's stats.

use domain::{HostState, ResourceKind, Resources, RESOURCE_DIMS};
use placement::InventoryState;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Figures of the inventory at one instant. O(1) except stranding (computed from
/// [`InventoryState::totals`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstantMetrics {
    pub time_s: f64,
    pub vms: usize,
    pub allocated_cores: f64,
    pub allocated_memory_gib: f64,
    pub non_empty_hosts: usize,
    pub hosts: usize,
    /// Allocated cores / cores of non-empty hosts (0 when none is non-empty).
    pub packing_density: f64,
    /// Share of hosts with no VM, percent.
    pub empty_hosts_pct: f64,
    /// Free cores on empty hosts / all free cores (0 when nothing is free).
    pub empty_to_free: f64,
    /// The offline lower bound at this instant.
    pub bound: OfflineBound,
    /// Inflation stranding, when computed at this sample.
    pub stranding: Option<Stranding>,
}

/// The fewest hosts that could hold the allocated resources, and the figures they would give.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OfflineBound {
    pub hosts: usize,
    /// Allocated cores / cores of `hosts` hosts (0 when `hosts` is 0).
    pub packing_density: f64,
    /// 100 * (hosts of the inventory - `hosts`) / hosts of the inventory (0 when it has none, or
    /// when the demand would need more hosts than it has).
    pub empty_hosts_pct: f64,
}

/// Capacity left unusable after inflation, in percent of the capacity of all hosts.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stranding {
    pub cpu_pct: f64,
    pub memory_pct: f64,
    /// VMs of the mix that the inflation fitted into the free capacity.
    pub fitted_vms: u64,
}

/// The figures of `state` at `time_s`, without stranding.
pub fn instant(state: &InventoryState, time_s: f64) -> InstantMetrics {
    let totals = state.totals();
    let occupancy = state.occupancy();
    InstantMetrics {
        time_s,
        vms: state.vm_count(),
        allocated_cores: occupancy.allocated_cores,
        allocated_memory_gib: occupancy.allocated_memory_gib,
        non_empty_hosts: totals.non_empty_hosts,
        hosts: occupancy.hosts,
        packing_density: occupancy.packing_density,
        empty_hosts_pct: occupancy.empty_hosts_pct,
        empty_to_free: occupancy.empty_to_free,
        bound: bound_for_total(&totals.allocated(), &totals.capacity, occupancy.hosts),
        stranding: None,
    }
}

/// The offline lower bound for `used` resources on `hosts` hosts of `host_capacity` each: the
/// maximum over dimensions of ceil(used / capacity); its density is allocated cores / (bound hosts
/// * host cores) and its empty % is (hosts - bound) / hosts.
pub fn offline_bound(used: Resources, host_capacity: Resources, hosts: usize) -> OfflineBound {
    let mut total = [0u128; RESOURCE_DIMS];
    for kind in ResourceKind::ALL {
        total[kind.index()] = u128::from(host_capacity.base(kind)) * hosts as u128;
    }
    bound_from(used.base_units(), total, hosts)
}

/// [`offline_bound`] with the mean host of an inventory whose capacities sum to `capacity`.
fn bound_for_total(used: &Resources, capacity: &Resources, hosts: usize) -> OfflineBound {
    bound_from(used.base_units(), capacity.base_units().map(u128::from), hosts)
}

/// The bound from per-dimension totals: ceil(used * hosts / total capacity), in integers so that
/// identical hosts give exactly ceil(used / host capacity).
fn bound_from(used: [u64; RESOURCE_DIMS], total_capacity: [u128; RESOURCE_DIMS], hosts: usize) -> OfflineBound {
    let mut needed: u128 = 0;
    for (used, total) in used.into_iter().zip(total_capacity) {
        // A dimension the hosts do not have cannot constrain the count (and cannot be used).
        if total > 0 {
            needed = needed.max((u128::from(used) * hosts as u128).div_ceil(total));
        }
    }
    let bound = usize::try_from(needed).unwrap_or(usize::MAX);
    let cores = ResourceKind::Cores.index();
    // Cores of `bound` mean hosts, as a float: only the ratio matters.
    let bound_cores = if hosts > 0 { total_capacity[cores] as f64 * bound as f64 / hosts as f64 } else { 0.0 };
    OfflineBound {
        hosts: bound,
        packing_density: ratio(used[cores] as f64, bound_cores),
        empty_hosts_pct: 100.0 * ratio(hosts.saturating_sub(bound) as f64, hosts as f64),
    }
}

/// `a / b`, 0 when `b` is not positive (nothing to divide by: nothing non-empty, nothing free).
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// One shape of a [`VmMix`] and how often it occurs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MixShape {
    pub demand: Resources,
    pub weight: u64,
}

/// A representative VM mix for inflation: distinct shapes with weights, heaviest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmMix {
    shapes: Vec<MixShape>,
}

impl VmMix {
    /// The `max_shapes` most frequent shapes among `demands`, each weighted by its count. Zero
    /// demands are dropped (they would fit forever).
    pub fn from_demands(demands: impl IntoIterator<Item = Resources>, max_shapes: usize) -> Self {
        let mut counts: HashMap<Resources, u64> = HashMap::new();
        for demand in demands {
            *counts.entry(demand).or_insert(0) += 1;
        }
        let mut mix = Self::new(counts.into_iter().map(|(demand, weight)| MixShape { demand, weight }));
        mix.shapes.truncate(max_shapes);
        mix
    }

    /// A mix of the given shapes; duplicates are merged, zero shapes and zero weights dropped.
    pub fn new(shapes: impl IntoIterator<Item = MixShape>) -> Self {
        let mut merged: HashMap<Resources, u64> = HashMap::new();
        for shape in shapes {
            if !shape.demand.is_zero() && shape.weight > 0 {
                let weight = merged.entry(shape.demand).or_insert(0);
                *weight = weight.saturating_add(shape.weight);
            }
        }
        let mut shapes: Vec<MixShape> =
            merged.into_iter().map(|(demand, weight)| MixShape { demand, weight }).collect();
        // Heaviest first, then by size, so that the mix (and the inflation) never depends on hash order.
        shapes.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.demand.base_units().cmp(&b.demand.base_units())));
        VmMix { shapes }
    }

    pub fn shapes(&self) -> &[MixShape] {
        &self.shapes
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }
}

/// Fills a copy of the available hosts' free capacity with `mix` (see [`inflate`]) and reports
/// what is left free, in percent of the capacity of all hosts. The allocator's state is not touched.
pub fn inflation_stranding(state: &InventoryState, mix: &VmMix) -> Stranding {
    let mut free: Vec<Resources> =
        state.hosts().iter().filter(|h| h.state == HostState::Available).map(|h| h.free()).collect();
    let fitted_vms = inflate(&mut free, mix);
    let capacity = state.totals().capacity;
    let left = |kind: ResourceKind| free.iter().map(|h| h.base(kind) as f64).sum::<f64>();
    let pct = |kind: ResourceKind| 100.0 * ratio(left(kind), capacity.base(kind) as f64);
    Stranding { cpu_pct: pct(ResourceKind::Cores), memory_pct: pct(ResourceKind::MemoryGib), fitted_vms }
}

/// Fills the free vectors `free` with VMs of `mix` until no shape fits in any of them; returns how
/// many VMs went in. Afterwards no shape of the mix fits in any element of `free`.
///
/// Deterministic: the shapes are drawn in proportion to their weights by smooth weighted
/// round-robin, and each goes to the first vector (in order) where it fits; a shape that fits
/// nowhere leaves the rotation, and the inflation ends when no shape is left. Free capacity only
/// shrinks, so each shape keeps a cursor on the first vector where it may still fit: the work is
/// O(fitted VMs * shapes + vectors * shapes).
pub fn inflate(free: &mut [Resources], mix: &VmMix) -> u64 {
    let shapes = &mix.shapes;
    let weights: Vec<i128> = shapes.iter().map(|s| i128::from(s.weight)).collect();
    let mut active: Vec<usize> = (0..shapes.len()).collect();
    let mut cursor = vec![0usize; shapes.len()];
    let mut current = vec![0i128; shapes.len()];
    let mut fitted_vms = 0u64;
    while let Some(&first) = active.first() {
        let total: i128 = active.iter().map(|&s| weights[s]).sum();
        let mut pick = first;
        for &s in &active {
            current[s] += weights[s];
            if current[s] > current[pick] {
                pick = s;
            }
        }
        current[pick] -= total;
        let demand = &shapes[pick].demand;
        let at = &mut cursor[pick];
        while free.get(*at).is_some_and(|host| !demand.fits_within(host)) {
            *at += 1;
        }
        // `fits_within` held, so the subtraction cannot fail.
        match free.get_mut(*at).and_then(|host| host.checked_sub(demand).map(|left| (host, left))) {
            Some((host, left)) => {
                *host = left;
                fitted_vms += 1;
            }
            None => {
                active.retain(|&s| s != pick);
                // Its credit leaves with it, so the others keep their proportions.
                current[pick] = 0;
            }
        }
    }
    fitted_vms
}

/// Time averages of the metrics after the warm-up (see the module doc for the weighting).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricsSummary {
    pub packing_density: f64,
    pub empty_hosts_pct: f64,
    pub empty_to_free: f64,
    pub bound_packing_density: f64,
    pub bound_empty_hosts_pct: f64,
    /// Mean number of non-empty hosts, and of hosts of the offline bound.
    pub non_empty_hosts: f64,
    pub bound_hosts: f64,
    /// `None` when no sample after the warm-up carried stranding.
    pub stranded_cpu_pct: Option<f64>,
    pub stranded_memory_pct: Option<f64>,
    /// Samples that count (at or after the warm-up, or standing across its end).
    pub samples: usize,
    /// Simulated seconds the averages cover (0 with fewer than two samples: then the averages are
    /// the plain mean of the samples after the warm-up).
    pub span_s: f64,
    /// Live migrations completed within the span (LARS drains and consolidation).
    #[serde(default)]
    pub migrations: u64,
    /// Migrations cancelled within the span: the VM exited while it moved (the budget spent, the
    /// move never made).
    #[serde(default)]
    pub migrations_cancelled: u64,
    /// Migrations wasted: completed ones whose VM exited within an hour of its move, and every
    /// cancelled one.
    #[serde(default)]
    pub migrations_wasted: u64,
    /// The same within six hours of the move (cancelled ones included).
    #[serde(default)]
    pub migrations_wasted_6h: u64,
    /// Memory those migrations moved, GiB.
    #[serde(default)]
    pub migrated_gib: f64,
    /// Migrations spent (completed or cancelled) per host of the inventory per day of the span.
    #[serde(default)]
    pub migrations_per_host_day: f64,
    /// Migrations spent per 100 VMs placed within the span.
    #[serde(default)]
    pub migrations_per_100_placements: f64,
}

impl MetricsSummary {
    /// Migrations the budget paid for within the span: completed or cancelled.
    pub fn migrations_spent(&self) -> u64 {
        self.migrations + self.migrations_cancelled
    }

    /// The share of the migrations spent that were wasted within an hour, and within six, percent
    /// (0 when none was spent).
    pub fn wasted_pct(&self) -> (f64, f64) {
        let spent = self.migrations_spent().max(1) as f64;
        (100.0 * self.migrations_wasted as f64 / spent, 100.0 * self.migrations_wasted_6h as f64 / spent)
    }

    /// These averages with the stranding (and the sample count) of `sampled`: for averages
    /// integrated at every event, while stranding is computed at the regular samples only.
    pub fn with_stranding_of(self, sampled: &MetricsSummary) -> MetricsSummary {
        MetricsSummary {
            stranded_cpu_pct: sampled.stranded_cpu_pct,
            stranded_memory_pct: sampled.stranded_memory_pct,
            samples: sampled.samples,
            ..self
        }
    }
}

/// Running weighted sums of the instant figures.
#[derive(Clone, Debug, Default)]
struct Sums {
    weight: f64,
    packing_density: f64,
    empty_hosts_pct: f64,
    empty_to_free: f64,
    bound_packing_density: f64,
    bound_empty_hosts_pct: f64,
    non_empty_hosts: f64,
    bound_hosts: f64,
}

impl Sums {
    fn add(&mut self, m: &InstantMetrics, weight: f64) {
        self.weight += weight;
        self.packing_density += weight * m.packing_density;
        self.empty_hosts_pct += weight * m.empty_hosts_pct;
        self.empty_to_free += weight * m.empty_to_free;
        self.bound_packing_density += weight * m.bound.packing_density;
        self.bound_empty_hosts_pct += weight * m.bound.empty_hosts_pct;
        self.non_empty_hosts += weight * m.non_empty_hosts as f64;
        self.bound_hosts += weight * m.bound.hosts as f64;
    }
}

/// Running weighted sums of stranding.
#[derive(Clone, Debug, Default)]
struct StrandingSums {
    weight: f64,
    cpu_pct: f64,
    memory_pct: f64,
    /// Plain sums and count, for when no time passes between the samples.
    plain_cpu_pct: f64,
    plain_memory_pct: f64,
    count: usize,
}

/// Accumulates samples: time-weighted averages (each sample weighted by the time to the next one),
/// skipping the warm-up before `skip_until_s`, and keeps the series.
#[derive(Clone, Debug)]
pub struct MetricsRecorder {
    skip_until_s: f64,
    keep_series: bool,
    series: Vec<InstantMetrics>,
    /// The last sample (at its effective time), whose weight is known only when the next one arrives.
    last: Option<InstantMetrics>,
    /// The latest sample time so far: samples never go back before it.
    latest_s: f64,
    /// The last sample that carried stranding, and its time.
    last_stranding: Option<(f64, Stranding)>,
    timed: Sums,
    /// Plain sums of the samples at or after the warm-up, for a recorder with no elapsed time.
    plain: Sums,
    stranding: StrandingSums,
    samples: usize,
}

impl MetricsRecorder {
    pub fn new(skip_until_s: f64) -> Self {
        MetricsRecorder {
            skip_until_s,
            keep_series: true,
            series: Vec::new(),
            last: None,
            latest_s: f64::NEG_INFINITY,
            last_stranding: None,
            timed: Sums::default(),
            plain: Sums::default(),
            stranding: StrandingSums::default(),
            samples: 0,
        }
    }

    /// A recorder that only keeps the averages (for runs sampled at every event).
    pub fn without_series(mut self) -> Self {
        self.keep_series = false;
        self
    }

    pub fn skip_until_s(&self) -> f64 {
        self.skip_until_s
    }

    /// Adds a sample. Samples should come in time order: one earlier than the previous one, or at
    /// a non-finite time, is taken as at the previous one's time (so it never counts twice).
    pub fn record(&mut self, m: InstantMetrics) {
        let time_s = if m.time_s.is_finite() && m.time_s > self.latest_s { m.time_s } else { self.latest_s };
        self.latest_s = time_s;
        if let Some(last) = self.last.take() {
            let weight = self.weight(last.time_s, time_s);
            if weight > 0.0 {
                self.timed.add(&last, weight);
                if last.time_s < self.skip_until_s {
                    // It stands across the end of the warm-up: it counts.
                    self.samples += 1;
                }
            }
        }
        let after_warm_up = time_s >= self.skip_until_s;
        if after_warm_up {
            self.plain.add(&m, 1.0);
            self.samples += 1;
        }
        if let Some(stranding) = m.stranding {
            if let Some((since, last)) = self.last_stranding.take() {
                let weight = self.weight(since, time_s);
                if weight > 0.0 {
                    self.stranding.weight += weight;
                    self.stranding.cpu_pct += weight * last.cpu_pct;
                    self.stranding.memory_pct += weight * last.memory_pct;
                }
            }
            if after_warm_up {
                self.stranding.plain_cpu_pct += stranding.cpu_pct;
                self.stranding.plain_memory_pct += stranding.memory_pct;
                self.stranding.count += 1;
            }
            self.last_stranding = Some((time_s, stranding));
        }
        let mut pending = m;
        if self.keep_series {
            self.series.push(pending.clone());
        }
        pending.time_s = time_s;
        self.last = Some(pending);
    }

    /// The part of [from, to) after the warm-up, in seconds (0 when empty, reversed or not finite).
    fn weight(&self, from_s: f64, to_s: f64) -> f64 {
        let weight = to_s - from_s.max(self.skip_until_s);
        if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            0.0
        }
    }

    /// Every sample recorded, warm-up included (empty after [`MetricsRecorder::without_series`]).
    pub fn series(&self) -> &[InstantMetrics] {
        &self.series
    }

    pub fn summary(&self) -> MetricsSummary {
        // With no time elapsed after the warm-up (one sample, or all at one instant), the plain
        // mean of the samples is the only sensible average.
        let (sums, span_s) =
            if self.timed.weight > 0.0 { (&self.timed, self.timed.weight) } else { (&self.plain, 0.0) };
        let avg = |x: f64| ratio(x, sums.weight);
        // The last stranding sample stands until the last sample of all.
        let mut s = self.stranding.clone();
        if let (Some((since, last)), Some(end)) = (&self.last_stranding, &self.last) {
            let weight = self.weight(*since, end.time_s);
            if weight > 0.0 {
                s.weight += weight;
                s.cpu_pct += weight * last.cpu_pct;
                s.memory_pct += weight * last.memory_pct;
            }
        }
        let (stranded_cpu_pct, stranded_memory_pct) = if s.weight > 0.0 {
            (Some(s.cpu_pct / s.weight), Some(s.memory_pct / s.weight))
        } else if s.count > 0 {
            (Some(s.plain_cpu_pct / s.count as f64), Some(s.plain_memory_pct / s.count as f64))
        } else {
            (None, None)
        };
        MetricsSummary {
            packing_density: avg(sums.packing_density),
            empty_hosts_pct: avg(sums.empty_hosts_pct),
            empty_to_free: avg(sums.empty_to_free),
            bound_packing_density: avg(sums.bound_packing_density),
            bound_empty_hosts_pct: avg(sums.bound_empty_hosts_pct),
            non_empty_hosts: avg(sums.non_empty_hosts),
            bound_hosts: avg(sums.bound_hosts),
            stranded_cpu_pct,
            stranded_memory_pct,
            samples: self.samples,
            span_s,
            migrations: 0,
            migrations_cancelled: 0,
            migrations_wasted: 0,
            migrations_wasted_6h: 0,
            migrated_gib: 0.0,
            migrations_per_host_day: 0.0,
            migrations_per_100_placements: 0.0,
        }
    }
}
