//! The project's CSV trace format (`docs/trace-format.md`).
//!
//! Header `vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s` in any order, any further
//! columns kept as named features. An empty `end_s` means the VM was still running at the end of the
//! trace; a negative `start_s` means it was already running at its start. Files ending in `.gz` are
//! gzip-compressed.

use crate::error::TraceError;
use crate::record::{BorrowedRecord, VmRecord};
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
        self.check(Fields::Record(row), line)
    }

    /// The checked fields of a data row read off its text by [`crate::csv_chunks`]: `text` holds
    /// the row's [`CsvLayout::width`] fields, field `i` ending at `ends[i]` (the next starts one
    /// byte, the comma, later). The same checks and errors as [`CsvLayout::row`] on the record the
    /// `csv` crate reads off the same unquoted line.
    pub(crate) fn text_row<'a>(
        &'a self,
        text: &'a str,
        ends: &'a [usize],
        line: u64,
    ) -> Result<CsvRow<'a>, TraceError> {
        self.check(Fields::Text { text, ends }, line)
    }

    fn check<'a>(&'a self, fields: Fields<'a>, line: u64) -> Result<CsvRow<'a>, TraceError> {
        self.check_fields(fields).map_err(|bad| bad.at(line))
    }

    /// The checks of [`CsvLayout::row`], with a small error (a row is checked on the hot path of
    /// reading a trace; the error with its line is made only for a bad row).
    #[inline]
    fn check_fields<'a>(&'a self, fields: Fields<'a>) -> Result<CsvRow<'a>, Bad<'a>> {
        let field = |column: usize| -> Result<&'a str, Bad<'a>> {
            fields.text(self.required[column]).map_err(|bytes| Bad {
                column,
                value: bytes,
                message: "is not UTF-8".into(),
            })
        };
        let number = |column: usize| -> Result<f64, Bad<'a>> {
            let text = field(column)?;
            match parse_f64(trim(text)) {
                Ok(v) if v.is_finite() => Ok(v),
                Ok(_) => Err(Bad::text(column, text, "must be a finite number")),
                Err(_) => Err(Bad::text(column, text, "is not a number")),
            }
        };
        let positive = |column: usize| -> Result<f64, Bad<'a>> {
            let value = number(column)?;
            if value > 0.0 {
                Ok(value)
            } else {
                Err(Bad::text(column, field(column)?, "must be greater than 0"))
            }
        };

        // The checks run in this order so that a row with several bad fields reports the same one
        // whichever reader reads it.
        let vm_id = field(VM_ID)?;
        if vm_id.is_empty() {
            return Err(Bad::text(VM_ID, vm_id, "must not be empty"));
        }
        let cores = positive(CORES)?;
        let memory_gib = positive(MEMORY_GIB)?;
        let priority = match field(PRIORITY)? {
            "" => Priority::Regular,
            "regular" => Priority::Regular,
            "low" => Priority::Low,
            text => text.parse().map_err(|message: String| Bad::text(PRIORITY, text, message))?,
        };
        let start_s = number(START_S)?;
        let end_text = field(END_S)?;
        let end_s = if trim(end_text).is_empty() {
            None
        } else {
            let end = number(END_S)?;
            if end < start_s {
                return Err(Bad::text(END_S, end_text, "must not be before start_s"));
            }
            Some(end)
        };
        Ok(CsvRow {
            record: BorrowedRecord {
                vm_id,
                tenant_id: field(TENANT_ID)?,
                vm_type: field(VM_TYPE)?,
                cores,
                memory_gib,
                priority,
                start_s,
                end_s,
            },
            fields,
            extra_positions: &self.extra_positions,
        })
    }
}

/// A bad field of a row: its column (of [`REQUIRED_COLUMNS`]), its bytes and what is wrong.
struct Bad<'a> {
    column: usize,
    value: &'a [u8],
    message: Cow<'static, str>,
}

impl<'a> Bad<'a> {
    fn text(column: usize, value: &'a str, message: impl Into<Cow<'static, str>>) -> Self {
        Bad { column, value: value.as_bytes(), message: message.into() }
    }

    /// The error, for the row on line `line`.
    #[cold]
    fn at(self, line: u64) -> TraceError {
        bad(line, self.column, &String::from_utf8_lossy(self.value), &self.message)
    }
}

/// `text.trim()`, without looking for Unicode white space when `text` starts and ends with a
/// printable ASCII character (as numbers do).
#[inline]
fn trim(text: &str) -> &str {
    match (text.as_bytes().first(), text.as_bytes().last()) {
        (Some(first), Some(last)) if first.is_ascii_graphic() && last.is_ascii_graphic() => text,
        _ => text.trim(),
    }
}

