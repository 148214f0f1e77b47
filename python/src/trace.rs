//! Traces from Python, through the functions `vmtrace` runs: reading any source into columns,
//! writing records back as the project's CSV, statistics, and the synthetic generator.

use crate::columns::{self, RecordColumns, Table};
use crate::errors::Raised;
use crate::readahead::ReadAhead;
use flate2::read::MultiGzDecoder;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use traces::azure_sqlite::MachineType;
use traces::csv_chunks::read_parallel;
use traces::csv_format::{CsvTraceReader, CsvTraceWriter};
use traces::synthetic::{generate, SyntheticConfig};
use traces::{TraceError, TraceSource, TraceStatsBuilder, VmRecord};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(write_trace, m)?)?;
    m.add_function(wrap_pyfunction!(trace_stats, m)?)?;
    m.add_function(wrap_pyfunction!(frame_stats, m)?)?;
    m.add_function(wrap_pyfunction!(generate_trace, m)?)?;
    Ok(())
}

/// `(machine_id, cores, memory_gib)` of an Azure sqlite trace, checked as `vmtrace` checks its flags.
fn machine(machine: Option<(i64, f64, f64)>) -> Result<Option<MachineType>, Raised> {
    let Some((machine_id, cores, memory_gib)) = machine else { return Ok(None) };
    for (field, value) in [("machine.cores", cores), ("machine.memory_gib", memory_gib)] {
        if !(value.is_finite() && value > 0.0) {
            return Err(Raised::input(
                field,
                format!("{field} must be a positive number, got {value}"),
                "give the machine type's size",
            ));
        }
    }
    Ok(Some(MachineType { machine_id, cores, memory_gib, ssd_gib: 0.0 }))
}

/// Every record of a trace file, each handed to `each`; returns how many the source skipped on
/// purpose (sqlite VMs the machine cannot host). A `.csv.gz` file is decompressed ahead of the
/// parser ([`ReadAhead`]).
pub fn for_each_record(
    path: &Path,
    machine: Option<MachineType>,
    mut each: impl FnMut(VmRecord),
) -> Result<u64, Raised> {
    let source = TraceSource::from_path(path, machine).map_err(|e| Raised::from(&e))?;
    if let TraceSource::Csv(file) = &source {
        let gzip = file.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("gz"));
        let ahead = if gzip {
            ReadAhead::gzip(file).map_err(|e| Raised::from(&TraceError::Io { path: file.clone(), source: e }))?
        } else {
            None
        };
        if let Some(ahead) = ahead {
            for record in CsvTraceReader::from_reader(ahead).map_err(|e| Raised::from(&e))? {
                each(record.map_err(|e| Raised::from(&e))?);
            }
            return Ok(0);
        }
    }
    let mut reader = source.open().map_err(|e| Raised::from(&e))?;
    for record in reader.by_ref() {
        each(record.map_err(|e| Raised::from(&e))?);
    }
    Ok(reader.skipped())
}

/// Every record of a trace file.
pub fn read_records(path: &Path, machine: Option<MachineType>) -> Result<Vec<VmRecord>, Raised> {
    let mut records = Vec::new();
    for_each_record(path, machine, |record| records.push(record))?;
    Ok(records)
}

/// The columns of a CSV trace (`.csv` or `.csv.gz`), its rows parsed on every core while this
/// thread reads and decompresses the file (`traces::csv_chunks`: the checks and errors of the
/// sequential reader), one part per block of the file, in order; `None` for another kind of trace.
fn read_csv_columns(path: &Path) -> Result<Option<Vec<RecordColumns>>, Raised> {
    let source = TraceSource::from_path(path, None).map_err(|e| Raised::from(&e))?;
    let TraceSource::Csv(file) = &source else { return Ok(None) };
    let io_error = |e| Raised::from(&TraceError::Io { path: file.clone(), source: e });
    let input = File::open(file).map_err(io_error)?;
    let input: Box<dyn Read> = if file.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("gz")) {
        Box::new(MultiGzDecoder::new(BufReader::with_capacity(1 << 16, input)))
    } else {
        Box::new(input)
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parsed =
        read_parallel(input, threads, |names| RecordColumns::with_extra_names(names)).map_err(|e| Raised::from(&e))?;
    if parsed.parts.is_empty() {
        return Ok(Some(vec![RecordColumns::with_extra_names(&parsed.extra_names)]));
    }
    Ok(Some(parsed.parts))
}

