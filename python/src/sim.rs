//! Simulation from Python, through the functions `simulate` runs: a configuration (the
//! `SimConfig` of a result's `config`, as JSON) is checked, its workload loaded and replayed by
//! `simulator::engine::run`; an experiment by `simulator::compare`. Results cross as the JSON the
//! CLI writes with `--out`, so the two are compared field by field.

use crate::columns::Table;
use crate::errors::Raised;
use placement::Registry;
use pyo3::prelude::*;
use simulator::compare::{self, CompareError, Comparison, Experiment};
use simulator::engine::{self, SimConfig};
use simulator::predict::PredictionSourceConfig;
use simulator::workload::{TraceSpec, Workload};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The policies' rules and presets, as the module's root registered them.
static REGISTRY: OnceLock<Registry> = OnceLock::new();

fn registry() -> Result<&'static Registry, Raised> {
    REGISTRY.get().ok_or_else(|| Raised::other("the module's root registered no policies"))
}

/// Adds the simulation functions to `m`, their policies looked up in `registry`.
pub fn register(m: &Bound<'_, PyModule>, registry: Registry) -> PyResult<()> {
    // The module is initialised once per process; a second call keeps the first registry.
    let _ = REGISTRY.set(registry);
    m.add_function(wrap_pyfunction!(default_config, m)?)?;
    m.add_function(wrap_pyfunction!(policy_names, m)?)?;
    m.add_function(wrap_pyfunction!(parse_prediction, m)?)?;
    m.add_function(wrap_pyfunction!(config_to_toml, m)?)?;
    m.add_function(wrap_pyfunction!(config_from_toml, m)?)?;
    m.add_function(wrap_pyfunction!(experiment_from_toml, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(compare_runs, m)?)?;
    Ok(())
}

/// `SimConfig::default()` as JSON (what `simulate run --print-config` starts from).
#[pyfunction]
fn default_config() -> PyResult<String> {
    serde_json::to_string(&SimConfig::default()).map_err(|e| Raised::other(e.to_string()).into())
}

/// The policy presets of the registry (`simulate run --policy`'s choices).
#[pyfunction]
fn policy_names() -> PyResult<Vec<String>> {
    Ok(registry()?.preset_names().iter().map(|name| name.to_string()).collect())
}

/// A prediction source's short text (`oracle`, `pr:0.9,0.8`, `model:DIR`, ...) as its JSON.
#[pyfunction]
fn parse_prediction(text: &str) -> PyResult<String> {
    let source = PredictionSourceConfig::parse(text).map_err(|message| {
        Raised::input(
            "prediction",
            format!("prediction {message}"),
            "use oracle, binned-oracle, none, model, model:BUNDLE_DIR, accuracy:0.9 or pr:0.9,0.8",
        )
    })?;
    serde_json::to_string(&source).map_err(|e| Raised::other(e.to_string()).into())
}

fn config_from_json(json: &str) -> Result<SimConfig, Raised> {
    let config: SimConfig = serde_json::from_str(json).map_err(|e| {
        Raised::input(
            "config",
            format!("not a valid run configuration: {e}"),
            "start from lifetime_alloc.simulation.default_config() and change what you need",
        )
    })?;
    config.validate().map_err(|e| Raised::from(&e))?;
    Ok(config)
}

/// A run configuration (JSON) as the TOML `simulate run --config` reads.
#[pyfunction]
fn config_to_toml(json: &str) -> PyResult<String> {
    let config = config_from_json(json)?;
    toml::to_string(&config).map_err(|e| Raised::other(e.to_string()).into())
}

/// A run configuration file's TOML (`simulate run --config`) as JSON.
#[pyfunction]
fn config_from_toml(text: &str) -> PyResult<String> {
    let config: SimConfig = toml::from_str(text).map_err(|e| {
        Raised::input(
            "config",
            format!("not a valid run configuration: {e}"),
            "correct the file (`simulate run --print-config` writes a valid one)",
        )
    })?;
    serde_json::to_string(&config).map_err(|e| Raised::other(e.to_string()).into())
}

/// An experiment file's TOML (`configs/experiments/*.toml`) as JSON.
#[pyfunction]
fn experiment_from_toml(text: &str) -> PyResult<String> {
    let experiment = Experiment::from_toml(text).map_err(compare_error)?;
    serde_json::to_string(&experiment).map_err(|e| Raised::other(e.to_string()).into())
}

/// Calls a Python progress callback with `(done, total)` at most ten times a second, attaching to
/// the interpreter only then; a callback that raises is left alone (progress is cosmetic).
struct Progress<'a> {
    callback: Option<&'a Py<PyAny>>,
    total: u64,
    last: Mutex<Option<Instant>>,
}

