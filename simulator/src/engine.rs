//! The event loop: a workload replayed through [`placement::Allocator`] in simulated time.
//!
//! Events, in time order; at equal times exits come first, then migration completions, drain
//! starts, arrivals and finally the metric sample (which so sees everything that happened at its
//! instant):
//!
//! - **arrival**: the VM's allocation request, with its prediction ([`crate::predict`]), goes to
//!   [`Allocator::allocate`]. A rejected VM is counted by reason and never exits.
//! - **exit**: a placed VM leaves at its true end ([`Allocator::release`]); exits sit in a min-heap.
//! - **LARS drains** ([`DrainPlan`], paper 000 s4.4 and s5.1): every `every_s` the allocator picks
//!   `hosts_per_drain` hosts and starts migrating their VMs, `max_in_flight` at a time; each
//!   migration started completes `migration_s` later ([`Allocator::complete_migration`]), which
//!   starts the next. VMs that exit before their turn are migrations avoided. When the drain is
//!   done its hosts are available again (LARS "marks it as available"), and the next drain starts
//!   at its scheduled time or, if that passed, at once.
//! - **consolidation rounds** ([`ConsolidationConfig`], SPEC section 11): when the allocator's next
//!   round is due, [`Allocator::consolidate`] chooses hosts under the budget and starts migrating
//!   their VMs; each completes `migration_s` later, as a drain's does.
//! - **samples** every `sample_interval_s` ([`metrics::instant`]) and at the end of the window,
//!   with inflation stranding every `inflation_every` samples: the series and the stranding
//!   average. The other averages are exact: the inventory's figures are recorded after every
//!   event and each holds until the next event ([`MetricsRecorder`] weighs them by that time), from
//!   [`SimConfig::measured_from_s`] on.
//!
//! The allocator's clock is trace time: every call passes the event's time, and the allocator
//! applies its own timed host events (lifetime classes dropping, exit-time refreshes, LAVA
//! deadlines) as time passes.
//!
//! **Realized prediction quality** ([`RealizedQuality`]): every placement and every exit also goes
//! to the allocator service's own [`OutcomeTracker`] (the prediction the VM was placed with, its
//! arrival and its exit, on the event clock), which resolves each VM at its exit or once it
//! outlives the policy's long-lived threshold still running, exactly as the allocator does with
//! real traffic. Its figures over the whole run (precision, recall, ROC AUC, average precision,
//! calibration, lifetime error) are what a quality safeguard would have measured. A prediction
//! without a model version (oracle, noisy sources) is tracked under the run's prediction label;
//! fallbacks are not tracked, as in the allocator.

use crate::clock::Time;
use crate::config::invalid;
pub use crate::config::{DrainPlan, SimConfig, SimError};
use crate::drains::{add_drain, Drains};
use crate::metrics::{self, MetricsRecorder, VmMix};
use crate::migrations::MigrationLedger;
use crate::predict::{self};
pub use crate::results::{
    Counters, FilteringFactor, MigrationCounters, Quantiles, RealizedQuality, RuleFiltering, SimResult, Timing,
    VmMigration, VmPlacement, WindowedQuality, WorkloadSummary,
};
use crate::workload::Workload;
use domain::quality::QualityFigures;
use domain::{AllocationOutcome, AllocationRequest, LifetimePrediction, VmId};
use placement::consolidation::ChooserKind;
use placement::defrag::{DrainHosts, DrainRequest};
use placement::outcomes::{OutcomeConfig, OutcomeTracker};
use placement::{Allocator, Change, DrainError, Registry};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

