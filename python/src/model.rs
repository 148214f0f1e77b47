//! A model bundle from Python: loaded and validated by `LifetimeModel::load`, and each row of a
//! frame predicted as the inference server predicts an instance. A row becomes the allocation
//! request the replay client would send (`VmRecord::to_request`), then the inference server's
//! instance (`PredictInstance::from_vm`) and its features (`RequestFeatures::from_instance`), so
//! the numbers are the server's for the same rows; the rows are shared out over the cores. Rows
//! that differ only in their time share one request's features and one look-up of their tenant's
//! and job's histories (`Model::encode_rows`), and the encoded rows are evaluated a block at a
//! time (`TreeEnsemble::predict_rows`, bit for bit the single-row evaluation).

use crate::columns::{self, OutColumn, Table};
use crate::errors::Raised;
use domain::PredictInstance;
use lifetime_model::history::{Histories, PastHistories};
use lifetime_model::{LifetimeModel, RequestFeatures};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Range;
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

/// The features of a trace row as the inference server reads them off its instance: the same as
/// `RequestFeatures::from_instance(&instance(record)?, record.start_s)` (`of` the facts is
/// documented to equal it), built without the instance in between. Every trace row carries its
/// request time (`start_s`); the fallback is never read.
fn features(record: &VmRecord) -> Result<RequestFeatures, Raised> {
    let request = record.to_request("").map_err(|e| Raised::from(&e))?;
    Ok(RequestFeatures::of(&request.facts, record.start_s))
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

/// `f` over the row indices `0..rows` in one range per core (at least [`MIN_CHUNK`] rows each),
/// the outputs in order; the first error in row order is the one returned. The evaluator itself
/// is single-threaded (the inference server and the allocator call it per request): sharing rows
/// out over the cores is this caller's choice.
fn parallel<T: Send>(rows: usize, f: impl Fn(Range<usize>) -> Result<T, Raised> + Sync) -> Result<Vec<T>, Raised> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = rows.div_ceil(threads).max(MIN_CHUNK);
    let ranges: Vec<Range<usize>> =
        (0..rows).step_by(chunk.max(1)).map(|start| start..(start + chunk).min(rows)).collect();
    if ranges.len() <= 1 {
        return ranges.into_iter().map(&f).collect();
    }
    let parts: Vec<Result<T, Raised>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ranges.into_iter().map(|range| scope.spawn(|| f(range))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Raised::other("a prediction thread panicked".to_owned()))))
            .collect()
    });
    parts.into_iter().collect()
}

/// The hash of a row's key in [`Model::encode_rows`], eight bytes at a time (Firefox's FxHash
/// step): short keys of the caller's own rows, hashed once a row, where the standard SipHash
/// costs more than the look-up it serves.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(word);
            self.add(u64::from_le_bytes(eight));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut eight = [0u8; 8];
            eight[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(eight) ^ ((rest.len() as u64) << 59));
        }
    }
}

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

/// Fewer rows than this are not worth a thread.
const MIN_CHUNK: usize = 1024;

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

    /// Predicts every row: columns `p_long`, `long` (1 or 0), with `lifetime` `expected_lifetime_s`
    /// (the remaining-lifetime model, as costly as the long-lived one) and, with `interval`,
    /// `interval_class`.
    #[pyo3(signature = (rows, columns, interval=false, lifetime=true))]
    fn predict<'py>(
        &self,
        py: Python<'py>,
        rows: usize,
        columns: &Bound<'py, PyAny>,
        interval: bool,
        lifetime: bool,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let table = Table::extract(rows, columns)?;
        let out = py.detach(|| -> Result<Vec<OutColumn>, Raised> {
            let parts = parallel(table.rows(), |range| {
                let encoded = self.encode_rows(&table, range)?;
                Ok(self.evaluate(&encoded, lifetime, interval))
            })?;
            let mut predictions = Predictions::default();
            for part in parts {
                predictions.append(part);
            }
            let threshold = self.model.manifest().decision_threshold;
            let long = predictions.p_long.iter().map(|&p| if p >= threshold { 1.0 } else { 0.0 }).collect();
            let mut columns = vec![OutColumn::float("p_long", predictions.p_long), OutColumn::float("long", long)];
            if lifetime {
                columns.push(OutColumn::float("expected_lifetime_s", predictions.lifetime));
            }
            if interval {
                columns.push(OutColumn::float("interval_class", predictions.interval));
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
        let encoded = py.detach(|| -> Result<Vec<f64>, Raised> {
            Ok(parallel(table.rows(), |range| self.encode_rows(&table, range))?.concat())
        })?;
        let bytes: Vec<u8> = encoded.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok((self.model.schema().len(), PyBytes::new(py, &bytes)))
    }

    /// Predicts rows already encoded (`width` little-endian `f64`s a row, as [`Model::encode`]
    /// returns them): the evaluator alone, for comparing it with another on the same matrix.
    /// Columns `p_long` and, with `lifetime`, `expected_lifetime_s`.
    #[pyo3(signature = (width, data, lifetime=true))]
    fn predict_encoded<'py>(
        &self,
        py: Python<'py>,
        width: usize,
        data: &[u8],
        lifetime: bool,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        if width != self.model.schema().len() || data.len() % (8 * width) != 0 {
            return Err(Raised::input(
                "matrix",
                format!("the matrix is not rows of {} float64s (the bundle's features)", self.model.schema().len()),
                "pass Model.encode()'s matrix",
            )
            .into());
        }
        let values: Vec<f64> = data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        let out = py.detach(|| -> Result<Vec<OutColumn>, Raised> {
            let parts = parallel(values.len() / width, |range| {
                Ok(self.evaluate(&values[range.start * width..range.end * width], lifetime, false))
            })?;
            let mut predictions = Predictions::default();
            for part in parts {
                predictions.append(part);
            }
            let mut columns = vec![OutColumn::float("p_long", predictions.p_long)];
            if lifetime {
                columns.push(OutColumn::float("expected_lifetime_s", predictions.lifetime));
            }
            Ok(columns)
        })?;
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
            let remaining = parallel(table.rows(), |range| {
                let records = table.records_in(range.clone())?;
                records
                    .iter()
                    .zip(&uptime_s[range])
                    .map(|(record, uptime)| Ok(self.model.predict_remaining(&features(record)?, *uptime)))
                    .collect::<Result<Vec<f64>, Raised>>()
            })?
            .concat();
            Ok(vec![OutColumn::float("remaining_lifetime_s", remaining)])
        })?;
        columns::to_python(py, out)
    }
}