impl<'a> Progress<'a> {
    fn new(callback: Option<&'a Py<PyAny>>, total: u64) -> Self {
        Progress { callback, total, last: Mutex::new(None) }
    }

    fn report(&self, done: u64, force: bool) {
        let Some(callback) = self.callback else { return };
        if let Ok(mut last) = self.last.lock() {
            if !force && last.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
                return;
            }
            *last = Some(Instant::now());
        }
        Python::attach(|py| {
            let _ = callback.call1(py, (done, self.total));
        });
    }
}

/// The workload of a configuration: its trace, or the frame's rows (`trace` set to `provided`).
fn workload(config: &mut SimConfig, frame: Option<Table>) -> Result<Workload, Raised> {
    match frame {
        Some(table) => {
            let records = table.records()?;
            config.workload.trace = TraceSpec::Provided { name: "data frame".to_owned() };
            Workload::from_records(records, &config.workload).map_err(|e| Raised::from(&e))
        }
        None => Workload::load(&config.workload).map_err(|e| Raised::from(&e)),
    }
}

/// `simulate run --config` with the configuration as JSON; the frame's rows (`rows`, `columns`)
/// are the trace when given. Returns the result as `--out` writes it.
#[pyfunction]
#[pyo3(signature = (config, rows=None, columns=None, progress=None))]
fn simulate(
    py: Python<'_>,
    config: &str,
    rows: Option<usize>,
    columns: Option<&Bound<'_, PyAny>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let mut config = config_from_json(config)?;
    let frame = match (rows, columns) {
        (Some(rows), Some(columns)) => Some(Table::extract(rows, columns)?),
        _ => None,
    };
    py.detach(|| -> Result<String, Raised> {
        let workload = workload(&mut config, frame)?;
        let progress = Progress::new(progress.as_ref(), (workload.vms.len() + workload.exits_in_window()) as u64);
        let result = engine::run(&workload, &config, registry()?, |done| progress.report(done, false))
            .map_err(|e| Raised::from(&e))?;
        progress.report(progress.total, true);
        serde_json::to_string(&result).map_err(|e| Raised::other(e.to_string()))
    })
    .map_err(Into::into)
}

fn compare_error(error: CompareError) -> Raised {
    match &error {
        CompareError::Invalid(_) => {
            Raised::input("experiment", error.to_string(), "correct the experiment (see configs/experiments/*.toml)")
        }
        CompareError::Run { label, source } => {
            let raised = Raised::from(source);
            Raised { message: format!("run `{label}`: {}", raised.message), ..raised }
        }
        _ => Raised::other(error.to_string()),
    }
}

/// `simulate compare`: the experiment (JSON) over its seeds, `jobs`
/// runs at a time, on its base's workload or the frame's rows. Returns the comparison as the
/// `results.json` it writes, and its Markdown table.
#[pyfunction]
#[pyo3(signature = (experiment, jobs, rows=None, columns=None, progress=None))]
fn compare_runs(
    py: Python<'_>,
    experiment: &str,
    jobs: usize,
    rows: Option<usize>,
    columns: Option<&Bound<'_, PyAny>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, String)> {
    let mut experiment: Experiment =
        serde_json::from_str(experiment).map_err(|e| compare_error(CompareError::Invalid(e.to_string())))?;
    let frame = match (rows, columns) {
        (Some(rows), Some(columns)) => Some(Table::extract(rows, columns)?),
        _ => None,
    };
    py.detach(|| -> Result<(String, String), Raised> {
        let workload = workload(&mut experiment.base, frame)?;
        let plan = experiment.plan(registry()?).map_err(compare_error)?;
        let per_run = (workload.vms.len() + workload.exits_in_window()) as u64;
        let progress = Progress::new(progress.as_ref(), per_run * plan.len() as u64);
        let done = std::sync::atomic::AtomicU64::new(0);
        let runs = compare::run_all(&workload, plan, registry()?, jobs, &|events| {
            let total = done.fetch_add(events, std::sync::atomic::Ordering::Relaxed) + events;
            progress.report(total, false);
        })
        .map_err(compare_error)?;
        progress.report(progress.total, true);
        let comparison = Comparison::new(experiment, runs);
        let json = serde_json::to_string(&comparison).map_err(|e| Raised::other(e.to_string()))?;
        Ok((json, compare::markdown(&comparison)))
    })
    .map_err(Into::into)
}
