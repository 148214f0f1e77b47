//! A model bundle from Python: loaded and validated by `LifetimeModel::load`, and each row of a
//! frame predicted as the inference server predicts an instance. A row becomes the allocation
//! request the replay client would send (`VmRecord::to_request`), then the inference server's
//! instance (`PredictInstance::from_vm`) and its features (`RequestFeatures::from_instance`), so
//! the numbers are the server's for the same rows; the rows are shared out over the cores.

use crate::columns::{self, OutColumn, Table};
use crate::errors::Raised;
use domain::PredictInstance;
use lifetime_model::{LifetimeModel, RequestFeatures};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::path::PathBuf;
use traces::VmRecord;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(predict_instances, m)?)?;
    Ok(())
}

/// The inference server's instance of a trace row.
fn instance(record: &VmRecord) -> Result<PredictInstance, Raised> {
    let request = record.to_request("").map_err(|e| Raised::from(&e))?;
    Ok(PredictInstance::from_vm(&request))
}

/// The frame's rows as the `instances` of a `POST /v1/predict` body (JSON).
#[pyfunction]
fn predict_instances(py: Python<'_>, rows: usize, columns: &Bound<'_, PyAny>) -> PyResult<String> {
    let table = Table::extract(rows, columns)?;
    py.detach(|| -> Result<String, Raised> {
        let instances = table.records()?.iter().map(instance).collect::<Result<Vec<_>, _>>()?;
        serde_json::to_string(&instances).map_err(|e| Raised::other(e.to_string()))
    })
    .map_err(Into::into)
}

/// `f` over `records` in one chunk per core, the outputs in order.
fn parallel<T: Send>(
    records: &[VmRecord],
    f: impl Fn(&VmRecord) -> Result<T, Raised> + Sync,
) -> Result<Vec<T>, Raised> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = records.len().div_ceil(threads).max(1024);
    let parts: Vec<Result<Vec<T>, Raised>> = std::thread::scope(|scope| {
        let handles: Vec<_> = records
            .chunks(chunk)
            .map(|part| scope.spawn(|| part.iter().map(&f).collect::<Result<Vec<T>, _>>()))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Raised::other("a prediction thread panicked".to_owned()))))
            .collect()
    });
    let mut out = Vec::with_capacity(records.len());
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// A loaded model bundle.
#[pyclass(frozen, module = "lifetime_alloc._native")]
pub struct Model {
    model: LifetimeModel,
}

