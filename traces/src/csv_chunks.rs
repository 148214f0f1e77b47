//! Reading a CSV trace with its rows parsed on several threads (issue 33: a trace read into a data
//! frame as fast as pandas reads it).
//!
//! The calling thread reads (and, for a `.gz` file, decompresses) the text and cuts it into blocks
//! of whole lines; worker threads parse the blocks, each into a sink of its own (column buffers,
//! say), and the sinks come back in file order. Every row goes through the checks of
//! [`CsvTraceReader`](crate::csv_format::CsvTraceReader) ([`CsvLayout`]'s), and the first bad row in
//! file order is reported with its line number in the file: a trace is accepted, or refused with
//! the same error, whichever of the two reads it (the tests below hold them to that).
//!
//! A line break ends a record only outside a quoted field. Traces are not quoted, so blocks are cut
//! at line breaks until the first `"`: from the block that holds one, the rest of the text is
//! parsed as one block, in order, as the sequential reader would.
//!
//! A block that is UTF-8 and holds no `"` and no `\r` but in `\r\n` (a trace as written, with
//! either line ending) is split at line breaks and `,` directly, each field borrowed from the
//! block's text: for such text that is exactly what the `csv` crate reads (`\n` and `\r\n` end a
//! record, empty lines are skipped), without its state machine and with one UTF-8 check for the
//! whole block. Any other block, or one with a bad row, is read by the `csv` crate, which then
//! reports the error exactly as the sequential reader does. Lines are counted by the workers, and
//! an error's line in the file is known once the blocks before it are parsed; the buffers of
//! parsed blocks are handed back to the reading thread for the next blocks.

use crate::csv_format::{csv_error, CsvLayout, CsvRow};
use crate::error::TraceError;
use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

