//! When to send each allocation and release: time compression plus a rate cap ([`schedule`]).

use crate::error::invalid;
use crate::*;
use serde::Serialize;

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