#[pymethods]
impl Model {
    /// Loads and validates the bundle in `path` (checksums, probe predictions).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let model = py.detach(|| LifetimeModel::load(&path)).map_err(|e| {
            let raised = Raised::from(&e);
            let fix = "give the directory of a model bundle (it holds manifest.json), e.g. models/default";
            Raised { field: Some("path".to_owned()), fix: Some(fix.to_owned()), ..raised }
        })?;
        Ok(Model { model })
    }

    /// The bundle's version.
    #[getter]
    fn version(&self) -> String {
        self.model.version().to_owned()
    }

    /// The bundle's manifest, as JSON.
    fn manifest_json(&self) -> PyResult<String> {
        serde_json::to_string(self.model.manifest()).map_err(|e| Raised::other(e.to_string()).into())
    }

    /// Predicts every row: columns `p_long`, `long` (1 or 0), `expected_lifetime_s` and, with
    /// `interval`, `interval_class`.
    #[pyo3(signature = (rows, columns, interval=false))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        rows: usize,
        columns: &Bound<'py, PyAny>,
        interval: bool,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let table = Table::extract(rows, columns)?;
        let out = py.detach(|| -> Result<Vec<OutColumn>, Raised> {
            let records = table.records()?;
            let predictions = parallel(&records, |record| {
                let instance = instance(record)?;
                // Every trace row carries its request time (start_s); the fallback is never read.
                let features = RequestFeatures::from_instance(&instance, record.start_s);
                let row = self.model.encode(&features);
                Ok(self.model.predict_row(&row, interval))
            })?;
            let mut columns = vec![
                OutColumn::float("p_long", predictions.iter().map(|p| p.p_long).collect()),
                OutColumn::float(
                    "long",
                    predictions
                        .iter()
                        .map(|p| if p.class == domain::LifetimeClass::Long { 1.0 } else { 0.0 })
                        .collect(),
                ),
                OutColumn::float("expected_lifetime_s", predictions.iter().map(|p| p.expected_lifetime_s).collect()),
            ];
            if interval {
                columns.push(OutColumn::float(
                    "interval_class",
                    predictions.iter().map(|p| p.interval_class.map_or(f64::NAN, f64::from)).collect(),
                ));
            }
            Ok(columns)
        })?;
        columns::to_python(py, out)
    }

    /// The encoded base rows (what the long-lived and interval models read), row-major: `(width,
    /// bytes)` of little-endian `f64`s; for comparing with other evaluators of the same model files.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        rows: usize,
        columns: &Bound<'py, PyAny>,
    ) -> PyResult<(usize, Bound<'py, PyBytes>)> {
        let table = Table::extract(rows, columns)?;
        let encoded = py.detach(|| -> Result<Vec<Vec<f64>>, Raised> {
            parallel(&table.records()?, |record| {
                Ok(self.model.encode(&RequestFeatures::from_instance(&instance(record)?, record.start_s)))
            })
        })?;
        let bytes: Vec<u8> = encoded.iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
        let width = encoded.first().map_or(0, Vec::len);
        Ok((width, PyBytes::new(py, &bytes)))
    }

    /// Predicts rows already encoded (`width` little-endian `f64`s a row, as [`Model::encode`]
    /// returns them): the evaluator alone, for comparing it with another on the same matrix.
    fn predict_encoded<'py>(&self, py: Python<'py>, width: usize, data: &[u8]) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        if width == 0 || data.len() % (8 * width) != 0 {
            return Err(Raised::input(
                "rows",
                "the matrix is not rows of `width` float64s",
                "pass Model.encode()'s matrix",
            )
            .into());
        }
        let values: Vec<f64> = data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        let rows: Vec<&[f64]> = values.chunks_exact(width).collect();
        let out = py.detach(|| {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let chunk = rows.len().div_ceil(threads).max(1024);
            let parts: Vec<Vec<(f64, f64)>> = std::thread::scope(|scope| {
                let handles: Vec<_> = rows
                    .chunks(chunk)
                    .map(|part| {
                        scope.spawn(|| {
                            part.iter()
                                .map(|row| {
                                    let p = self.model.predict_row(row, false);
                                    (p.p_long, p.expected_lifetime_s)
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
            });
            let all: Vec<(f64, f64)> = parts.into_iter().flatten().collect();
            vec![
                OutColumn::float("p_long", all.iter().map(|p| p.0).collect()),
                OutColumn::float("expected_lifetime_s", all.iter().map(|p| p.1).collect()),
            ]
        });
        columns::to_python(py, out)
    }

    /// The remaining lifetime of every row's VM after `uptime_s[i]` seconds of running, as
    /// `POST /v1/remaining-lifetime` answers it.
    fn predict_remaining<'py>(
        &self,
        py: Python<'py>,
        rows: usize,
        columns: &Bound<'py, PyAny>,
        uptime_s: Vec<f64>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let table = Table::extract(rows, columns)?;
        if uptime_s.len() != rows {
            return Err(Raised::input(
                "uptime_s",
                format!("{} uptimes for {rows} rows", uptime_s.len()),
                "give one uptime per row",
            )
            .into());
        }
        if let Some(bad) = uptime_s.iter().find(|u| !(u.is_finite() && **u >= 0.0)) {
            return Err(Raised::input(
                "uptime_s",
                format!("uptime {bad} is not a finite number >= 0"),
                "give each VM's uptime in seconds",
            )
            .into());
        }
        let out = py.detach(|| -> Result<Vec<OutColumn>, Raised> {
            let records = table.records()?;
            let remaining =
                parallel(&records, |record| Ok(RequestFeatures::from_instance(&instance(record)?, record.start_s)))?
                    .iter()
                    .zip(&uptime_s)
                    .map(|(features, uptime)| self.model.predict_remaining(features, *uptime))
                    .collect();
            Ok(vec![OutColumn::float("remaining_lifetime_s", remaining)])
        })?;
        columns::to_python(py, out)
    }
}