/// Where the rows of one block go ([`read_parallel`] makes one sink per block).
pub trait RowSink: Send {
    /// Takes the next row of the block, already checked.
    fn push(&mut self, row: &CsvRow<'_>);

    /// About `rows` rows of `bytes` bytes of text in all are coming: room may be made for them.
    fn reserve(&mut self, rows: usize, bytes: usize) {
        let _ = (rows, bytes);
    }
}

/// Text handed to a worker at a time: large enough that handing it over costs nothing next to
/// parsing it, small enough that the workers start early and share the work evenly.
pub const BLOCK: usize = 1 << 20;

/// Bytes asked of the input per read.
const READ: usize = 1 << 16;

/// A trace read by [`read_parallel`].
#[derive(Debug)]
pub struct Parsed<S> {
    /// The extra (feature) columns, in file order (every row has them all).
    pub extra_names: Arc<[String]>,
    /// One sink per block, in file order.
    pub parts: Vec<S>,
}

/// A block of whole lines of the file.
struct Job {
    index: usize,
    data: Vec<u8>,
}

/// A parsed block: its index, its line breaks, and its sink or its first error (the error's line
/// counted from the block's first line, line 1).
type Done<S> = (usize, u64, Result<S, TraceError>);

/// Buffers of parsed blocks, for the next blocks: a block's memory is written once, not paged in
/// anew for every block.
type Spare = Mutex<Vec<Vec<u8>>>;

/// Reads a CSV trace (uncompressed text) from `input`, parsing blocks of [`BLOCK`] bytes on
/// `threads` threads (on this one alone when `threads <= 1`), each into a sink from `new_sink`
/// (given the extra columns' names).
pub fn read_parallel<S: RowSink>(
    input: impl Read,
    threads: usize,
    new_sink: impl Fn(&Arc<[String]>) -> S + Sync,
) -> Result<Parsed<S>, TraceError> {
    read_parallel_with(input, threads, BLOCK, new_sink)
}

/// [`read_parallel`] with blocks of about `block` bytes (whole lines, at least one).
pub fn read_parallel_with<S: RowSink>(
    mut input: impl Read,
    threads: usize,
    block: usize,
    new_sink: impl Fn(&Arc<[String]>) -> S + Sync,
) -> Result<Parsed<S>, TraceError> {
    let mut text = Pending::default();
    // The header: the first line, or, if it holds a quote, the whole text read as the sequential
    // reader reads it.
    while text.first_newline().is_none() && !text.eof {
        text.fill(&mut input)?;
    }
    let header_end = text.first_newline().map_or(text.data.len(), |i| i + 1);
    if text.data[..header_end].contains(&b'"') {
        text.read_to_end(&mut input)?;
        let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(&text.data[..]);
        let layout = CsvLayout::from_header(reader.byte_headers().map_err(csv_error)?)?;
        let mut sink = new_sink(layout.extra_names());
        parse_records(&mut reader, &layout, &mut sink)?;
        return Ok(Parsed { extra_names: Arc::clone(layout.extra_names()), parts: vec![sink] });
    }
    let layout = {
        let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(&text.data[..header_end]);
        CsvLayout::from_header(reader.byte_headers().map_err(csv_error)?)?
    };
    let header_lines = count_lines(&text.data[..header_end]);
    text.data.drain(..header_end);
    text.has_newline = text.data.contains(&b'\n');
    let spare = Spare::default();
    let mut blocks = Blocks { text, index: 0, block: block.max(1), sequential: false, spare: &spare };

    let parse = |job: Job| -> Done<S> {
        let (lines, parsed) = parse_block(&job.data, &layout, || new_sink(layout.extra_names()));
        if let Ok(mut spare) = spare.lock() {
            spare.push(job.data);
        }
        (job.index, lines, parsed)
    };
    let mut results: Vec<Done<S>> = Vec::new();
    let read_result = if threads <= 1 {
        let mut read = Ok(());
        loop {
            match blocks.next(&mut input) {
                Ok(Some(job)) => {
                    let done = parse(job);
                    let failed = done.2.is_err();
                    results.push(done);
                    if failed {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    read = Err(error);
                    break;
                }
            }
        }
        read
    } else {
        let failed = AtomicBool::new(false);
        let (sender, receiver) = sync_channel::<Job>(threads * 2);
        let receiver = Mutex::new(receiver);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            // Jobs leave the channel in file order, so every block before a bad
                            // one is parsed too: the first error in file order is always found.
                            let job = match receiver.lock() {
                                Ok(receiver) => receiver.recv(),
                                Err(poisoned) => poisoned.into_inner().recv(),
                            };
                            let Ok(job) = job else { break };
                            let parsed = parse(job);
                            if parsed.2.is_err() {
                                failed.store(true, Ordering::Relaxed);
                            }
                            done.push(parsed);
                        }
                        done
                    })
                })
                .collect();
            let mut read = Ok(());
            while !failed.load(Ordering::Relaxed) {
                match blocks.next(&mut input) {
                    Ok(Some(job)) => {
                        if sender.send(job).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        read = Err(error);
                        break;
                    }
                }
            }
            drop(sender);
            for worker in workers {
                match worker.join() {
                    Ok(done) => results.extend(done),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            read
        })
    };
    results.sort_by_key(|(index, _, _)| *index);
    let mut parts = Vec::with_capacity(results.len());
    let mut lines_before = header_lines;
    for (_, lines, parsed) in results {
        parts.push(parsed.map_err(|error| shift(error, lines_before))?);
        lines_before += lines;
    }
    // A row error comes first: the sequential reader would have met it before the read failed.
    // Every block handed out was parsed, so the read error's line is counted past them all.
    read_result.map_err(|error| shift(error, lines_before))?;
    Ok(Parsed { extra_names: Arc::clone(layout.extra_names()), parts })
}

/// Text read but not yet handed out.
#[derive(Default)]
struct Pending {
    data: Vec<u8>,
    /// `data` holds a line break.
    has_newline: bool,
    eof: bool,
}

impl Pending {
    fn first_newline(&self) -> Option<usize> {
        memchr::memchr(b'\n', &self.data)
    }

