//! Data frames in and out as Arrow-shaped column buffers, and the trace records they hold.
//!
//! A column crosses as a tuple: `(name, "f64", validity, values)` (little-endian `f64`s, `validity`
//! an Arrow bitmap or `None`) or `(name, "str", offsets, data)` (Arrow `large_string`: `n + 1`
//! little-endian `i64` offsets into UTF-8 bytes). Python builds pyarrow arrays over the bytes handed
//! back without copying them, and hands columns in the same shape (`lifetime_alloc._frames`), so
//! no Arrow crate is linked and no Python object is made per value.

use crate::errors::Raised;
use domain::Priority;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::sync::Arc;
use traces::csv_chunks::RowSink;
use traces::csv_format::{CsvRow, REQUIRED_COLUMNS};
use traces::record::BorrowedRecord;
use traces::VmRecord;

/// A column built in Rust, on its way to Python.
pub enum OutColumn {
    Float { name: String, values: Vec<f64>, valid: Option<Vec<bool>> },
    Text { name: String, offsets: Vec<i64>, data: Vec<u8> },
}

impl OutColumn {
    pub fn float(name: &str, values: Vec<f64>) -> Self {
        OutColumn::Float { name: name.to_owned(), values, valid: None }
    }

    pub fn text(name: &str) -> Self {
        OutColumn::Text { name: name.to_owned(), offsets: vec![0], data: Vec::new() }
    }

    pub fn push_str(&mut self, value: &str) {
        if let OutColumn::Text { offsets, data, .. } = self {
            data.extend_from_slice(value.as_bytes());
            // Offsets are i64: a column of more than 2^63 bytes cannot be built in memory anyway.
            offsets.push(data.len() as i64);
        }
    }

    fn name(&self) -> &str {
        match self {
            OutColumn::Float { name, .. } | OutColumn::Text { name, .. } => name,
        }
    }

    fn rows(&self) -> usize {
        match self {
            OutColumn::Float { values, .. } => values.len(),
            OutColumn::Text { offsets, .. } => offsets.len().saturating_sub(1),
        }
    }
}

/// One column made of `parts` (the same column of consecutive row ranges, in order), as the tuple
/// Python reads: the parts are copied once, straight into the Python bytes objects.
fn column_into_py<'py>(py: Python<'py>, parts: Vec<OutColumn>) -> PyResult<Bound<'py, PyTuple>> {
    let rows: usize = parts.iter().map(OutColumn::rows).sum();
    let name = parts.first().map_or("", OutColumn::name).into_pyobject(py)?.into_any();
    if parts.iter().any(|part| matches!(part, OutColumn::Text { .. })) {
        let data_len: usize =
            parts.iter().map(|part| if let OutColumn::Text { data, .. } = part { data.len() } else { 0 }).sum();
        let offsets = PyBytes::new_with(py, (rows + 1) * 8, |out| {
            let mut out = out.chunks_exact_mut(8);
            if let Some(first) = out.next() {
                first.copy_from_slice(&0i64.to_le_bytes());
            }
            let mut base = 0i64;
            for part in &parts {
                if let OutColumn::Text { offsets, data, .. } = part {
                    for (offset, slot) in offsets.iter().skip(1).zip(&mut out) {
                        slot.copy_from_slice(&(offset + base).to_le_bytes());
                    }
                    // Offsets are i64: a column of more than 2^63 bytes cannot be built in memory anyway.
                    base += data.len() as i64;
                }
            }
            Ok(())
        })?;
        let data = PyBytes::new_with(py, data_len, |out| {
            let mut at = 0;
            for part in &parts {
                if let OutColumn::Text { data, .. } = part {
                    out[at..at + data.len()].copy_from_slice(data);
                    at += data.len();
                }
            }
            Ok(())
        })?;
        return PyTuple::new(py, [name, "str".into_pyobject(py)?.into_any(), offsets.into_any(), data.into_any()]);
    }
    let with_validity = parts.iter().any(|part| matches!(part, OutColumn::Float { valid: Some(_), .. }));
    let bitmap = if with_validity {
        PyBytes::new_with(py, rows.div_ceil(8), |bits| {
            let mut row = 0;
            for part in &parts {
                if let OutColumn::Float { values, valid, .. } = part {
                    for i in 0..values.len() {
                        let ok = valid.as_ref().is_none_or(|valid| valid.get(i).copied().unwrap_or(true));
                        bits[row / 8] |= u8::from(ok) << (row % 8);
                        row += 1;
                    }
                }
            }
            Ok(())
        })?
        .into_any()
    } else {
        py.None().into_bound(py)
    };
    let values = PyBytes::new_with(py, rows * 8, |out| {
        let mut out = out.chunks_exact_mut(8);
        for part in &parts {
            if let OutColumn::Float { values, .. } = part {
                for (value, slot) in values.iter().zip(&mut out) {
                    slot.copy_from_slice(&value.to_le_bytes());
                }
            }
        }
        Ok(())
    })?;
    PyTuple::new(py, [name, "f64".into_pyobject(py)?.into_any(), bitmap, values.into_any()])
}