/// Powers of ten that are exact in an `f64`.
const EXACT_POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// `text.parse::<f64>()`, bit for bit. A plain decimal (an optional `-`, digits with at most one
/// `.`) of at most 2^53 without its point and at most 22 digits after it is the quotient of two
/// exact `f64`s, and IEEE division rounds it correctly, as the standard parser does (Clinger's
/// fast path); anything else goes to the standard parser.
#[inline]
fn parse_f64(text: &str) -> Result<f64, std::num::ParseFloatError> {
    let bytes = text.as_bytes();
    let (negative, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    let mut mantissa: u64 = 0;
    let mut seen_digits = 0usize;
    let mut point: Option<usize> = None;
    for (i, &b) in digits.iter().enumerate() {
        match b {
            b'0'..=b'9' if seen_digits < 19 => {
                mantissa = mantissa * 10 + u64::from(b - b'0');
                seen_digits += 1;
            }
            b'.' if point.is_none() => point = Some(i),
            _ => return text.parse(),
        }
    }
    let decimals = point.map_or(0, |point| digits.len() - point - 1);
    if seen_digits == 0 || mantissa > 1 << 53 || decimals >= EXACT_POWERS_OF_TEN.len() {
        return text.parse();
    }
    let value = mantissa as f64 / EXACT_POWERS_OF_TEN[decimals];
    Ok(if negative { -value } else { value })
}

/// The fields of one data row, as either reader reads them.
#[derive(Clone, Copy, Debug)]
enum Fields<'a> {
    /// A record of the `csv` crate: bytes, checked for UTF-8 field by field.
    Record(&'a csv::ByteRecord),
    /// An unquoted line already known to be UTF-8, and where each of its fields ends.
    Text { text: &'a str, ends: &'a [usize] },
}

impl<'a> Fields<'a> {
    /// Field `i` as text (empty past the last field), or its bytes when they are not UTF-8.
    #[inline]
    fn text(self, i: usize) -> Result<&'a str, &'a [u8]> {
        match self {
            Fields::Record(row) => {
                let bytes = row.get(i).unwrap_or_default();
                std::str::from_utf8(bytes).map_err(|_| bytes)
            }
            Fields::Text { text, ends } => {
                let start = match i.checked_sub(1) {
                    Some(previous) => ends.get(previous).map_or(text.len(), |end| end + 1),
                    None => 0,
                };
                let end = ends.get(i).copied().unwrap_or(start);
                Ok(text.get(start..end).unwrap_or_default())
            }
        }
    }

    /// Field `i` as text, bytes that are not UTF-8 read as U+FFFD.
    fn lossy(self, i: usize) -> Cow<'a, str> {
        match self.text(i) {
            Ok(text) => Cow::Borrowed(text),
            Err(bytes) => String::from_utf8_lossy(bytes),
        }
    }
}

/// One data row of a CSV trace, checked, its text borrowed from the row read.
#[derive(Clone, Copy, Debug)]
pub struct CsvRow<'a> {
    /// The required columns' values.
    pub record: BorrowedRecord<'a>,
    fields: Fields<'a>,
    extra_positions: &'a [usize],
}

impl<'a> CsvRow<'a> {
    /// The extra columns' values in the layout's order ([`CsvLayout::extra_names`]); bytes that are
    /// not UTF-8 read as U+FFFD, as in [`VmRecord::extra`].
    pub fn extra(&self) -> impl Iterator<Item = Cow<'a, str>> + 'a {
        let fields = self.fields;
        self.extra_positions.iter().map(move |&i| fields.lossy(i))
    }

    /// The row as an owned record.
    pub fn to_record(&self, extra_names: &Arc<[String]>) -> VmRecord {
        self.record.to_record(extra_names, self.extra())
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
            Sink::Gzip(Box::new(GzEncoder::new(file, flate2::Compression::default())))
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
    /// Boxed: the encoder's state is large next to the other variants.
    Gzip(Box<GzEncoder<BufWriter<File>>>),
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn same_as_std(text: &str) {
        let ours = parse_f64(text).map(f64::to_bits).map_err(|e| e.to_string());
        let std = text.parse::<f64>().map(f64::to_bits).map_err(|e| e.to_string());
        assert_eq!(ours, std, "{text:?}");
    }

    #[test]
    fn numbers_parse_as_the_standard_parser_parses_them() {
        for text in [
            "0",
            "-0",
            "0.0",
            "-0.0",
            "1",
            "1.75",
            "2099702.785",
            "2106751.944",
            "5.",
            ".5",
            "-.5",
            "-5.",
            ".",
            "-",
            "",
            "+5",
            "1e5",
            "1E-3",
            "inf",
            "-inf",
            "NaN",
            "1.2.3",
            "1,5",
            " 1",
            "1 ",
            "--1",
            "0.1",
            "0.3",
            "123456789012345678",
            "9007199254740992",
            "9007199254740993",
            "9007199254740993.5",
            "0.0000000000000000000001",
            "0.00000000000000000000001",
            "1234567890123456789",
            "12345678901234567890",
            "00000000000000000000001",
            "1.7976931348623157",
            "4.9406564584124654",
            "99999999999999999999.9",
            "١",
        ] {
            same_as_std(text);
        }
    }

    proptest! {
        #[test]
        fn decimals_parse_as_the_standard_parser_parses_them(
            negative in any::<bool>(),
            whole in "[0-9]{0,20}",
            fraction in proptest::option::of("[0-9]{0,25}"),
        ) {
            let text = format!("{}{whole}{}", if negative { "-" } else { "" }, fraction.map(|f| format!(".{f}")).unwrap_or_default());
            same_as_std(&text);
        }

        #[test]
        fn printed_numbers_parse_back_as_the_standard_parser_parses_them(value in any::<f64>()) {
            same_as_std(&value.to_string());
            same_as_std(&format!("{value:.3}"));
        }
    }

    #[test]
    fn trimming_is_str_trim() {
        for text in ["", " ", "1", " 1", "1 ", "\t1\n", "\u{a0}1", "1\u{a0}", "\u{b}1", "a b", "\u{3000}"] {
            assert_eq!(trim(text), text.trim(), "{text:?}");
        }
    }
}