    /// Reads once more from `input`; a read error's line is counted from the start of the pending
    /// text.
    fn fill(&mut self, input: &mut impl Read) -> Result<(), TraceError> {
        let start = self.data.len();
        self.data.resize(start + READ, 0);
        let read = loop {
            match input.read(&mut self.data[start..]) {
                Ok(n) => break n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    self.data.truncate(start);
                    return Err(read_error(&self.data, error));
                }
            }
        };
        self.data.truncate(start + read);
        self.eof = read == 0;
        self.has_newline |= memchr::memchr(b'\n', &self.data[start..]).is_some();
        Ok(())
    }

    fn read_to_end(&mut self, input: &mut impl Read) -> Result<(), TraceError> {
        while !self.eof {
            self.fill(input)?;
        }
        Ok(())
    }
}

fn read_error(data: &[u8], error: io::Error) -> TraceError {
    TraceError::Csv { line: count_lines(data) + 1, message: error.to_string() }
}

/// The text cut into blocks of whole lines.
struct Blocks<'a> {
    text: Pending,
    index: usize,
    block: usize,
    /// A quote was seen: the rest was handed out as one block.
    sequential: bool,
    spare: &'a Spare,
}

impl Blocks<'_> {
    /// The next block; a read error's line is counted from the start of the text not yet handed
    /// out.
    fn next(&mut self, input: &mut impl Read) -> Result<Option<Job>, TraceError> {
        if self.sequential {
            return Ok(None);
        }
        // Read until a block's worth of whole lines is pending, or the text ends.
        while !(self.text.eof || (self.text.data.len() >= self.block && self.text.has_newline)) {
            self.text.fill(input)?;
        }
        if self.text.data.is_empty() {
            return Ok(None);
        }
        let cut = match memchr::memrchr(b'\n', &self.text.data) {
            Some(i) if !self.text.eof => i + 1,
            _ => self.text.data.len(),
        };
        let mut rest = self.spare.lock().ok().and_then(|mut spare| spare.pop()).unwrap_or_default();
        rest.clear();
        rest.extend_from_slice(&self.text.data[cut..]);
        self.text.data.truncate(cut);
        let mut data = std::mem::replace(&mut self.text.data, rest);
        self.text.has_newline = memchr::memchr(b'\n', &self.text.data).is_some();
        if memchr::memchr(b'"', &data).is_some() {
            // A quoted field may hold a line break: the rest is one block, parsed in order.
            data.append(&mut self.text.data);
            let mut rest = Pending { data, has_newline: true, eof: self.text.eof };
            // A read error's line is counted from the block's start, as the pending text's is.
            rest.read_to_end(input)?;
            data = rest.data;
            self.sequential = true;
        }
        let job = Job { index: self.index, data };
        self.index += 1;
        Ok(Some(job))
    }
}

fn count_lines(data: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', data).count() as u64
}

/// Parses `data`, whole lines of the file, into a sink from `new_sink`: the block's line breaks,
/// and the sink or the block's first error (its line counted from the block's first line).
fn parse_block<S: RowSink>(data: &[u8], layout: &CsvLayout, new_sink: impl Fn() -> S) -> (u64, Result<S, TraceError>) {
    let lines = count_lines(data);
    if memchr::memchr(b'"', data).is_none() {
        if let Ok(text) = std::str::from_utf8(data) {
            let mut sink = new_sink();
            sink.reserve(lines as usize + 1, data.len());
            if split_text(text, layout, &mut sink) {
                return (lines, Ok(sink));
            }
        }
    }
    // `flexible`: the header is not in the block, so the field count is checked against it here.
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(data);
    let mut sink = new_sink();
    (lines, parse_records(&mut reader, layout, &mut sink).map(|()| sink))
}