/// Columns as the list of tuples Python turns into a table.
pub fn to_python<'py>(py: Python<'py>, columns: Vec<OutColumn>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    columns.into_iter().map(|column| column_into_py(py, vec![column])).collect()
}

/// The columns of consecutive row ranges (each part the same columns, in the same order), joined
/// as [`to_python`]'s: each value is copied once, into the Python bytes.
pub fn parts_to_python<'py>(py: Python<'py>, parts: Vec<Vec<OutColumn>>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let width = parts.first().map_or(0, Vec::len);
    let mut by_column: Vec<Vec<OutColumn>> = (0..width).map(|_| Vec::with_capacity(parts.len())).collect();
    for part in parts {
        for (column, values) in by_column.iter_mut().zip(part) {
            column.push(values);
        }
    }
    by_column.into_iter().map(|column| column_into_py(py, column)).collect()
}

/// The columns of a trace's records, in the project's CSV column order, extra columns after, built
/// one record at a time (a trace is read straight into them, never held as records).
pub struct RecordColumns {
    extra_names: Option<Vec<String>>,
    text: [OutColumn; 4],
    extra: Vec<OutColumn>,
    numbers: [Vec<f64>; 4],
    end_valid: Vec<bool>,
}

impl RecordColumns {
    pub fn new() -> Self {
        RecordColumns {
            extra_names: None,
            text: ["vm_id", "tenant_id", "vm_type", "priority"].map(OutColumn::text),
            extra: Vec::new(),
            numbers: Default::default(),
            end_valid: Vec::new(),
        }
    }

    pub fn push(&mut self, record: &VmRecord) {
        self.push_required(&record.borrowed());
        // The first record names the extra columns (a trace's records all share them).
        let names = self.extra_names.get_or_insert_with(|| {
            self.extra = record.extra.names().iter().map(|name| OutColumn::text(name)).collect();
            record.extra.names().to_vec()
        });
        let same = record.extra.names() == names.as_slice();
        for (i, column) in self.extra.iter_mut().enumerate() {
            let value = if same { Some(record.extra.values()[i].as_str()) } else { record.extra.get(&names[i]) };
            column.push_str(value.unwrap_or_default());
        }
    }

    /// The required columns' values of one row (a record's or a CSV row's).
    fn push_required(&mut self, row: &BorrowedRecord<'_>) {
        let [vm_id, tenant_id, vm_type, priority] = &mut self.text;
        vm_id.push_str(row.vm_id);
        tenant_id.push_str(row.tenant_id);
        vm_type.push_str(row.vm_type);
        priority.push_str(row.priority.as_str());
        let [cores, memory, start, end] = &mut self.numbers;
        cores.push(row.cores);
        memory.push(row.memory_gib);
        start.push(row.start_s);
        end.push(row.end_s.unwrap_or(f64::NAN));
        self.end_valid.push(row.end_s.is_some());
    }

    /// Columns for the rows of a CSV trace whose extra columns are `names` (in file order).
    pub fn with_extra_names(names: &[String]) -> Self {
        let mut columns = RecordColumns::new();
        columns.extra = names.iter().map(|name| OutColumn::text(name)).collect();
        columns.extra_names = Some(names.to_vec());
        columns
    }

    /// Records pushed so far.
    pub fn len(&self) -> usize {
        self.end_valid.len()
    }

    pub fn finish(self) -> Vec<OutColumn> {
        let [vm_id, tenant_id, vm_type, priority] = self.text;
        let [cores, memory, start, end] = self.numbers;
        let mut columns = vec![
            vm_id,
            tenant_id,
            vm_type,
            OutColumn::float("cores", cores),
            OutColumn::float("memory_gib", memory),
            priority,
            OutColumn::float("start_s", start),
            OutColumn::Float { name: "end_s".to_owned(), values: end, valid: Some(self.end_valid) },
        ];
        columns.extend(self.extra);
        columns
    }
}

impl RowSink for RecordColumns {
    fn reserve(&mut self, rows: usize, _bytes: usize) {
        for column in self.text.iter_mut().chain(&mut self.extra) {
            if let OutColumn::Text { offsets, .. } = column {
                offsets.reserve(rows);
            }
        }
        for column in &mut self.numbers {
            column.reserve(rows);
        }
        self.end_valid.reserve(rows);
    }

