//! The project's CSV trace format (`docs/trace-format.md`).
//!
//! Header `vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s` in any order, any further
//! columns kept as named features. An empty `end_s` means the VM was still running at the end of the
//! trace; a negative `start_s` means it was already running at its start. Files ending in `.gz` are
//! gzip-compressed.

use crate::error::TraceError;
use crate::record::{ExtraColumns, VmRecord};
use domain::Priority;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

/// The required columns, in the order the writer puts them.
pub const REQUIRED_COLUMNS: [&str; 8] =
    ["vm_id", "tenant_id", "vm_type", "cores", "memory_gib", "priority", "start_s", "end_s"];

const VM_ID: usize = 0;
const TENANT_ID: usize = 1;
const VM_TYPE: usize = 2;
const CORES: usize = 3;
const MEMORY_GIB: usize = 4;
const PRIORITY: usize = 5;
const START_S: usize = 6;
const END_S: usize = 7;

fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("gz"))
}

/// Where the columns of a CSV trace are, read off its header: the required columns' positions and
/// the extra (feature) columns' positions and names. [`CsvTraceReader`] and the parallel reader
/// ([`crate::csv_chunks`]) check rows through the same layout, so they accept and refuse the same.
#[derive(Clone, Debug)]
pub struct CsvLayout {
    /// Position of each required column in the file.
    required: [usize; 8],
    /// Positions and names of the extra columns.
    extra_positions: Vec<usize>,
    extra_names: Arc<[String]>,
    /// Fields in the header: every row must have as many.
    width: usize,
}

impl CsvLayout {
    pub(crate) fn from_header(header: &csv::ByteRecord) -> Result<Self, TraceError> {
        let names: Vec<String> = header.iter().map(|h| String::from_utf8_lossy(h).trim().to_owned()).collect();
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(TraceError::DuplicateColumn { column: name.clone() });
            }
        }
        let mut required = [0; 8];
        for (slot, column) in required.iter_mut().zip(REQUIRED_COLUMNS) {
            *slot = names
                .iter()
                .position(|n| n == column)
                .ok_or_else(|| TraceError::MissingColumn { column, expected: REQUIRED_COLUMNS.join(",") })?;
        }
        let extra_positions: Vec<usize> = (0..names.len()).filter(|i| !required.contains(i)).collect();
        let extra_names: Arc<[String]> = extra_positions.iter().map(|&i| names[i].clone()).collect();
        Ok(CsvLayout { required, extra_positions, extra_names, width: names.len() })
    }

    /// Names of the extra (feature) columns, in file order.
    pub fn extra_names(&self) -> &Arc<[String]> {
        &self.extra_names
    }

    /// Fields a row must have (the header's).
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// The checked fields of the data row `row`, which starts on line `line` of the file.
    pub(crate) fn row<'a>(&'a self, row: &'a csv::ByteRecord, line: u64) -> Result<CsvRow<'a>, TraceError> {
        let field = |column: usize| -> Result<&'a str, TraceError> {
            let bytes = row.get(self.required[column]).unwrap_or_default();
            std::str::from_utf8(bytes).map_err(|_| bad(line, column, &String::from_utf8_lossy(bytes), "is not UTF-8"))
        };
        let number = |column: usize| -> Result<f64, TraceError> {
            let text = field(column)?;
            match text.trim().parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(v),
                Ok(_) => Err(bad(line, column, text, "must be a finite number")),
                Err(_) => Err(bad(line, column, text, "is not a number")),
            }
        };
        let positive = |column: usize| -> Result<f64, TraceError> {
            let value = number(column)?;
            if value > 0.0 {
                Ok(value)
            } else {
                Err(bad(line, column, field(column)?, "must be greater than 0"))
            }
        };

        // The checks run in this order so that a row with several bad fields reports the same one
        // whichever reader reads it.
        let vm_id = field(VM_ID)?;
        if vm_id.is_empty() {
            return Err(bad(line, VM_ID, vm_id, "must not be empty"));
        }
        let cores = positive(CORES)?;
        let memory_gib = positive(MEMORY_GIB)?;
        let priority = match field(PRIORITY)? {
            "" => Priority::Regular,
            text => text.parse().map_err(|message: String| bad(line, PRIORITY, text, &message))?,
        };
        let start_s = number(START_S)?;
        let end_s = if field(END_S)?.trim().is_empty() {
            None
        } else {
            let end = number(END_S)?;
            if end < start_s {
                return Err(bad(line, END_S, field(END_S)?, "must not be before start_s"));
            }
            Some(end)
        };
        Ok(CsvRow {
            vm_id,
            tenant_id: field(TENANT_ID)?,
            vm_type: field(VM_TYPE)?,
            cores,
            memory_gib,
            priority,
            start_s,
            end_s,
            row,
            extra_positions: &self.extra_positions,
        })
    }
}