/// Feeds the allocator's [`OutcomeTracker`] during a run. Its clock is the event clock: every
/// placement (at the VM's arrival) and exit moves it, as requests and releases move the
/// allocator's, so a VM that outlives the threshold resolves by the next of them; the end of the
/// window resolves the last ones. The figures are over the whole run (the window never drops an
/// outcome) and do not depend on when a VM resolved, only on how.
struct QualityMeter {
    tracker: OutcomeTracker,
    /// The run's version name (always `Some` between calls).
    version: Option<String>,
    tracked: u64,
    /// With `quality_window`: a tracker with the allocator's sliding window, and its figures at
    /// the samples where it was full.
    windowed: Option<(OutcomeTracker, Vec<QualityFigures>)>,
}

impl QualityMeter {
    fn new(config: &SimConfig, version: String) -> Self {
        let tracker = |window: usize| {
            OutcomeTracker::new(OutcomeConfig {
                long_threshold_s: config.policy.long_threshold_s,
                window,
                max_versions: 8,
                max_pending: usize::MAX,
            })
        };
        QualityMeter {
            tracker: tracker(usize::MAX),
            version: Some(version),
            tracked: 0,
            windowed: config.quality_window.map(|window| (tracker(window), Vec::new())),
        }
    }

    /// A VM placed at `arrival_s` with `prediction`: a model's answer is tracked under its own
    /// version, another non-fallback prediction under the run's.
    fn placed(&mut self, vm: &VmId, prediction: Option<&LifetimePrediction>, arrival_s: f64) {
        let Some(prediction) = prediction.filter(|p| !p.source.is_fallback()) else { return };
        self.tracked += 1;
        if prediction.model_version.is_some() {
            self.tracker.placed(vm, Some(prediction), arrival_s);
            if let Some((windowed, _)) = &mut self.windowed {
                windowed.placed(vm, Some(prediction), arrival_s);
            }
        } else {
            // The run's version is lent to the copy and taken back: no allocation per VM.
            let mut named = prediction.clone();
            named.model_version = self.version.take();
            self.tracker.placed(vm, Some(&named), arrival_s);
            if let Some((windowed, _)) = &mut self.windowed {
                windowed.placed(vm, Some(&named), arrival_s);
            }
            self.version = named.model_version.take();
        }
    }

    fn released(&mut self, vm: &VmId, end_s: f64) {
        self.tracker.released(vm, Some(end_s));
        if let Some((windowed, _)) = &mut self.windowed {
            windowed.released(vm, Some(end_s));
        }
    }

    /// At a metric sample: the sliding window's figures, once it is full.
    fn sample(&mut self, now_s: f64) {
        let Some((windowed, samples)) = &mut self.windowed else { return };
        windowed.advance(now_s);
        let window = windowed.config().window as u64;
        // The run's one version (a model's, or the run's name).
        if let Some(version) = windowed.report().versions.into_iter().next() {
            if version.figures.resolved >= window {
                samples.push(version.figures);
            }
        }
    }

    /// The figures at `end_s` (VMs running past the threshold by then resolve first); `None` when
    /// no prediction was tracked.
    fn finish(mut self, end_s: f64, model_version: Option<&str>) -> Option<RealizedQuality> {
        self.tracker.advance(end_s);
        let report = self.tracker.report();
        let version = model_version.or(self.version.as_deref()).unwrap_or_default();
        let quality = report.version(version).or(report.versions.first())?;
        Some(RealizedQuality {
            version: quality.version.clone(),
            long_threshold_s: report.long_threshold_s,
            tracked: self.tracked,
            unresolved: quality.pending,
            figures: quality.figures.clone(),
            windows: self
                .windowed
                .as_ref()
                .map(|(tracker, samples)| WindowedQuality::of(tracker.config().window, samples)),
        })
    }
}

/// Kinds of events in the order they run at equal times.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Exit,
    Migration,
    Drain,
    Consolidate,
    Arrival,
    Sample,
}

/// How often the progress callback is called, in events.
const PROGRESS_EVERY: u64 = 1024;

