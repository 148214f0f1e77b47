//! The placements and exits a store holds, exported as a trace in the project's CSV format
//! (`docs/trace-format.md`), for retraining on the system's own history (issue 18).
//!
//! One row per VM that started in a window `[from_s, to_s)` on the model's clock (its
//! `requested_at_s`, else its placement time), in start order: the VMs still running without an
//! `end_s` (censored), the VMs that exited ([`placement::Change::Released`], kept in the store's
//! exits table) with theirs; then its priority, its OS in an `os` column and each request feature
//! in a column of its name, empty for VMs without it. Each backend reads both tables in one
//! snapshot on a connection of its own (never the worker's), and [`merge`] interleaves them by
//! start; a header comes first ([`ExportSink::header`]: the row count and the columns), then the
//! rows, at most [`ExportWindow::max_rows`] of them, so memory stays bounded however large the
//! window. [`TraceExport`] writes them with the `traces` crate's own CSV writer.

use super::StoreError;
use domain::RequestDetails;
use placement::state::NewVm;
use std::collections::BTreeSet;
use std::io::Write;
use std::sync::Arc;
use traces::csv_format::{CsvTraceWriter, REQUIRED_COLUMNS};
use traces::{ExtraColumns, TraceError, VmRecord};

/// Most feature columns an export writes; a window whose VMs carry more distinct feature names is
/// refused ([`ExportError::TooManyFeatures`]).
pub const MAX_FEATURE_COLUMNS: usize = 1024;

/// Default of [`ExportWindow::max_rows`].
pub const DEFAULT_MAX_ROWS: u64 = 1_000_000;

/// Which VMs an export holds: those that started in `[from_s, to_s)` on the model's clock, the
/// earliest `max_rows`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExportWindow {
    pub from_s: f64,
    pub to_s: f64,
    pub max_rows: u64,
}

impl Default for ExportWindow {
    /// Everything, up to [`DEFAULT_MAX_ROWS`].
    fn default() -> Self {
        ExportWindow { from_s: f64::NEG_INFINITY, to_s: f64::INFINITY, max_rows: DEFAULT_MAX_ROWS }
    }
}

/// What an export knows before its rows.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportHeader {
    /// The VMs of the window, before the `max_rows` cap.
    pub rows_in_window: u64,
    /// The rows the export writes: `rows_in_window` capped at `max_rows`.
    pub rows: u64,
    /// The columns after the trace format's eight: the request details some VM has (`os`, ...:
    /// [`RequestDetails::names`] but priority, which is a column of the eight, and the features),
    /// then the request features by name (a feature named like one of the eight columns or a
    /// detail is left out).
    pub extra_columns: Vec<String>,
}

impl ExportHeader {
    /// The header of `rows_in_window` VMs whose stored details hold these names (`details`: the
    /// keys of their JSON, repeated or not), with these feature names.
    pub fn new(
        window: &ExportWindow,
        rows_in_window: u64,
        details: impl IntoIterator<Item = String>,
        features: impl IntoIterator<Item = String>,
    ) -> Result<Self, ExportError> {
        let present: BTreeSet<String> = details.into_iter().collect();
        let detail_columns = RequestDetails::names()
            .iter()
            .filter(|name| !NOT_DETAIL_COLUMNS.contains(name) && present.contains(**name))
            .map(|name| (*name).to_owned());
        let features: BTreeSet<String> = features
            .into_iter()
            .filter(|name| {
                !RequestDetails::names().contains(&name.as_str()) && !REQUIRED_COLUMNS.contains(&name.as_str())
            })
            .collect();
        if features.len() > MAX_FEATURE_COLUMNS {
            return Err(ExportError::TooManyFeatures { limit: MAX_FEATURE_COLUMNS });
        }
        let extra_columns = detail_columns.chain(features).collect();
        Ok(ExportHeader { rows_in_window, rows: rows_in_window.min(window.max_rows), extra_columns })
    }
}

/// The details that are not columns of their own: priority is one of the eight, the features are
/// a column each.
const NOT_DETAIL_COLUMNS: [&str; 2] = ["priority", "features"];

/// One VM of an export.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportedVm {
    /// When it started on the model's clock: its `requested_at_s`, else its placement time.
    pub start_s: f64,
    /// Its place in placement order (ties of `start_s` are broken by it).
    pub seq: i64,
    pub vm: NewVm,
    /// When it ended on the model's clock; none: still running.
    pub ended_at_s: Option<f64>,
}