/// One data row of a CSV trace, checked, its text borrowed from the row read.
#[derive(Clone, Copy, Debug)]
pub struct CsvRow<'a> {
    pub vm_id: &'a str,
    pub tenant_id: &'a str,
    pub vm_type: &'a str,
    pub cores: f64,
    pub memory_gib: f64,
    pub priority: Priority,
    pub start_s: f64,
    pub end_s: Option<f64>,
    row: &'a csv::ByteRecord,
    extra_positions: &'a [usize],
}

impl<'a> CsvRow<'a> {
    /// The extra columns' values in the layout's order ([`CsvLayout::extra_names`]); bytes that are
    /// not UTF-8 read as U+FFFD, as in [`VmRecord::extra`].
    pub fn extra(&self) -> impl Iterator<Item = Cow<'a, str>> + 'a {
        let row = self.row;
        self.extra_positions.iter().map(move |&i| String::from_utf8_lossy(row.get(i).unwrap_or_default()))
    }

    /// The row as an owned record.
    pub fn to_record(&self, extra_names: &Arc<[String]>) -> VmRecord {
        let extra = if self.extra_positions.is_empty() {
            ExtraColumns::default()
        } else {
            ExtraColumns::new(Arc::clone(extra_names), self.extra().map(Cow::into_owned).collect())
        };
        VmRecord {
            vm_id: self.vm_id.to_owned(),
            tenant_id: self.tenant_id.to_owned(),
            vm_type: self.vm_type.to_owned(),
            cores: self.cores,
            memory_gib: self.memory_gib,
            priority: self.priority,
            start_s: self.start_s,
            end_s: self.end_s,
            extra,
        }
    }
}

/// Streams [`VmRecord`]s out of a CSV trace.
pub struct CsvTraceReader {
    reader: csv::Reader<Box<dyn Read + Send>>,
    layout: CsvLayout,
    row: csv::ByteRecord,
    failed: bool,
}

impl CsvTraceReader {
    /// Opens a `.csv` or `.csv.gz` file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
        let input: Box<dyn Read + Send> = if is_gzip(path) {
            Box::new(MultiGzDecoder::new(BufReader::with_capacity(1 << 16, file)))
        } else {
            Box::new(file)
        };
        Self::from_reader(input)
    }

    /// Reads CSV text from any source (uncompressed).
    pub fn from_reader(input: impl Read + Send + 'static) -> Result<Self, TraceError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .buffer_capacity(1 << 16)
            .from_reader(Box::new(input) as Box<dyn Read + Send>);
        let layout = CsvLayout::from_header(reader.byte_headers().map_err(csv_error)?)?;
        Ok(CsvTraceReader { reader, layout, row: csv::ByteRecord::new(), failed: false })
    }

    /// Names of the extra (feature) columns, in file order.
    pub fn extra_column_names(&self) -> &Arc<[String]> {
        self.layout.extra_names()
    }

    fn parse_row(&self) -> Result<VmRecord, TraceError> {
        let line = self.row.position().map_or(0, csv::Position::line);
        Ok(self.layout.row(&self.row, line)?.to_record(self.layout.extra_names()))
    }
}

fn bad(line: u64, column: usize, value: &str, message: &str) -> TraceError {
    TraceError::BadField {
        line,
        column: REQUIRED_COLUMNS[column].to_owned(),
        value: value.to_owned(),
        message: message.to_owned(),
    }
}

pub(crate) fn csv_error(err: csv::Error) -> TraceError {
    let line = err.position().map_or(0, csv::Position::line);
    let message = match err.kind() {
        csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
            format!("expected {expected_len} fields like the header, found {len}")
        }
        _ => err.to_string(),
    };
    TraceError::Csv { line, message }
}

impl Iterator for CsvTraceReader {
    type Item = Result<VmRecord, TraceError>;