/// Rows of `text` (unquoted) split at `\n`, `\r\n` and `,`, empty lines skipped, into `sink`;
/// `false` at a `\r` not followed by `\n` (the `csv` crate reads it as a line break of its own), or
/// at the first row with too few or too many fields or a bad field (its error is the `csv` reader's
/// to report).
fn split_text(text: &str, layout: &CsvLayout, sink: &mut impl RowSink) -> bool {
    let bytes = text.as_bytes();
    let mut ends = Vec::with_capacity(layout.width());
    let mut start = 0;
    let mut row = |start: usize, end: usize, ends: &mut Vec<usize>| -> bool {
        if end == start {
            // An empty line: no record.
            return true;
        }
        ends.push(end - start);
        if ends.len() != layout.width() {
            return false;
        }
        match layout.text_row(&text[start..end], ends, 0) {
            Ok(row) => {
                sink.push(&row);
                ends.clear();
                true
            }
            Err(_) => false,
        }
    };
    for (chunk, base) in bytes.chunks(64).zip((0..).step_by(64)) {
        let mut mask = separators(chunk);
        while mask != 0 {
            let at = base + mask.trailing_zeros() as usize;
            mask &= mask - 1;
            match bytes[at] {
                // The `\n` of a `\r\n` already taken.
                _ if at < start => {}
                b',' => ends.push(at - start),
                b'\n' => {
                    if !row(start, at, &mut ends) {
                        return false;
                    }
                    start = at + 1;
                }
                _ => {
                    if bytes.get(at + 1) != Some(&b'\n') || !row(start, at, &mut ends) {
                        return false;
                    }
                    start = at + 2;
                }
            }
        }
    }
    start >= bytes.len() || row(start, bytes.len(), &mut ends)
}

/// Bit `i` set when `chunk[i]` (at most 64 bytes) is `,`, `\n` or `\r`: a field holds a few bytes,
/// so the separators are found 8 bytes at a time, without a branch, rather than searched for one
/// after the other.
#[inline]
fn separators(chunk: &[u8]) -> u64 {
    let mut mask = 0;
    let mut words = chunk.chunks_exact(8);
    let mut shift = 0;
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        mask |= separator_bits(u64::from_le_bytes(bytes)) << shift;
        shift += 8;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        // Zero bytes past the end are no separators.
        let mut bytes = [0u8; 8];
        bytes[..rest.len()].copy_from_slice(rest);
        mask |= separator_bits(u64::from_le_bytes(bytes)) << shift;
    }
    mask
}