    /// A checked row of a CSV trace, straight into the columns: no record, no string of its own.
    fn push(&mut self, row: &CsvRow<'_>) {
        self.push_required(&row.record);
        for (column, value) in self.extra.iter_mut().zip(row.extra()) {
            column.push_str(&value);
        }
    }
}

impl Default for RecordColumns {
    fn default() -> Self {
        Self::new()
    }
}

/// The columns of `records` ([`RecordColumns`]).
pub fn from_records(records: &[VmRecord]) -> Vec<OutColumn> {
    let mut columns = RecordColumns::new();
    for record in records {
        columns.push(record);
    }
    columns.finish()
}

/// A column handed in by Python.
enum InColumn {
    Float(Vec<f64>),
    Text { offsets: Vec<i64>, data: TextData },
}

/// The bytes of a text column: checked for UTF-8 once, as a whole, when they are.
enum TextData {
    Utf8(String),
    Bytes(Vec<u8>),
}

impl TextData {
    fn new(bytes: Vec<u8>) -> Self {
        String::from_utf8(bytes).map_or_else(|error| TextData::Bytes(error.into_bytes()), TextData::Utf8)
    }
}

impl InColumn {
    /// The value of row `row`: `Ok` its text, `Err` its bytes when they are not UTF-8; `None` for
    /// offsets outside the data (or a column of numbers).
    fn text(&self, row: usize) -> Option<Result<&str, &[u8]>> {
        let InColumn::Text { offsets, data } = self else { return None };
        let (start, end) = (*offsets.get(row)?, *offsets.get(row + 1)?);
        let range = usize::try_from(start).ok()?..usize::try_from(end).ok()?;
        match data {
            // A range of valid text is text unless it cuts a character: then its bytes are not.
            TextData::Utf8(text) => match text.get(range.clone()) {
                Some(text) => Some(Ok(text)),
                None => text.as_bytes().get(range).map(Err),
            },
            TextData::Bytes(bytes) => {
                let bytes = bytes.get(range)?;
                Some(std::str::from_utf8(bytes).map_err(|_| bytes))
            }
        }
    }
}

/// A data frame handed in by Python: named columns of one length.
pub struct Table {
    rows: usize,
    columns: Vec<(String, InColumn)>,
}

fn bad_column(name: &str, message: &str) -> Raised {
    Raised::input(
        name,
        format!("column `{name}`: {message}"),
        "pass the frame through lifetime_alloc's own functions, which convert its columns",
    )
}

impl Table {
    /// Reads the tuples `lifetime_alloc._frames.to_native` makes; `rows` is the frame's length.
    pub fn extract(rows: usize, columns: &Bound<'_, PyAny>) -> Result<Table, PyErr> {
        let mut out = Vec::new();
        for item in columns.try_iter()? {
            let item = item?;
            let (name, kind, first, second): (String, String, Bound<'_, PyAny>, Bound<'_, PyAny>) = item.extract()?;
            let column = match kind.as_str() {
                "f64" => {
                    let bytes: &[u8] = second.cast::<PyBytes>()?.as_bytes();
                    let values: Vec<f64> = bytes
                        .chunks_exact(8)
                        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                        .collect();
                    if values.len() != rows {
                        return Err(
                            bad_column(&name, "holds a different number of values than the frame has rows").into()
                        );
                    }
                    InColumn::Float(values)
                }
                "str" => {
                    let offsets: Vec<i64> = first
                        .cast::<PyBytes>()?
                        .as_bytes()
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                        .collect();
                    if offsets.len() != rows + 1 {
                        return Err(
                            bad_column(&name, "holds a different number of values than the frame has rows").into()
                        );
                    }
                    InColumn::Text { offsets, data: TextData::new(second.cast::<PyBytes>()?.as_bytes().to_vec()) }
                }
                _ => return Err(bad_column(&name, "is neither numbers nor text").into()),
            };
            out.push((name, column));
        }
        Ok(Table { rows, columns: out })
    }

    fn column(&self, name: &str) -> Result<&InColumn, Raised> {
        self.columns.iter().find(|(n, _)| n == name).map(|(_, c)| c).ok_or_else(|| {
            Raised::input(
                name,
                format!("the frame has no column `{name}`"),
                format!("add the column `{name}`: a trace has at least {}", REQUIRED_COLUMNS.join(",")),
            )
        })
    }

    /// The frame's rows as trace records, each checked as the CSV reader checks a row
    /// ([`VmRecord::check`]); `end_s` NaN means still running, empty `priority` is regular.
    pub fn records(&self) -> Result<Vec<VmRecord>, Raised> {
        self.records_in(0..self.rows)
    }