    /// Yields records until the end of the file or the first error, after which it stops.
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let result = match self.reader.read_byte_record(&mut self.row) {
            Ok(false) => return None,
            Ok(true) => self.parse_row(),
            Err(err) => Err(csv_error(err)),
        };
        self.failed = result.is_err();
        Some(result)
    }
}

/// Writes records in the project's CSV format, gzip-compressed when the path ends in `.gz`.
pub struct CsvTraceWriter {
    writer: csv::Writer<Sink>,
    extra_names: Vec<String>,
    path: std::path::PathBuf,
}

impl CsvTraceWriter {
    /// Creates the file and writes the header: the required columns, then `extra_names`.
    pub fn create(path: impl AsRef<Path>, extra_names: &[String]) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = BufWriter::with_capacity(1 << 16, File::create(path).map_err(|e| TraceError::io(path, e))?);
        let output = if is_gzip(path) {
            Sink::Gzip(GzEncoder::new(file, flate2::Compression::default()))
        } else {
            Sink::Plain(file)
        };
        let mut writer = csv::WriterBuilder::new().from_writer(output);
        let header = REQUIRED_COLUMNS.iter().copied().chain(extra_names.iter().map(String::as_str));
        writer.write_record(header).map_err(|e| write_error(path, e))?;
        Ok(CsvTraceWriter { writer, extra_names: extra_names.to_vec(), path: path.to_owned() })
    }

    /// Writes the trace uncompressed to `output` (an HTTP response's body, say), the header first;
    /// `name` names the output in errors.
    pub fn to_writer(
        output: impl Write + Send + 'static,
        extra_names: &[String],
        name: &str,
    ) -> Result<Self, TraceError> {
        let path = Path::new(name);
        let mut writer = csv::WriterBuilder::new().from_writer(Sink::Stream(Box::new(output)));
        let header = REQUIRED_COLUMNS.iter().copied().chain(extra_names.iter().map(String::as_str));
        writer.write_record(header).map_err(|e| write_error(path, e))?;
        Ok(CsvTraceWriter { writer, extra_names: extra_names.to_vec(), path: path.to_owned() })
    }

    pub fn write(&mut self, record: &VmRecord) -> Result<(), TraceError> {
        let mut fields: Vec<String> = Vec::with_capacity(REQUIRED_COLUMNS.len() + self.extra_names.len());
        fields.extend([
            record.vm_id.clone(),
            record.tenant_id.clone(),
            record.vm_type.clone(),
            record.cores.to_string(),
            record.memory_gib.to_string(),
            record.priority.to_string(),
            record.start_s.to_string(),
            record.end_s.map(|end| end.to_string()).unwrap_or_default(),
        ]);
        let same_columns = record.extra.names() == self.extra_names.as_slice();
        for (i, name) in self.extra_names.iter().enumerate() {
            let value = if same_columns { Some(record.extra.values()[i].as_str()) } else { record.extra.get(name) };
            fields.push(value.unwrap_or_default().to_owned());
        }
        self.writer.write_record(&fields).map_err(|e| write_error(&self.path, e))
    }

    /// Flushes everything, including the gzip trailer.
    pub fn finish(self) -> Result<(), TraceError> {
        let path = self.path;
        let sink = self.writer.into_inner().map_err(|e| TraceError::io(&path, e.into_error()))?;
        sink.finish().map_err(|e| TraceError::io(&path, e))
    }
}

fn write_error(path: &Path, err: csv::Error) -> TraceError {
    TraceError::io(path, std::io::Error::other(err.to_string()))
}

/// Output file, plain or gzip; an enum rather than a boxed writer so that `finish` can report the
/// errors of the last flush and of the gzip trailer.
enum Sink {
    Plain(BufWriter<File>),
    Gzip(GzEncoder<BufWriter<File>>),
    /// Any output ([`CsvTraceWriter::to_writer`]), uncompressed.
    Stream(Box<dyn Write + Send>),
}

impl Sink {
    fn finish(self) -> std::io::Result<()> {
        match self {
            Sink::Plain(mut file) => file.flush(),
            Sink::Gzip(encoder) => encoder.finish()?.flush(),
            Sink::Stream(mut output) => output.flush(),
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Plain(w) => w.write(buf),
            Sink::Gzip(w) => w.write(buf),
            Sink::Stream(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Plain(w) => w.flush(),
            Sink::Gzip(w) => w.flush(),
            Sink::Stream(w) => w.flush(),
        }
    }
}
