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

/// A block of whole lines of the file and where it starts.
struct Job {
    index: usize,
    data: Vec<u8>,
    /// Line breaks before the block: its first line is line `lines_before + 1` of the file.
    lines_before: u64,
}

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
        parse_records(&mut reader, &layout, 0, &mut sink)?;
        return Ok(Parsed { extra_names: Arc::clone(layout.extra_names()), parts: vec![sink] });
    }
    let layout = {
        let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(&text.data[..header_end]);
        CsvLayout::from_header(reader.byte_headers().map_err(csv_error)?)?
    };
    let header_lines = count_lines(&text.data[..header_end]);
    text.data.drain(..header_end);
    text.has_newline = text.data.contains(&b'\n');
    let mut blocks = Blocks { text, lines_before: header_lines, index: 0, block: block.max(1), sequential: false };

    let parse = |job: &Job| -> Result<S, TraceError> {
        let mut sink = new_sink(layout.extra_names());
        parse_block(&job.data, &layout, job.lines_before, &mut sink)?;
        Ok(sink)
    };
    let mut results: Vec<(usize, Result<S, TraceError>)> = Vec::new();
    let read_result = if threads <= 1 {
        let mut read = Ok(());
        loop {
            match blocks.next(&mut input) {
                Ok(Some(job)) => {
                    let parsed = parse(&job);
                    let failed = parsed.is_err();
                    results.push((job.index, parsed));
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
                            let parsed = parse(&job);
                            if parsed.is_err() {
                                failed.store(true, Ordering::Relaxed);
                            }
                            done.push((job.index, parsed));
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
    results.sort_by_key(|(index, _)| *index);
    let mut parts = Vec::with_capacity(results.len());
    for (_, parsed) in results {
        parts.push(parsed?);
    }
    // A row error comes first: the sequential reader would have met it before the read failed.
    read_result?;
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
        self.data.iter().position(|&b| b == b'\n')
    }

    /// Reads once more from `input`.
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
        self.has_newline |= self.data[start..].contains(&b'\n');
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
struct Blocks {
    text: Pending,
    lines_before: u64,
    index: usize,
    block: usize,
    /// A quote was seen: the rest was handed out as one block.
    sequential: bool,
}

impl Blocks {
    fn next(&mut self, input: &mut impl Read) -> Result<Option<Job>, TraceError> {
        if self.sequential {
            return Ok(None);
        }
        // Read until a block's worth of whole lines is pending, or the text ends.
        while !(self.text.eof || (self.text.data.len() >= self.block && self.text.has_newline)) {
            self.text.fill(input).map_err(|error| self.shift(error))?;
        }
        if self.text.data.is_empty() {
            return Ok(None);
        }
        let cut = match self.text.data.iter().rposition(|&b| b == b'\n') {
            Some(i) if !self.text.eof => i + 1,
            _ => self.text.data.len(),
        };
        let rest = self.text.data.split_off(cut);
        let mut data = std::mem::replace(&mut self.text.data, rest);
        self.text.has_newline = self.text.data.contains(&b'\n');
        if data.contains(&b'"') {
            // A quoted field may hold a line break: the rest is one block, parsed in order.
            data.append(&mut self.text.data);
            let mut rest = Pending { data, has_newline: true, eof: self.text.eof };
            rest.read_to_end(input).map_err(|error| self.shift(error))?;
            data = rest.data;
            self.sequential = true;
        }
        let job = Job { index: self.index, data, lines_before: self.lines_before };
        self.index += 1;
        self.lines_before += count_lines(&job.data);
        Ok(Some(job))
    }

    /// A read error's line counted from the start of the file rather than of the pending text.
    fn shift(&self, error: TraceError) -> TraceError {
        match error {
            TraceError::Csv { line, message } => TraceError::Csv { line: line + self.lines_before, message },
            other => other,
        }
    }
}

fn count_lines(data: &[u8]) -> u64 {
    data.iter().filter(|&&b| b == b'\n').count() as u64
}

/// Parses `data`, whole lines of the file after `lines_before` line breaks, into `sink`.
fn parse_block(data: &[u8], layout: &CsvLayout, lines_before: u64, sink: &mut impl RowSink) -> Result<(), TraceError> {
    // `flexible`: the header is not in the block, so the field count is checked against it here.
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(data);
    parse_records(&mut reader, layout, lines_before, sink)
}

fn parse_records(
    reader: &mut csv::Reader<&[u8]>,
    layout: &CsvLayout,
    lines_before: u64,
    sink: &mut impl RowSink,
) -> Result<(), TraceError> {
    let mut row = csv::ByteRecord::new();
    while reader.read_byte_record(&mut row).map_err(|error| shift(csv_error(error), lines_before))? {
        let line = lines_before + row.position().map_or(0, csv::Position::line);
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

fn shift(error: TraceError, lines_before: u64) -> TraceError {
    match error {
        TraceError::Csv { line, message } => TraceError::Csv { line: line + lines_before, message },
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
    fn sequential(text: &str) -> Result<Vec<VmRecord>, String> {
        let reader = CsvTraceReader::from_reader(Cursor::new(text.as_bytes().to_vec())).map_err(|e| e.to_string())?;
        reader.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())
    }

    fn chunked(text: &str, threads: usize, block: usize) -> Result<Vec<VmRecord>, String> {
        let parsed = read_parallel_with(Cursor::new(text.as_bytes()), threads, block, |names| Records {
            names: Arc::clone(names),
            records: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
        if let Ok(reader) = CsvTraceReader::from_reader(Cursor::new(text.as_bytes().to_vec())) {
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

    fn same_as_sequential(text: &str) {
        let expected = sequential(text);
        for threads in [1, 2, 3] {
            for block in [1, 7, 64, 1000, BLOCK] {
                assert_eq!(chunked(text, threads, block), expected, "threads {threads}, block {block}:\n{text}");
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
}
