//! Which VMs of a trace to request: the [`Plan`], cut by `traces::window` like the simulator's workloads.

use crate::*;
use domain::VmRequest;
use traces::window::{self, Warmup};
use traces::{TraceError, VmRecord};

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