impl ExportedVm {
    /// The VM as a trace record with the header's `extra_columns` (shared by every record); the
    /// inverse of [`VmRecord::to_request`]. An end named before the start reads as the start.
    pub fn record(&self, extra_columns: &Arc<[String]>) -> VmRecord {
        let details = &self.vm.facts.details;
        let mut detail_columns = None;
        let values = extra_columns
            .iter()
            .map(|column| match RequestDetails::names().contains(&column.as_str()) {
                true => detail_columns.get_or_insert_with(|| details.columns()).remove(column).unwrap_or_default(),
                false => details.features.get(column).map(ToString::to_string).unwrap_or_default(),
            })
            .collect();
        VmRecord {
            vm_id: self.vm.id.as_str().to_owned(),
            tenant_id: self.vm.facts.tenant_id.as_str().to_owned(),
            vm_type: self.vm.facts.vm_type.clone(),
            cores: self.vm.facts.demand.cores(),
            memory_gib: self.vm.facts.demand.memory_gib(),
            priority: details.priority,
            start_s: self.start_s,
            end_s: self.ended_at_s.map(|end| end.max(self.start_s)),
            extra: ExtraColumns::new(Arc::clone(extra_columns), values),
        }
    }
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the window's VMs carry more than {limit} distinct feature names; export a shorter window")]
    TooManyFeatures { limit: usize },
    /// Writing the export failed (the client went away, say).
    #[error("writing the export: {0}")]
    Write(#[from] TraceError),
}

/// Where an export goes: its header once, then its rows in order.
pub trait ExportSink {
    fn header(&mut self, header: &ExportHeader) -> Result<(), ExportError>;
    fn row(&mut self, vm: &ExportedVm) -> Result<(), ExportError>;
}

/// Writes the running VMs and the exited ones, each in (start, seq) order, as one sequence in that
/// order, at most `max_rows`.
pub(crate) fn merge(
    running: impl Iterator<Item = Result<ExportedVm, ExportError>>,
    exited: impl Iterator<Item = Result<ExportedVm, ExportError>>,
    max_rows: u64,
    sink: &mut dyn ExportSink,
) -> Result<u64, ExportError> {
    let (mut running, mut exited) = (running.peekable(), exited.peekable());
    let mut written = 0;
    while written < max_rows {
        let take_running = match (running.peek(), exited.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            // An error comes out first.
            (Some(Err(_)), _) => true,
            (_, Some(Err(_))) => false,
            (Some(Ok(a)), Some(Ok(b))) => (a.start_s, a.seq) <= (b.start_s, b.seq),
        };
        let next = if take_running { running.next() } else { exited.next() };
        if let Some(vm) = next {
            sink.row(&vm?)?;
            written += 1;
        }
    }
    Ok(written)
}

/// An [`ExportSink`] writing the project's CSV trace format to `output`, with the `traces` crate's
/// writer (uncompressed).
pub struct TraceExport<W> {
    output: Option<W>,
    writer: Option<CsvTraceWriter>,
    extra_columns: Arc<[String]>,
}

impl<W: Write + Send + 'static> TraceExport<W> {
    pub fn new(output: W) -> Self {
        TraceExport { output: Some(output), writer: None, extra_columns: Arc::from(Vec::new()) }
    }

    /// Flushes what is written.
    pub fn finish(self) -> Result<(), ExportError> {
        match self.writer {
            Some(writer) => writer.finish().map_err(ExportError::Write),
            None => Ok(()),
        }
    }
}

impl<W: Write + Send + 'static> ExportSink for TraceExport<W> {
    fn header(&mut self, header: &ExportHeader) -> Result<(), ExportError> {
        let output = self.output.take().ok_or_else(|| misuse("the header was written already"))?;
        self.writer = Some(CsvTraceWriter::to_writer(output, &header.extra_columns, "export")?);
        self.extra_columns = Arc::from(header.extra_columns.clone());
        Ok(())
    }

    fn row(&mut self, vm: &ExportedVm) -> Result<(), ExportError> {
        let writer = self.writer.as_mut().ok_or_else(|| misuse("a row before the header"))?;
        writer.write(&vm.record(&self.extra_columns))?;
        Ok(())
    }
}

fn misuse(what: &str) -> ExportError {
    ExportError::Write(TraceError::Io { path: "export".into(), source: std::io::Error::other(what.to_owned()) })
}
