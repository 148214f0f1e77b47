//! The allocator in time: each host's lifetime summary (class, exit time, policy-state code), the
//! events that change it without a request (a class dropping, an exit-time refresh from
//! repredictions, a policy-state timer such as LAVA's deadline), and the repredicting model.

use super::Allocator;
use crate::lifetime::{HostLifetime, OrderedTime};
use crate::reprediction::{ExitTimes, Repredictor};
use crate::state::HostIndex;
use std::cmp::Reverse;
use std::sync::Arc;

impl Allocator {
    /// Uses `model` to repredict remaining lifetimes from now on (`None`: initial predictions minus
    /// age), and recomputes every host's exit time with it. Only policies that read exit times
    /// (NILAS, LAVA) use it.
    pub fn set_repredictor(&mut self, model: Option<Arc<dyn Repredictor>>) {
        if !self.policy.reads_exit_times() {
            return;
        }
        // The VMs' rows are encoded again from their records (what the store keeps of them).
        self.repredictions.set_model(model);
        self.refresh_exits();
    }

    /// Model evaluations made by repredictions since start (O(1); also in [`Allocator::stats`]): a
    /// reprediction the model's split thresholds show to be unchanged since the VM's last
    /// evaluation reuses it and is not counted ([`crate::reprediction`]).
    pub fn repredictions_made(&self) -> u64 {
        self.repredictions.count
    }

    /// Survival curves of placed VMs the repredictor answered from its recent ones, and those it
    /// computed ([`crate::reprediction::Repredictions::curves_reused_and_computed`]).
    pub fn curves_reused_and_computed(&self) -> (u64, u64) {
        self.repredictions.curves_reused_and_computed()
    }

    /// Version of the repredicting model, if one is set.
    pub fn repredictor_version(&self) -> Option<&str> {
        self.repredictions.model_version()
    }

    /// Recomputes every non-empty host's exit time now (what the periodic refresh does host by
    /// host); the hosts whose summary changed are re-evaluated by the index, each class when next
    /// used (with every host changed at once, that is cheaper than re-filing each host in every
    /// class as the periodic refresh does).
    pub fn refresh_exits(&mut self) {
        for index in 0..self.state.hosts().len() {
            let host = HostIndex(index as u32);
            if !self.state.hosts()[index].is_empty() {
                let before = self.lifetimes[index];
                self.repredict_host(host);
                if self.lifetimes[index] != before {
                    self.host_changed(host);
                }
            }
        }
    }

    /// Recomputes a host's lifetime summary from its VMs after a VM arrived or left, and schedules
    /// its next event. For policies that read exit times, each VM's last predicted exit is reused
    /// (a VM new to the host is predicted now): repredicting every VM of the host is the periodic
    /// refresh's job ([`Allocator::repredict_host`]).
    pub(super) fn refresh_lifetime(&mut self, host: HostIndex) {
        self.update_lifetime(host, false);
    }

    /// Repredicts the remaining lifetime of every VM on the host and recomputes its summary.
    fn repredict_host(&mut self, host: HostIndex) {
        self.update_lifetime(host, true);
    }

    fn update_lifetime(&mut self, host: HostIndex, repredict: bool) {
        let now = self.clock_s;
        let reads_exits = self.policy.reads_exit_times();
        let mode = match (reads_exits, repredict) {
            (false, _) => ExitTimes::Initial,
            (true, false) => ExitTimes::Reuse,
            (true, true) => ExitTimes::Repredict,
        };
        let exit_s = self.repredictions.host_exit_s(host.get(), now, mode);
        let classes = self.policy.classes();
        let record = &self.state.hosts()[host.get()];
        let mut summary = HostLifetime::at(classes, exit_s, now);
        if reads_exits {
            // These policies read exit times, not the class (whose drops would only cost events).
            summary.next_change_s = f64::INFINITY;
            let next = &mut self.next_refresh[host.get()];
            *next = match self.refresh_interval_s {
                Some(_) if record.is_empty() => f64::INFINITY,
                Some(interval) if repredict || *next == f64::INFINITY => now + interval,
                Some(_) => *next,
                None => f64::INFINITY,
            };
        }
        summary.state_code = self.host_state.as_ref().map_or(0, |state| state.code(host));
        self.lifetimes[host.get()] = summary;
        self.schedule(host);
    }

    /// Puts the host's next event (class drop, exit refresh, policy-state timer) in the heap.
    fn schedule(&mut self, host: HostIndex) {
        let timer = self.host_state.as_ref().and_then(|state| state.timer_s(host)).unwrap_or(f64::INFINITY);
        let due = self.lifetimes[host.get()].next_change_s.min(self.next_refresh[host.get()]).min(timer);
        if due.is_finite() && due != self.next_due[host.get()] {
            self.due.push(Reverse((OrderedTime(due), host)));
        }
        self.next_due[host.get()] = due;
    }

    /// Moves the clock to `now_s` and applies the host events that fell due: lifetime classes
    /// dropping, exit times refreshed, policy-state timers (every other call does this itself; the
    /// simulator calls it to move time between events).
    pub fn advance_clock(&mut self, now_s: f64) {
        if now_s.is_finite() && now_s > self.clock_s {
            self.clock_s = now_s;
        }
        while let Some(Reverse((OrderedTime(at), host))) = self.due.peek().copied() {
            if at > self.clock_s {
                break;
            }
            self.due.pop();
            // Stale when the host changed after this event was scheduled.
            if self.next_due[host.get()] != at {
                continue;
            }
            self.next_due[host.get()] = f64::INFINITY;
            let before = self.lifetimes[host.get()];
            if let Some(state) = &mut self.host_state {
                if state.on_timer(host, &self.state.hosts()[host.get()], at) {
                    self.state_changed.push(host);
                }
            }
            if self.next_refresh[host.get()] <= at {
                self.repredict_host(host);
            } else {
                self.refresh_lifetime(host);
            }
            self.summary_changed(host, &before);
        }
    }

    /// Tells the index that the host's lifetime summary is no longer `before` (its VMs unchanged):
    /// a moved exit time alone is re-filed in every class at once, anything else a rule may read
    /// is re-evaluated by each class when next used.
    fn summary_changed(&mut self, host: HostIndex, before: &HostLifetime) {
        let after = self.lifetimes[host.get()];
        if after == *before || !self.policy.reads_host_lifetime() {
            return;
        }
        match &mut self.index {
            Some(index) if self.policy.caches_alike(before, &after) => index.host_exit_moved(host, after.exit_s),
            _ => self.host_changed(host),
        }
    }
}