    /// Rows; every frame has this many.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The rows `range` of the frame as trace records, checked as [`Table::records`] checks them
    /// (errors name the row's index in the whole frame): threads each take a range.
    pub fn records_in(&self, range: std::ops::Range<usize>) -> Result<Vec<VmRecord>, Raised> {
        let columns = self.trace_columns()?;
        let mut extra = Vec::new();
        let mut records = Vec::with_capacity(range.len());
        for row in range.filter(|&row| row < self.rows) {
            records.push(columns.row(row, &mut extra)?.to_record(&columns.names, extra.iter().copied()));
        }
        Ok(records)
    }

    /// The frame's trace columns, each checked for its kind: rows are read from them in place.
    pub fn trace_columns(&self) -> Result<TraceColumns<'_>, Raised> {
        let text = |name: &'static str| -> Result<&InColumn, Raised> {
            match self.column(name)? {
                column @ InColumn::Text { .. } => Ok(column),
                InColumn::Float(_) => Err(Raised::input(
                    name,
                    format!("column `{name}` holds numbers, not text"),
                    format!("give `{name}` as text (df[\"{name}\"] = df[\"{name}\"].astype(str))"),
                )),
            }
        };
        let number = |name: &'static str| -> Result<&[f64], Raised> {
            match self.column(name)? {
                InColumn::Float(values) => Ok(values),
                InColumn::Text { .. } => Err(Raised::input(
                    name,
                    format!("column `{name}` holds text, not numbers"),
                    format!("give `{name}` as numbers (pd.to_numeric(df[\"{name}\"]))"),
                )),
            }
        };
        let (vm_id, tenant_id, vm_type, priority) =
            (text("vm_id")?, text("tenant_id")?, text("vm_type")?, text("priority")?);
        let (cores, memory, start, end) =
            (number("cores")?, number("memory_gib")?, number("start_s")?, number("end_s")?);
        let extra: Vec<(&String, &InColumn)> = self
            .columns
            .iter()
            .filter(|(name, _)| !REQUIRED_COLUMNS.contains(&name.as_str()))
            .map(|(name, column)| (name, column))
            .collect();
        for (name, column) in &extra {
            if let InColumn::Float(_) = column {
                return Err(bad_column(name, "an extra column must be handed in as text"));
            }
        }
        let names: Arc<[String]> = extra.iter().map(|(name, _)| (*name).clone()).collect();
        Ok(TraceColumns { vm_id, tenant_id, vm_type, priority, cores, memory, start, end, extra, names })
    }
}

/// The trace columns of a frame ([`Table::trace_columns`]).
pub struct TraceColumns<'t> {
    vm_id: &'t InColumn,
    tenant_id: &'t InColumn,
    vm_type: &'t InColumn,
    priority: &'t InColumn,
    cores: &'t [f64],
    memory: &'t [f64],
    start: &'t [f64],
    end: &'t [f64],
    extra: Vec<(&'t String, &'t InColumn)>,
    /// The extra columns' names, in the frame's order.
    pub names: Arc<[String]>,
}

impl<'t> TraceColumns<'t> {
    /// Row `row` (< the frame's rows), checked as the CSV reader checks a row
    /// ([`BorrowedRecord::check`]); its extra values into `extra`, in [`TraceColumns::names`]'
    /// order. `end_s` NaN means still running, empty `priority` is regular. Errors name the row.
    pub fn row(&self, row: usize, extra: &mut Vec<&'t str>) -> Result<BorrowedRecord<'t>, Raised> {
        let get = |column: &'t InColumn, name: &str| -> Result<&'t str, Raised> {
            let text = column.text(row).ok_or_else(|| bad_column(name, "has offsets outside its data"))?;
            text.map_err(|_| bad_column(name, &format!("row {row} is not UTF-8")))
        };
        let priority = match get(self.priority, "priority")? {
            "" => Priority::Regular,
            text => text.parse().map_err(|message: String| {
                Raised::input("priority", format!("row {row}: {message}"), "write `regular`, `low` or leave it empty")
            })?,
        };
        extra.clear();
        for (name, column) in &self.extra {
            extra.push(get(column, name)?);
        }
        let text = BorrowedRecord {
            vm_id: get(self.vm_id, "vm_id")?,
            tenant_id: get(self.tenant_id, "tenant_id")?,
            vm_type: get(self.vm_type, "vm_type")?,
            priority,
            cores: self.cores[row],
            memory_gib: self.memory[row],
            start_s: self.start[row],
            end_s: Some(self.end[row]).filter(|end| !end.is_nan()),
        };
        text.check().map_err(|error| {
            let raised = Raised::from(&error);
            Raised { message: format!("row {row}: {}", raised.message), ..raised }
        })?;
        Ok(text)
    }
}
