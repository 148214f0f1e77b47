//! The one record type every trace source yields.

use domain::Priority;
use std::sync::Arc;

/// Extra trace columns (for example `batch_size`) kept as named features.
///
/// The names are shared by every record of a trace, so a record costs one value string per column.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExtraColumns {
    names: Arc<[String]>,
    values: Vec<String>,
}

impl ExtraColumns {
    /// `values[i]` belongs to `names[i]`; missing trailing values read as empty.
    pub fn new(names: Arc<[String]>, mut values: Vec<String>) -> Self {
        values.resize(names.len(), String::new());
        ExtraColumns { names, values }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Value of the named column; `None` if the trace has no such column.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.names.iter().position(|n| n == name).map(|i| self.values[i].as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.names.iter().map(String::as_str).zip(self.values.iter().map(String::as_str))
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// One VM of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct VmRecord {
    pub vm_id: String,
    /// Empty when the trace has no tenant (the Huawei trace).
    pub tenant_id: String,
    pub vm_type: String,
    pub cores: f64,
    pub memory_gib: f64,
    pub priority: Priority,
    /// Arrival in seconds of trace time; negative means already running when the trace starts.
    pub start_s: f64,
    /// Departure in seconds; `None` means still running at the end of the trace (right-censored).
    pub end_s: Option<f64>,
    pub extra: ExtraColumns,
}

impl VmRecord {
    pub fn is_censored(&self) -> bool {
        self.end_s.is_none()
    }

    /// True lifetime in seconds, known only for VMs that ended within the trace.
    pub fn lifetime_s(&self) -> Option<f64> {
        self.end_s.map(|end| end - self.start_s)
    }

    /// Lifetime seen by `trace_end_s`: the true one, or a lower bound for a censored VM.
    pub fn observed_lifetime_s(&self, trace_end_s: f64) -> f64 {
        self.end_s.unwrap_or(trace_end_s).max(self.start_s) - self.start_s
    }
}
