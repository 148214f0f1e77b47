//! Training from Python, through the functions `lifetime-train` runs: `train_bundle` on the
//! records of a trace file or a frame, then `plots::write_report` (evaluation.md and the plots).

use crate::columns::Table;
use crate::errors::Raised;
use crate::trace::read_records;
use lifetime_train::train::{train_bundle, Progress, TrainConfig, TrainData, TrainError};
use pyo3::prelude::*;
use std::path::PathBuf;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(train, m)?)?;
    Ok(())
}

/// Each stage's name to a Python callback, attaching only then.
struct Stages(Option<Py<PyAny>>);

impl Progress for Stages {
    fn stage(&self, name: &str) {
        if let Some(callback) = &self.0 {
            Python::attach(|py| {
                // Progress is cosmetic: a callback that raises does not stop the training.
                let _ = callback.call1(py, (name,));
            });
        }
    }
}

fn train_error(error: TrainError) -> Raised {
    match &error {
        TrainError::Config(message) => {
            Raised::input("config", error.to_string(), format!("change the setting: {message}"))
        }
        TrainError::NotEnoughData(_) => Raised::input("train", error.to_string(), "train on a longer trace"),
        _ => Raised::other(error.to_string()),
    }
}

/// `lifetime-train --train PATH --out OUT`: the training records are the trace file `path` or the
/// frame's rows (`rows`, `columns`); `eval_path` is `--eval`. Returns the manifest (JSON), the
/// report (Markdown) and a warning about the plots, if any.
#[pyfunction]
#[pyo3(signature = (out, path=None, rows=None, columns=None, eval_path=None, name="lifetime".to_owned(), version=None,
    train_fraction=0.7, long_threshold_hours=2.0, iterations=300, num_leaves=63, survival=true, threads=2, seed=7,
    trace_end_s=None, progress=None))]
#[allow(clippy::too_many_arguments)]
fn train(
    py: Python<'_>,
    out: PathBuf,
    path: Option<PathBuf>,
    rows: Option<usize>,
    columns: Option<&Bound<'_, PyAny>>,
    eval_path: Option<PathBuf>,
    name: String,
    version: Option<String>,
    train_fraction: f64,
    long_threshold_hours: f64,
    iterations: usize,
    num_leaves: usize,
    survival: bool,
    threads: usize,
    seed: u64,
    trace_end_s: Option<f64>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, String, Option<String>)> {
    let frame = match (rows, columns) {
        (Some(rows), Some(columns)) => Some(Table::extract(rows, columns)?),
        _ => None,
    };
    let defaults = TrainConfig::default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let config = TrainConfig {
        version: version.unwrap_or_else(|| format!("{name}-{now}")),
        name,
        long_threshold_s: long_threshold_hours * 3_600.0,
        train_fraction,
        iterations,
        num_leaves,
        survival_edges_s: if survival { defaults.survival_edges_s.clone() } else { Vec::new() },
        threads,
        seed,
        ..defaults
    };
    let stages = Stages(progress);
    py.detach(|| -> Result<(String, String, Option<String>), Raised> {
        let (train, source) = match (frame, &path) {
            (Some(table), None) => (table.records()?, "data frame".to_owned()),
            (None, Some(path)) => (read_records(path, None)?, path.display().to_string()),
            _ => {
                return Err(Raised::input(
                    "train",
                    "give either a trace file or a data frame",
                    "pass one of them as `train`",
                ))
            }
        };
        let eval = eval_path.as_ref().map(|p| read_records(p, None)).transpose()?;
        std::fs::create_dir_all(&out).map_err(|e| {
            Raised::input("out", format!("{}: {e}", out.display()), "give a directory you can write to")
        })?;
        let manifest = train_bundle(TrainData { source, train, eval, trace_end_s }, &config, &out, &stages)
            .map_err(train_error)?;
        let (report, warning) = lifetime_train::plots::write_report(&manifest, &out).map_err(|e| {
            Raised::input("out", format!("writing evaluation.md: {e}"), "give a directory you can write to")
        })?;
        let manifest = serde_json::to_string(&manifest).map_err(|e| Raised::other(e.to_string()))?;
        Ok((manifest, report, warning))
    })
    .map_err(Into::into)
}