/// Reads a trace file (`.csv`, `.csv.gz`, or an Azure `.sqlite`/`.db` with `machine`) into columns;
/// returns `(rows, columns, skipped)`.
#[pyfunction]
#[pyo3(signature = (path, machine=None))]
fn read_trace<'py>(
    py: Python<'py>,
    path: PathBuf,
    machine: Option<(i64, f64, f64)>,
) -> PyResult<(usize, Vec<Bound<'py, PyTuple>>, u64)> {
    let machine = self::machine(machine)?;
    let (rows, parts, skipped) = py.detach(|| {
        if let Some(parts) = read_csv_columns(&path)? {
            let rows = parts.iter().map(RecordColumns::len).sum();
            return Ok::<_, Raised>((rows, parts.into_iter().map(RecordColumns::finish).collect(), 0));
        }
        let mut columns = RecordColumns::new();
        let skipped = for_each_record(&path, machine, |record| columns.push(&record))?;
        Ok::<_, Raised>((columns.len(), vec![columns.finish()], skipped))
    })?;
    Ok((rows, columns::parts_to_python(py, parts)?, skipped))
}

/// Writes a frame's columns as the project's CSV (`.gz` compresses); returns the rows written.
#[pyfunction]
fn write_trace(py: Python<'_>, path: PathBuf, rows: usize, columns: &Bound<'_, PyAny>) -> PyResult<usize> {
    let table = Table::extract(rows, columns)?;
    py.detach(|| -> Result<usize, Raised> {
        let records = table.records()?;
        let names = records.first().map(|r| r.extra.names().to_vec()).unwrap_or_default();
        let mut writer = CsvTraceWriter::create(&path, &names).map_err(|e| Raised::from(&e))?;
        for record in &records {
            writer.write(record).map_err(|e| Raised::from(&e))?;
        }
        writer.finish().map_err(|e| Raised::from(&e))?;
        Ok(records.len())
    })
    .map_err(Into::into)
}

fn stats_json(records: &[VmRecord], trace_end_s: Option<f64>) -> Result<String, Raised> {
    if let Some(end) = trace_end_s.filter(|end| !end.is_finite()) {
        return Err(Raised::input(
            "trace_end_s",
            format!("trace_end_s must be finite, got {end}"),
            "give the trace's censoring time in seconds, or None",
        ));
    }
    let mut stats = TraceStatsBuilder::new().with_trace_end(trace_end_s);
    for record in records {
        stats.push(record);
    }
    serde_json::to_string(&stats.finish()).map_err(|e| Raised::other(e.to_string()))
}

/// `vmtrace stats --json` of a trace file.
#[pyfunction]
#[pyo3(signature = (path, machine=None, trace_end_s=None))]
fn trace_stats(
    py: Python<'_>,
    path: PathBuf,
    machine: Option<(i64, f64, f64)>,
    trace_end_s: Option<f64>,
) -> PyResult<String> {
    let machine = self::machine(machine)?;
    py.detach(|| stats_json(&read_records(&path, machine)?, trace_end_s)).map_err(Into::into)
}

/// The same statistics of a frame's rows.
#[pyfunction]
#[pyo3(signature = (rows, columns, trace_end_s=None))]
fn frame_stats(py: Python<'_>, rows: usize, columns: &Bound<'_, PyAny>, trace_end_s: Option<f64>) -> PyResult<String> {
    let table = Table::extract(rows, columns)?;
    py.detach(|| stats_json(&table.records()?, trace_end_s)).map_err(Into::into)
}

/// `vmtrace generate`, into columns: the seeded synthetic trace.
#[pyfunction]
#[pyo3(signature = (seed=42, days=7.0, warmup_days=2.0, requests_per_hour=400.0, tenants=1500, censor=true))]
fn generate_trace<'py>(
    py: Python<'py>,
    seed: u64,
    days: f64,
    warmup_days: f64,
    requests_per_hour: f64,
    tenants: usize,
    censor: bool,
) -> PyResult<(usize, Vec<Bound<'py, PyTuple>>)> {
    let config = SyntheticConfig { seed, span_days: days, warmup_days, requests_per_hour, tenants, censor };
    config.validate().map_err(|e| Raised::input(e.field, e.to_string(), format!("change `{}`", e.field)))?;
    let (rows, columns) = py.detach(|| {
        let records = generate(&config);
        (records.len(), columns::from_records(&records))
    });
    Ok((rows, columns::to_python(py, columns)?))
}
