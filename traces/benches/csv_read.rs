//! CSV trace reading speed, in rows per second, beside simple references measured in the same run.
//!
//! `cargo bench -p traces --bench csv_read [-- PATH]`. PATH defaults to the Azure V1 test trace in
//! `../shared/data` when present, else to a synthetic trace generated into a temporary directory.
//! Each figure is the best of several runs.

use flate2::read::MultiGzDecoder;
use std::io::{BufRead, BufReader, Cursor, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use traces::csv_format::{CsvTraceReader, CsvTraceWriter};
use traces::synthetic::{generate, SyntheticConfig};

const RUNS: usize = 5;

fn best_of<T>(mut run: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let out = run();
        best = best.min(started.elapsed());
        last = Some(out);
    }
    (best, last.expect("at least one run"))
}

fn trace_path(_keep: &mut Option<tempfile::TempDir>) -> PathBuf {
    if let Some(arg) = std::env::args().skip(1).find(|a| !a.starts_with('-')) {
        return PathBuf::from(arg);
    }
    let shared =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/azure-v1-tracegen/trace-test.csv.gz");
    if let Ok(shared) = shared.canonicalize() {
        return shared;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("synthetic.csv.gz");
    let records = generate(&SyntheticConfig { span_days: 28.0, ..SyntheticConfig::default() });
    let mut writer = CsvTraceWriter::create(&path, records[0].extra.names()).expect("create");
    records.iter().for_each(|r| writer.write(r).expect("write"));
    writer.finish().expect("finish");
    *_keep = Some(dir);
    path
}

fn decompress(path: &PathBuf) -> Vec<u8> {
    let file = std::fs::File::open(path).expect("open trace");
    let mut bytes = Vec::new();
    if path.extension().is_some_and(|e| e == "gz") {
        MultiGzDecoder::new(BufReader::new(file)).read_to_end(&mut bytes).expect("gunzip");
    } else {
        BufReader::new(file).read_to_end(&mut bytes).expect("read");
    }
    bytes
}

/// The simplest reader one would write: lines, split on commas, parse the numeric columns.
fn naive_rows(bytes: &[u8]) -> usize {
    let mut rows = 0;
    for line in BufReader::new(bytes).lines().skip(1) {
        let line = line.expect("utf-8 line");
        let fields: Vec<String> = line.split(',').map(str::to_owned).collect();
        let numbers: f64 = [3, 4, 6].iter().map(|&i| fields[i].parse::<f64>().unwrap_or(0.0)).sum();
        std::hint::black_box((fields, numbers));
        rows += 1;
    }
    rows
}

/// Consumes every record, failing on the first bad one.
fn count_records(reader: CsvTraceReader) -> usize {
    let mut rows = 0;
    for record in reader {
        std::hint::black_box(record.expect("row"));
        rows += 1;
    }
    rows
}

fn main() {
    let mut keep = None;
    let path = trace_path(&mut keep);
    let bytes = decompress(&path);
    println!("trace: {} ({:.1} MB uncompressed)", path.display(), bytes.len() as f64 / 1e6);

    let (t_gunzip, _) = best_of(|| decompress(&path).len());
    let (t_naive, rows) = best_of(|| naive_rows(&bytes));
    let (t_mem, mem_rows) =
        best_of(|| count_records(CsvTraceReader::from_reader(Cursor::new(bytes.clone())).expect("header")));
    let (t_file, file_rows) = best_of(|| count_records(CsvTraceReader::open(&path).expect("open")));
    assert_eq!((mem_rows, file_rows), (rows, rows));

    let rate = |t: Duration| rows as f64 / t.as_secs_f64() / 1e6;
    println!("{rows} rows, best of {RUNS} runs");
    println!("| what | time | M rows/s |");
    println!("|---|---:|---:|");
    println!("| reference: gunzip only | {:.0} ms | {:.2} |", t_gunzip.as_secs_f64() * 1e3, rate(t_gunzip));
    println!(
        "| reference: naive split reader, in memory | {:.0} ms | {:.2} |",
        t_naive.as_secs_f64() * 1e3,
        rate(t_naive)
    );
    println!("| CsvTraceReader, in memory | {:.0} ms | {:.2} |", t_mem.as_secs_f64() * 1e3, rate(t_mem));
    println!("| CsvTraceReader, from the file | {:.0} ms | {:.2} |", t_file.as_secs_f64() * 1e3, rate(t_file));
    println!("naive / CsvTraceReader (in memory): {:.2}x", t_naive.as_secs_f64() / t_mem.as_secs_f64());
}