/// Replays `workload` under `config`, its policy's rules and presets looked up in `registry`;
/// `progress` is called with the number of events done every so often and at the end.
pub fn run(
    workload: &Workload,
    config: &SimConfig,
    registry: &Registry,
    mut progress: impl FnMut(u64),
) -> Result<SimResult, SimError> {
    config.validate()?;
    let inventory = config.inventory.size(workload)?;
    let mut allocator = Allocator::with_registry(&inventory.spec, &config.allocator_config(), registry)?;
    let predictions = predict::predict(workload, &config.prediction, &config.policy, allocator.policy(), config.seed)?;
    allocator.set_repredictor(predictions.repredictor.clone());
    if let Some(consolidation) = &config.consolidation {
        if consolidation.chooser == ChooserKind::Oracle {
            allocator.set_consolidation_lifetimes(predict::oracle_lifetimes(workload));
        }
        allocator
            .set_consolidation(Some(consolidation.clone()), workload.from_s)
            .map_err(|e| invalid("consolidation", e.to_string()))?;
    }
    let mix =
        VmMix::from_demands(workload.vms.iter().map(|vm| vm.request.facts.demand), config.inflation_shapes.max(1));
    let validators = allocator.policy().validators().len();
    let hosts = inventory.hosts as f64;

    let started = Instant::now();
    let measured_from = config.measured_from_s(workload.from_s);
    // The averages integrate the inventory exactly: occupancy changes only at events, so the
    // figures after each event hold until the next one. The regular samples are for the series
    // and for stranding (too costly to compute at every event).
    let mut exact = MetricsRecorder::new(measured_from).without_series();
    let mut ledger = MigrationLedger::new(measured_from);
    let mut recorder = MetricsRecorder::new(measured_from);
    let mut counters = Counters::default();
    let mut timing = Timing { prediction_s: predictions.report.wall_s, ..Timing::default() };
    let mut filtering = FilteringFactor::default();
    let mut rule_sums: Vec<(String, f64)> = Vec::new();
    let mut ff_sum = 0.0;
    let mut placements: Option<Vec<VmPlacement>> = config.record_placements.then(Vec::new);
    let mut migrations_started: Option<Vec<VmMigration>> = config.record_placements.then(Vec::new);
    let mut quality = QualityMeter::new(config, config.prediction.label());

    let mut exits: BinaryHeap<Reverse<(Time, u32)>> = BinaryHeap::new();
    let mut next_arrival = 0usize;
    let mut next_sample = workload.from_s;
    let mut final_sample_done = false;
    let mut samples = 0u64;
    let mut drains = Drains::new(config, workload.from_s);
    let mut events = 0u64;
    let end = workload.to_s;

    loop {
        // The next event: the earliest time, and at equal times the kind that runs first.
        let mut next: Option<(f64, Kind)> = None;
        let mut consider = |time: f64, kind: Kind| {
            if time <= end && next.is_none_or(|(t, k)| (time, kind) < (t, k)) {
                next = Some((time, kind));
            }
        };
        if let Some(Reverse((Time(t), _))) = exits.peek() {
            consider(*t, Kind::Exit);
        }
        if let Some(Reverse((Time(t), _, _))) = drains.completions.peek() {
            consider(*t, Kind::Migration);
        }
        if !drains.active {
            consider(drains.next_at, Kind::Drain);
        }
        if let Some(due) = allocator.consolidation_due_s() {
            consider(due, Kind::Consolidate);
        }
        if let Some(vm) = workload.vms.get(next_arrival) {
            consider(vm.arrival_s, Kind::Arrival);
        }
        if !final_sample_done {
            consider(next_sample.min(end), Kind::Sample);
        }
        let Some((now, kind)) = next else { break };
        match kind {
            Kind::Exit => {
                let Some(Reverse((_, index))) = exits.pop() else { break };
                let vm = &workload.vms[index as usize];
                // A VM placed is in the allocator until it exits: the release cannot fail.
                if allocator.release(&vm.request.vm_id, now).is_ok() {
                    counters.exits += 1;
                    quality.released(&vm.request.vm_id, now);
                    ledger.exited(&vm.request.vm_id, now);
                }
                if drains.active {
                    drains.follow(&mut allocator, config, now, &mut counters.migrations);
                }
            }
            Kind::Migration => {
                let Some(Reverse((_, _, vm))) = drains.completions.pop() else { break };
                // Not migrating any more when it exited meanwhile (cancelled): nothing to do, and
                // its drain may be over already (counted once, when it ended).
                if allocator.complete_migration(&vm, now).is_ok() && drains.active {
                    drains.follow(&mut allocator, config, now, &mut counters.migrations);
                }
            }
            Kind::Drain => {
                let Some(plan) = &config.drains else { break };
                drains.last_start = now;
                let hosts = if plan.rolling {
                    let all = allocator.state().hosts();
                    let listed = (0..plan.hosts_per_drain.min(all.len()))
                        .map(|i| all[(drains.rolling_next + i) % all.len()].id.clone())
                        .collect();
                    drains.rolling_next = (drains.rolling_next + plan.hosts_per_drain) % all.len().max(1);
                    DrainHosts::Listed(listed)
                } else {
                    DrainHosts::Pick(plan.hosts_per_drain)
                };
                let request = DrainRequest { hosts, order: plan.order, max_in_flight: plan.max_in_flight };
                match allocator.start_drain(&request, now) {
                    Ok(_) => {
                        counters.migrations.drains_started += 1;
                        drains.follow(&mut allocator, config, now, &mut counters.migrations);
                    }
                    Err(DrainError::NoHosts) => {
                        counters.migrations.drains_without_hosts += 1;
                        drains.schedule_next(config, now);
                    }
                    Err(error) => return Err(invalid("drains", format!("the allocator refused a drain: {error}"))),
                }
            }
            Kind::Consolidate => {
                allocator.consolidate(now).map_err(|e| invalid("consolidation", e.to_string()))?;
            }
            Kind::Arrival => {
                let index = next_arrival;
                next_arrival += 1;
                let vm = &workload.vms[index];
                let mut request = vm.request.clone();
                request.prediction = predictions.per_vm[index].clone();
                let request = AllocationRequest::Vm(request);
                let before = Instant::now();
                let decision = allocator.allocate(&request, now)?;
                timing.allocate_s += before.elapsed().as_secs_f64();
                counters.arrivals += 1;
                let placed = match decision.outcome {
                    AllocationOutcome::Placed { mut placements } => {
                        counters.placed += 1;
                        ledger.placed(now);
                        quality.placed(&vm.request.vm_id, predictions.per_vm[index].as_ref(), vm.arrival_s);
                        if let Some(end) = vm.end_s {
                            exits.push(Reverse((Time(end.max(now)), index as u32)));
                        }
                        // The filtering factor: the stats are validators, then preference rules.
                        let stats = &decision.rule_stats;
                        if stats.len() > validators {
                            let preferences = &stats[validators..];
                            if rule_sums.is_empty() {
                                rule_sums = preferences.iter().map(|s| (s.rule.to_string(), 0.0)).collect();
                            }
                            for (sum, stat) in rule_sums.iter_mut().zip(preferences) {
                                sum.1 += stat.hosts_in.saturating_sub(stat.hosts_kept) as f64 / hosts;
                            }
                            let last = preferences.last().map_or(0, |s| s.hosts_kept);
                            ff_sum += preferences[0].hosts_in.saturating_sub(last) as f64 / hosts;
                            filtering.decisions += 1;
                        }
                        placements.pop().map(|p| p.host_id.0)
                    }
                    AllocationOutcome::Rejected { rejection } => {
                        counters.rejected += 1;
                        let reason = serde_json::to_value(rejection.code)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_else(|| format!("{:?}", rejection.code));
                        *counters.rejected_by_reason.entry(reason).or_insert(0) += 1;
                        None
                    }
                };
                if let Some(list) = &mut placements {
                    list.push(VmPlacement::new(&vm.request.vm_id.0, placed, predictions.per_vm[index].as_ref()));
                }
            }
            Kind::Sample => {
                let before = Instant::now();
                allocator.advance_clock(now);
                let mut sample = metrics::instant(allocator.state(), now);
                if config.inflation_every > 0 && samples % u64::from(config.inflation_every) == 0 {
                    sample.stranding = Some(metrics::inflation_stranding(allocator.state(), &mix));
                }
                recorder.record(sample);
                quality.sample(now);
                samples += 1;
                if now >= end {
                    final_sample_done = true;
                } else {
                    // The grid, then one last sample at the end of the window.
                    next_sample += config.sample_interval_s;
                }
                timing.metrics_s += before.elapsed().as_secs_f64();
            }
        }
        // The allocator's journal: the migrations a drain started complete `migration_s` later.
        // (Vectors that allocate only when a migration starts or completes.)
        let (mut started, mut moved) = (Vec::new(), Vec::new());
        for change in allocator.take_changes() {
            match change {
                Change::MigrationStarted { vm, target } => {
                    if let Some(record) = &mut migrations_started {
                        record.push(VmMigration { vm_id: vm.0.clone(), target: target.0.clone(), at_s: now });
                    }
                    started.push(vm)
                }
                Change::MigrationCompleted { vm, .. } => moved.push(vm),
                _ => {}
            }
        }
        for vm in started {
            ledger.started(vm.clone());
            let migration_s = match (allocator.consolidation(), &config.drains) {
                (Some(c), _) if c.is_migrating(&vm) => c.config.migration_s,
                (_, Some(plan)) => plan.migration_s,
                _ => 0.0,
            };
            drains.started(vm, migration_s, now);
        }
        for vm in moved {
            let memory_gib = allocator.state().vm(&vm).map_or(0.0, |v| v.facts.demand.memory_gib());
            ledger.moved(vm, memory_gib, now);
        }
        exact.record(metrics::instant(allocator.state(), now));
        events += 1;
        if events % PROGRESS_EVERY == 0 {
            progress(events);
        }
    }
    progress(events);
    if let Some(report) = allocator.drain_report().filter(|_| drains.active) {
        // The drain still running at the end counts what it did so far.
        add_drain(&mut counters.migrations, &report);
    }
    // Within the loop's wall time: resolving the VMs that outlived the threshold and the figures.
    let quality = quality.finish(end, predictions.report.model_version.as_deref());
    timing.wall_s = started.elapsed().as_secs_f64();
    timing.events = events;
    timing.samples = samples;
    timing.events_per_s = rate(events as f64, timing.wall_s);
    timing.decisions_per_s = rate(counters.arrivals as f64, timing.allocate_s);
    counters.vms_at_end = allocator.state().vm_count() as u64;
    if let Some(report) = allocator.consolidation_report() {
        counters.consolidation_in_flight_limit = Some(report.in_flight_limit);
        counters.consolidation_budget_shortfall = report.budget_shortfall;
        counters.consolidation = Some(report.counters);
    }
    if filtering.decisions > 0 {
        let n = filtering.decisions as f64;
        filtering.mean_pct = 100.0 * ff_sum / n;
        filtering.by_rule =
            rule_sums.into_iter().map(|(rule, sum)| RuleFiltering { rule, mean_pct: 100.0 * sum / n }).collect();
    }
    Ok(SimResult {
        config: config.clone(),
        workload: WorkloadSummary::of(workload, &inventory),
        prediction: predictions.report,
        counters,
        filtering,
        metrics: {
            let mut metrics = exact.summary().with_stranding_of(&recorder.summary());
            ledger.fill(&mut metrics, inventory.hosts);
            metrics
        },
        series: recorder.series().to_vec(),
        timing,
        final_stats: allocator.stats(),
        quality,
        placements,
        migrations_started,
    })
}

fn rate(count: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count / seconds
    } else {
        0.0
    }
}