/// Bit `i` set when byte `i` (little-endian) of `word` is `,`, `\n` or `\r`.
#[inline(always)]
fn separator_bits(word: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const ONES: u64 = 0x0101_0101_0101_0101;
    // 0x80 in each byte of `t` that is zero, 0 in the others (no carry crosses a byte).
    let zero = |t: u64| !(((t & LOW7) + LOW7) | t | LOW7);
    let found = zero(word ^ (ONES * u64::from(b',')))
        | zero(word ^ (ONES * u64::from(b'\n')))
        | zero(word ^ (ONES * u64::from(b'\r')));
    // One bit a byte, gathered into the top byte: byte `i`'s bit lands on bit `56 + i`.
    (found >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56
}

fn parse_records(
    reader: &mut csv::Reader<&[u8]>,
    layout: &CsvLayout,
    sink: &mut impl RowSink,
) -> Result<(), TraceError> {
    let mut row = csv::ByteRecord::new();
    while reader.read_byte_record(&mut row).map_err(csv_error)? {
        let line = row.position().map_or(0, csv::Position::line);
        if row.len() != layout.width() {
            // The message of the sequential reader's `csv` error for the same row.
            return Err(TraceError::Csv {
                line,
                message: format!("expected {} fields like the header, found {}", layout.width(), row.len()),
            });
        }
        sink.push(&layout.row(&row, line)?);
    }
    Ok(())
}

/// `error` with its line moved down by `lines_before` lines.
fn shift(error: TraceError, lines_before: u64) -> TraceError {
    match error {
        TraceError::Csv { line, message } => TraceError::Csv { line: line + lines_before, message },
        TraceError::BadField { line, column, value, message } => {
            TraceError::BadField { line: line + lines_before, column, value, message }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csv_format::CsvTraceReader;
    use crate::VmRecord;
    use std::io::Cursor;

    /// Records, as the sequential reader would make them.
    #[derive(Debug)]
    struct Records {
        names: Arc<[String]>,
        records: Vec<VmRecord>,
    }

    impl RowSink for Records {
        fn push(&mut self, row: &CsvRow<'_>) {
            self.records.push(row.to_record(&self.names));
        }
    }

    /// What the sequential reader reads: the records up to the first error, and that error.
    fn sequential<T: AsRef<[u8]> + ?Sized>(text: &T) -> Result<Vec<VmRecord>, String> {
        let reader = CsvTraceReader::from_reader(Cursor::new(text.as_ref().to_vec())).map_err(|e| e.to_string())?;
        reader.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())
    }

    fn chunked<T: AsRef<[u8]> + ?Sized>(text: &T, threads: usize, block: usize) -> Result<Vec<VmRecord>, String> {
        let text = text.as_ref();
        let parsed = read_parallel_with(Cursor::new(text), threads, block, |names| Records {
            names: Arc::clone(names),
            records: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
        if let Ok(reader) = CsvTraceReader::from_reader(Cursor::new(text.to_vec())) {
            assert_eq!(&parsed.extra_names, reader.extra_column_names());
        }
        Ok(parsed.parts.into_iter().flat_map(|part| part.records).collect())
    }

    const HEADER: &str = "vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s,batch_size\n";

    fn trace(rows: usize) -> String {
        let mut text = HEADER.to_owned();
        for i in 0..rows {
            let end = if i % 7 == 0 { String::new() } else { format!("{}", i * 10 + 500) };
            let priority = ["regular", "low", ""][i % 3];
            text.push_str(&format!(
                "vm-{i},t{},type-{},{},{}.5,{priority},{},{end},{}\n",
                i % 13,
                i % 5,
                1 + i % 4,
                i % 9 + 1,
                i * 10,
                i % 2
            ));
        }
        text
    }

    fn same_as_sequential<T: AsRef<[u8]> + ?Sized>(text: &T) {
        let text = text.as_ref();
        let expected = sequential(text);
        for threads in [1, 2, 3] {
            for block in [1, 7, 64, 1000, BLOCK] {
                assert_eq!(
                    chunked(text, threads, block),
                    expected,
                    "threads {threads}, block {block}:\n{}",
                    String::from_utf8_lossy(text)
                );
            }
        }
    }

    #[test]
    fn good_traces_read_the_same_records() {
        same_as_sequential(&trace(0));
        same_as_sequential(&trace(1));
        same_as_sequential(&trace(500));
        same_as_sequential(&trace(20).replace('\n', "\r\n"));
        // No line break after the last row, empty lines, a header alone without a line break.
        same_as_sequential(trace(30).trim_end());
        same_as_sequential(&trace(30).replace("vm-12,", "\nvm-12,"));
        same_as_sequential(HEADER.trim_end());
        same_as_sequential("");
    }

    #[test]
    fn quoted_fields_read_the_same_records() {
        // A quoted field holding a line break, in a block after some unquoted ones.
        let text = trace(200).replace("vm-150,t7", "\"vm\n150\",\"t,7\"");
        assert!(sequential(&text).is_ok());
        same_as_sequential(&text);
        // A quoted header.
        same_as_sequential(&trace(50).replacen("vm_id", "\"vm_id\"", 1));
    }

    #[test]
    fn a_bad_field_is_reported_at_its_line_in_the_file() {
        // Row i is on line i + 2 (the header is line 1).
        let text = trace(300).replace("vm-211,t3,type-1,4,5.5", "vm-211,t3,type-1,-4,5.5");
        let error = chunked(&text, 2, 64).unwrap_err();
        assert!(error.starts_with("line 213, column `cores`: must be greater than 0"), "{error}");
        same_as_sequential(&text);
    }

    #[test]
    fn the_first_bad_row_in_file_order_is_the_one_reported() {
        let text = trace(400)
            .replace("vm-350,", "vm-350,x,")
            .replace("vm-100,t9,type-0,1,2.5,low,1000,", "vm-100,t9,type-0,1,2.5,low,nope,")
            .replace("vm-5,", ",");
        let error = chunked(&text, 3, 100).unwrap_err();
        assert!(error.starts_with("line 7, column `vm_id`: must not be empty"), "{error}");
        same_as_sequential(&text);
        let text = trace(400).replace("vm-350,", "vm-350,x,");
        assert_eq!(chunked(&text, 2, 100).unwrap_err(), "line 352: expected 9 fields like the header, found 10");
        same_as_sequential(&text);
        same_as_sequential(&trace(400).replace("vm-100,t9,type-0,1,2.5,low,1000,", "vm-100,t9,type-0,1,2.5,low,nope,"));
        same_as_sequential(
            &trace(50).replace("vm-40,t1,type-0,1,5.5,low,400,900", "vm-40,t1,type-0,1,5.5,low,400,300"),
        );
    }

    #[test]
    fn bad_headers_are_refused_as_by_the_sequential_reader() {
        same_as_sequential("vm_id,tenant_id\nvm-1,t\n");
        same_as_sequential(&trace(3).replacen("batch_size", "cores", 1));
    }

    /// Fails after `ok` bytes.
    struct Failing<'a> {
        data: &'a [u8],
        ok: usize,
    }

    impl Read for Failing<'_> {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.ok == 0 {
                return Err(io::Error::other("disk on fire"));
            }
            let n = out.len().min(self.ok).min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.ok -= n;
            Ok(n)
        }
    }

    #[test]
    fn a_read_error_is_reported_after_the_rows_before_it() {
        let text = trace(3000);
        let sink = |names: &Arc<[String]>| Records { names: Arc::clone(names), records: Vec::new() };
        let error = read_parallel_with(Failing { data: text.as_bytes(), ok: 100_000 }, 2, 1000, sink).unwrap_err();
        assert!(matches!(&error, TraceError::Csv { message, .. } if message == "disk on fire"), "{error}");
        let bad = text.replace("vm-10,t10,type-0,3,2.5", "vm-10,t10,type-0,0,2.5");
        let error = read_parallel_with(Failing { data: bad.as_bytes(), ok: 100_000 }, 2, 1000, sink).unwrap_err();
        assert!(error.to_string().starts_with("line 12, column `cores`"), "{error}");
    }

    /// Counts the rows pushed and whether room was made for them (the split text path does).
    #[derive(Default)]
    struct Counting {
        rows: usize,
        reserved: bool,
    }

    impl RowSink for Counting {
        fn push(&mut self, _row: &CsvRow<'_>) {
            self.rows += 1;
        }

        fn reserve(&mut self, _rows: usize, _bytes: usize) {
            self.reserved = true;
        }
    }

    fn layout() -> CsvLayout {
        let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(HEADER.as_bytes());
        CsvLayout::from_header(reader.byte_headers().unwrap()).unwrap()
    }

    #[test]
    fn plain_blocks_are_split_directly_and_others_read_by_csv() {
        let layout = layout();
        let rows = &trace(40)[HEADER.len()..];
        let (lines, parsed) = parse_block(rows.as_bytes(), &layout, Counting::default);
        let sink = parsed.unwrap();
        assert_eq!((lines, sink.rows, sink.reserved), (40, 40, true));
        let (lines, parsed) = parse_block(rows.replace('\n', "\r\n").as_bytes(), &layout, Counting::default);
        let sink = parsed.unwrap();
        assert_eq!((lines, sink.rows, sink.reserved), (40, 40, true), "CRLF");
        // A lone `\r` (a line break of its own to the csv reader: 39 `\n`, 40 rows), a quote.
        for (other, newlines) in [(rows.replacen('\n', "\r", 1), 39), (rows.replacen("vm-3,", "\"vm-3\",", 1), 40)] {
            let (lines, parsed) = parse_block(other.as_bytes(), &layout, Counting::default);
            let sink = parsed.unwrap();
            assert_eq!((lines, sink.rows, sink.reserved), (newlines, 40, false), "{other}");
        }
        // Not UTF-8 (in the extra column of the first row).
        let mut bytes = rows.as_bytes().to_vec();
        bytes[rows.find('\n').unwrap() - 1] = 0xff;
        let (_, parsed) = parse_block(&bytes, &layout, Counting::default);
        assert!(!parsed.unwrap().reserved);
        // A bad row: the csv reader reads the block again and reports it (line 3 of the block).
        let bad = rows.replacen("vm-2,t2,type-2,3,3.5", "vm-2,t2,type-2,0,3.5", 1);
        let (_, parsed) = parse_block(bad.as_bytes(), &layout, Counting::default);
        assert!(parsed.err().unwrap().to_string().starts_with("line 3, column `cores`"));
    }

    #[test]
    fn split_text_reads_what_the_csv_reader_reads() {
        // Spaces around numbers and in text, empty text fields, empty lines anywhere, a last line
        // without a line break, a line of spaces (one field: refused), a lone `\r` (a line break
        // to the csv reader), bytes that are not UTF-8 in an extra column and in a required one.
        let text = trace(120)
            .replace("vm-5,t5,type-0,2,6.5", "vm-5, t5 ,,2 , 6.5 ")
            .replace("vm-9,", "\n\nvm-9,")
            .replace(",1050,", ", 1050 ,");
        same_as_sequential(&text);
        same_as_sequential(text.trim_end());
        same_as_sequential(&format!("{text}\n\n"));
        same_as_sequential(&text.replace("vm-70,", "   \nvm-70,"));
        same_as_sequential(&text.replace("vm-70,", "\n\n\nvm-70,x,"));
        same_as_sequential(&text.replace("vm-70,", "vm-70,t,\rvm-71,"));
        same_as_sequential(&text.replace("vm-70,", "\rvm-70,"));
        let crlf = text.replace('\n', "\r\n");
        same_as_sequential(&crlf);
        same_as_sequential(crlf.trim_end());
        same_as_sequential(&format!("{}\r", crlf.trim_end()));
        same_as_sequential(&crlf.replace("vm-70,", "\r\n\r\nvm-70,"));
        same_as_sequential(&crlf.replace("vm-70,", "\r\r\nvm-70,"));
        same_as_sequential(&crlf.replace("vm-70,", "\n\rvm-70,"));
        same_as_sequential(&crlf.replace("vm-70,", "\r\n\r\nvm-70,x,"));
        same_as_sequential(&crlf.replacen("\r\n", "\n", 50));
        let mut bytes = text.clone().into_bytes();
        let at = text.find("vm-100,").unwrap() + "vm-100,t9,type-0,1,2.5,low,1000,1500,".len();
        bytes[at] = 0xfe;
        same_as_sequential(&bytes);
        assert!(chunked(&bytes, 2, 64).is_ok(), "an extra column reads as U+FFFD");
        let mut bytes = text.clone().into_bytes();
        bytes[text.find("t9,type-0,1,2.5,low,1000").unwrap() + 1] = 0xfe;
        same_as_sequential(&bytes);
        assert!(chunked(&bytes, 2, 64).unwrap_err().contains("is not UTF-8"));
    }

    #[test]
    fn an_error_after_empty_lines_has_the_sequential_readers_line() {
        let text =
            trace(300).replace("vm-150,", "\n\n\nvm-150,").replace("vm-211,t3,type-1,4,5.5", "vm-211,t3,type-1,-4,5.5");
        let expected = sequential(&text).unwrap_err();
        assert!(expected.starts_with("line 216, column `cores`"), "{expected}");
        same_as_sequential(&text);
    }

    #[test]
    fn separators_are_found_in_every_position() {
        let mut chunk = [b'x'; 64];
        let naive = |chunk: &[u8]| {
            chunk.iter().enumerate().fold(0u64, |m, (i, &b)| m | u64::from(matches!(b, b',' | b'\n' | b'\r')) << i)
        };
        for i in 0..64 {
            for separator in [b',', b'\n', b'\r', 0, 0x80 | b',', b'-', b'\x0c', 0xff] {
                chunk[i] = separator;
                chunk[(i * 7 + 3) % 64] = b',';
                for len in [64, 63, 9, 8, 1, i + 1] {
                    assert_eq!(separators(&chunk[..len]), naive(&chunk[..len]), "{i} {separator} {len}");
                }
                chunk = [b'x'; 64];
            }
        }
        let all: Vec<u8> = (0..=255).collect();
        for chunk in all.chunks(64) {
            assert_eq!(separators(chunk), naive(chunk));
        }
        assert_eq!(separators(&[b','; 64]), u64::MAX);
    }
}
