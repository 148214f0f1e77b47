//! The one record type every trace source yields.

use crate::error::TraceError;
use domain::{FeatureValue, Features, Priority, RequestFacts, Resources, VmId, VmRequest};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tenant given to the requests of trace rows without one (the Huawei trace): the wire format
/// requires a tenant.
pub const NO_TENANT: &str = "no-tenant";

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

/// [`VmRecord::check`] of a record's values, the record not built (a data frame's row read in
/// place, say).
pub fn check_values(
    vm_id: &str,
    cores: f64,
    memory_gib: f64,
    start_s: f64,
    end_s: Option<f64>,
) -> Result<(), TraceError> {
    let bad = |field: &'static str, message: &str| {
        Err(TraceError::BadRecord { vm_id: vm_id.to_owned(), field, message: message.to_owned() })
    };
    if vm_id.is_empty() {
        return bad("vm_id", "must not be empty");
    }
    for (field, value) in [("cores", cores), ("memory_gib", memory_gib)] {
        if !(value.is_finite() && value > 0.0) {
            return bad(field, "must be a finite number greater than 0");
        }
    }
    if !start_s.is_finite() {
        return bad("start_s", "must be a finite number");
    }
    match end_s {
        Some(end) if !end.is_finite() => bad("end_s", "must be a finite number (or missing: still running)"),
        Some(end) if end < start_s => bad("end_s", "must not be before start_s"),
        _ => Ok(()),
    }
}

/// A record's values with their text borrowed from where they were read (a CSV row, a data frame's
/// columns), its extra columns' values kept apart: a row is checked and looked at without being
/// copied, and made a [`VmRecord`] only when one is wanted.
#[derive(Clone, Copy, Debug)]
pub struct BorrowedRecord<'a> {
    pub vm_id: &'a str,
    pub tenant_id: &'a str,
    pub vm_type: &'a str,
    pub cores: f64,
    pub memory_gib: f64,
    pub priority: Priority,
    pub start_s: f64,
    pub end_s: Option<f64>,
}

impl BorrowedRecord<'_> {
    /// [`VmRecord::check`] of these values.
    pub fn check(&self) -> Result<(), TraceError> {
        check_values(self.vm_id, self.cores, self.memory_gib, self.start_s, self.end_s)
    }

    /// The owned record, `extra` the values of the extra columns `names` (none read when there are
    /// no such columns).
    pub fn to_record<S: Into<String>>(&self, names: &Arc<[String]>, extra: impl IntoIterator<Item = S>) -> VmRecord {
        VmRecord {
            vm_id: self.vm_id.to_owned(),
            tenant_id: self.tenant_id.to_owned(),
            vm_type: self.vm_type.to_owned(),
            cores: self.cores,
            memory_gib: self.memory_gib,
            priority: self.priority,
            start_s: self.start_s,
            end_s: self.end_s,
            extra: if names.is_empty() {
                ExtraColumns::default()
            } else {
                ExtraColumns::new(Arc::clone(names), extra.into_iter().map(Into::into).collect())
            },
        }
    }
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

    /// This record's values, borrowed (its extra columns left out).
    pub fn borrowed(&self) -> BorrowedRecord<'_> {
        BorrowedRecord {
            vm_id: &self.vm_id,
            tenant_id: &self.tenant_id,
            vm_type: &self.vm_type,
            cores: self.cores,
            memory_gib: self.memory_gib,
            priority: self.priority,
            start_s: self.start_s,
            end_s: self.end_s,
        }
    }

    /// Checks the values the CSV reader checks as it parses a row, for records built some other way
    /// (from a data frame, say): a non-empty id, positive finite sizes, a finite start, and a finite
    /// end no earlier than the start. The error names the column.
    pub fn check(&self) -> Result<(), TraceError> {
        check_values(&self.vm_id, self.cores, self.memory_gib, self.start_s, self.end_s)
    }

    /// The allocation request of this VM, as the replay client sends it and the simulator places
    /// it: its id behind `vm_id_prefix` (none when empty), [`NO_TENANT`] for a missing tenant, its
    /// trace start as the request time, the `os` column as the request's OS and every other
    /// non-empty extra column as a feature (a number when it reads as a finite one), exactly as the
    /// inference client builds its instances, so the model sees the same row either way. No
    /// prediction: the caller attaches one.
    pub fn to_request(&self, vm_id_prefix: &str) -> Result<VmRequest, TraceError> {
        let vm_id = if vm_id_prefix.is_empty() { self.vm_id.clone() } else { format!("{vm_id_prefix}-{}", self.vm_id) };
        let tenant_id = if self.tenant_id.is_empty() { NO_TENANT.to_owned() } else { self.tenant_id.clone() };
        let demand = Resources::from_whole(self.cores, self.memory_gib, 0.0).map_err(|(kind, err)| {
            TraceError::BadRecord { vm_id: self.vm_id.clone(), field: kind.field_name(), message: err.to_string() }
        })?;
        let mut os = None;
        let mut features = BTreeMap::new();
        for (name, value) in self.extra.iter() {
            if value.is_empty() {
                continue;
            }
            if name == "os" {
                os = Some(value.to_owned());
            } else {
                let feature = match value.parse::<f64>() {
                    Ok(number) if number.is_finite() => FeatureValue::Number(number),
                    _ => FeatureValue::Text(value.to_owned()),
                };
                features.insert(name.to_owned(), feature);
            }
        }
        let mut facts = RequestFacts::new(&tenant_id, &self.vm_type, demand);
        facts.requested_at_s = Some(self.start_s);
        facts.details.priority = self.priority;
        facts.details.os = os;
        facts.details.features = Features::from(features);
        Ok(VmRequest::of(VmId(vm_id), facts))
    }
}