impl Model {
    /// The encoded base rows of the frame's rows `range`, row-major, as the inference server
    /// encodes the same VMs (each with its tenant's and job's past in the bundle's feature store).
    ///
    /// A row's features are its request's ([`features`]), and they depend on the row's time
    /// (`start_s`) and on nothing else that differs between rows of the same tenant, type, sizes,
    /// priority and extra values: rows alike in those share one request's features and its
    /// histories' look-up, built for the first of them, and each row is encoded with its own time
    /// (its hour, weekday and past as of then). Every row is checked, as [`Table::records_in`]
    /// checks it.
    fn encode_rows(&self, table: &Table, range: Range<usize>) -> Result<Vec<f64>, Raised> {
        let columns = table.trace_columns()?;
        let (encoder, store) = (self.model.encoder(), self.model.feature_store());
        let mut encoded = Vec::with_capacity(range.len() * self.model.schema().len());
        let mut alike: HashMap<Vec<u8>, (RequestFeatures, PastHistories<'_>), BuildHasherDefault<KeyHasher>> =
            HashMap::with_capacity_and_hasher(range.len() / 4, BuildHasherDefault::default());
        let (mut key, mut extra) = (Vec::new(), Vec::new());
        for row in range.filter(|&row| row < table.rows()) {
            let text = columns.row(row, &mut extra)?;
            key.clear();
            for part in [text.tenant_id, text.vm_type, text.priority.as_str()].into_iter().chain(extra.iter().copied())
            {
                key.extend_from_slice(&part.len().to_le_bytes());
                key.extend_from_slice(part.as_bytes());
            }
            key.extend_from_slice(&text.cores.to_bits().to_le_bytes());
            key.extend_from_slice(&text.memory_gib.to_bits().to_le_bytes());
            let (features, histories) = match alike.get_mut(&key) {
                Some(entry) => entry,
                None => {
                    let features = features(&text.to_record(&columns.names, extra.iter().copied()))?;
                    let histories = store.histories(&features.tenant_id, &features.vm_type);
                    alike.entry(key.clone()).or_insert((features, histories))
                }
            };
            features.time_s = text.start_s;
            encoder.encode_into(features, &self.model.past_from(histories, features), None, &mut encoded);
        }
        Ok(encoded)
    }

    /// The predictions of encoded base rows: only the models asked for are evaluated.
    fn evaluate(&self, encoded: &[f64], lifetime: bool, interval: bool) -> Predictions {
        let width = self.model.schema().len();
        let rows = encoded.len() / width;
        let mut p_long = vec![0.0; rows];
        self.model.p_long_rows(encoded, &mut p_long);
        let lifetime = if lifetime {
            let mut out = vec![0.0; rows];
            self.model.expected_lifetime_rows(encoded, &mut out);
            out
        } else {
            Vec::new()
        };
        let interval = if interval {
            encoded.chunks_exact(width).map(|row| f64::from(self.model.interval_class(row))).collect()
        } else {
            Vec::new()
        };
        Predictions { p_long, lifetime, interval }
    }
}

/// Predicted columns of some rows (empty when not asked for).
#[derive(Default)]
struct Predictions {
    p_long: Vec<f64>,
    lifetime: Vec<f64>,
    interval: Vec<f64>,
}

impl Predictions {
    fn append(&mut self, mut other: Predictions) {
        self.p_long.append(&mut other.p_long);
        self.lifetime.append(&mut other.lifetime);
        self.interval.append(&mut other.interval);
    }
}
