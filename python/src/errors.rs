//! Library errors as the package's Python exceptions (`lifetime_alloc.errors`): each carries the
//! field at fault and the fix when the library names them, and a missing file is a
//! `FileNotFoundError`, so that no error reaches Python as a panic.

use lifetime_model::BundleError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use simulator::engine::SimError;
use simulator::predict::PredictError;
use simulator::workload::WorkloadError;
use std::error::Error as StdError;
use traces::TraceError;

/// Which exception class of `lifetime_alloc.errors`.
#[derive(Clone, Copy)]
pub enum Kind {
    /// `InvalidInputError` (a `ValueError`): the caller's input is wrong.
    Input,
    /// `MissingFileError` (a `FileNotFoundError`).
    NotFound,
    /// `LifetimeAllocError`: the work itself failed.
    Failed,
}

/// An error on its way to Python: the message, and the field and fix when known.
pub struct Raised {
    pub kind: Kind,
    pub message: String,
    pub field: Option<String>,
    pub fix: Option<String>,
}

impl Raised {
    pub fn input(field: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) -> Self {
        Raised { kind: Kind::Input, message: message.into(), field: Some(field.into()), fix: Some(fix.into()) }
    }

    /// A failure of the work itself, not of the input (`LifetimeAllocError`).
    pub fn other(message: impl Into<String>) -> Self {
        Raised { kind: Kind::Failed, message: message.into(), field: None, fix: None }
    }

    fn failed(error: &(dyn StdError + 'static)) -> Self {
        let kind = if io_not_found(error) { Kind::NotFound } else { Kind::Failed };
        let fix = matches!(kind, Kind::NotFound)
            .then(|| "check the path (relative paths start at the current directory)".to_owned());
        Raised { kind, message: chain(error), field: None, fix }
    }

    fn with(mut self, field: impl Into<String>, fix: impl Into<String>) -> Self {
        self.kind = if matches!(self.kind, Kind::NotFound) { Kind::NotFound } else { Kind::Input };
        self.field = Some(field.into());
        self.fix = Some(fix.into());
        self
    }
}

/// The message of an error and of its causes that it does not already repeat.
fn chain(error: &dyn StdError) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message = format!("{message}: {text}");
        }
        source = cause.source();
    }
    message
}

fn io_not_found(error: &(dyn StdError + 'static)) -> bool {
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound) {
            return true;
        }
        current = e.source();
    }
    false
}

impl From<Raised> for PyErr {
    fn from(raised: Raised) -> PyErr {
        Python::attach(|py| {
            let class = match raised.kind {
                Kind::Input => "InvalidInputError",
                Kind::NotFound => "MissingFileError",
                Kind::Failed => "LifetimeAllocError",
            };
            let built = (|| -> PyResult<PyErr> {
                let kwargs = PyDict::new(py);
                kwargs.set_item("field", raised.field.as_deref())?;
                kwargs.set_item("fix", raised.fix.as_deref())?;
                let class = py.import("lifetime_alloc.errors")?.getattr(class)?;
                Ok(PyErr::from_value(class.call((raised.message.as_str(),), Some(&kwargs))?))
            })();
            // Without the Python half (the module imported alone), the error is still raised.
            built.unwrap_or_else(|_| pyo3::exceptions::PyValueError::new_err(raised.message))
        })
    }
}

impl From<&TraceError> for Raised {
    fn from(error: &TraceError) -> Self {
        let raised = Raised::failed(error);
        match error {
            TraceError::MissingColumn { column, expected } => {
                raised.with(*column, format!("add the column `{column}`: a trace has at least {expected}"))
            }
            TraceError::BadField { line, column, .. } => {
                raised.with(column.clone(), format!("correct `{column}` on line {line} of the trace"))
            }
            TraceError::BadRecord { vm_id, field, .. } => {
                raised.with(*field, format!("correct `{field}` of VM `{vm_id}`"))
            }
            TraceError::DuplicateColumn { column } => {
                raised.with(column.clone(), "name each column once in the header")
            }
            TraceError::UnsupportedFormat(_) => {
                raised.with("path", "give a .csv, .csv.gz (the project's trace format) or an Azure .sqlite/.db file")
            }
            TraceError::AzureTrace(_) => {
                raised.with("machine", "give machine=(machine_id, cores, memory_gib) for a .sqlite trace")
            }
            TraceError::Csv { line, .. } => raised.with("path", format!("correct line {line} of the trace")),
            _ => raised,
        }
    }
}

impl From<&WorkloadError> for Raised {
    fn from(error: &WorkloadError) -> Self {
        match error {
            WorkloadError::Trace(trace) => Raised::from(trace),
            WorkloadError::Invalid { field, message } => {
                Raised::input(*field, chain(error), format!("set `{field}`: it {message}"))
            }
            WorkloadError::DuplicateVmId(id) => {
                Raised::failed(error).with("vm_id", format!("give VM `{id}` and every other VM an id of its own"))
            }
            _ => Raised::failed(error),
        }
    }
}

impl From<&PredictError> for Raised {
    fn from(error: &PredictError) -> Self {
        match error {
            PredictError::Invalid { field, message } => Raised::input(
                format!("prediction.{field}"),
                chain(error),
                format!("set `prediction.{field}`: it {message}"),
            ),
            PredictError::Bundle { source, .. } => Raised::from(source).with(
                "prediction.source.bundle",
                "point `prediction.source.bundle` at a model bundle directory (models/default, say)",
            ),
            _ => Raised::failed(error),
        }
    }
}

impl From<&SimError> for Raised {
    fn from(error: &SimError) -> Self {
        match error {
            SimError::Workload(e) => Raised::from(e.as_ref()),
            SimError::Predict(e) => Raised::from(e.as_ref()),
            SimError::Invalid { field, message } => {
                Raised::input(*field, chain(error), format!("set `{field}`: it {message}"))
            }
            SimError::Allocator(_) => Raised::failed(error).with(
                "policy",
                "check the policy's `kind` (one of lifetime_alloc.simulation.policy_names()) and its rules",
            ),
            SimError::Allocate(_) => Raised::failed(error),
        }
    }
}

impl From<&BundleError> for Raised {
    fn from(error: &BundleError) -> Self {
        let raised = Raised::failed(error);
        if matches!(raised.kind, Kind::NotFound) {
            return raised.with("bundle", "give the directory of a model bundle (it holds manifest.json)");
        }
        raised
    }
}
