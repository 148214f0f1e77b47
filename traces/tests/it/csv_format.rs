//! The project's CSV format: round trips exactly, and rejects malformed rows naming their line.

use domain::Priority;
use proptest::prelude::*;
use std::io::Cursor;
use std::sync::Arc;
use traces::csv_format::{CsvTraceReader, CsvTraceWriter};
use traces::{ExtraColumns, TraceError, TraceSource, VmRecord};

fn record(id: &str, start_s: f64, end_s: Option<f64>, names: &Arc<[String]>, values: &[&str]) -> VmRecord {
    VmRecord {
        vm_id: id.to_owned(),
        tenant_id: "tenant-1".to_owned(),
        vm_type: "D2".to_owned(),
        cores: 2.0,
        memory_gib: 1.75,
        priority: Priority::Regular,
        start_s,
        end_s,
        extra: ExtraColumns::new(Arc::clone(names), values.iter().map(|v| v.to_string()).collect()),
    }
}

fn write_and_read(path: &std::path::Path, records: &[VmRecord], names: &[String]) -> Vec<VmRecord> {
    let mut writer = CsvTraceWriter::create(path, names).unwrap();
    records.iter().for_each(|r| writer.write(r).unwrap());
    writer.finish().unwrap();
    CsvTraceReader::open(path).unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn round_trip_keeps_censored_negative_start_and_extra_columns() {
    let dir = tempfile::tempdir().unwrap();
    let names: Arc<[String]> = vec!["batch_size".to_owned(), "os".to_owned()].into();
    let mut low = record("low, \"quoted\"", 10.5, Some(10.5), &names, &["1", "windows"]);
    low.priority = Priority::Low;
    low.tenant_id = String::new();
    let records = vec![
        record("running-before", -3_600.25, Some(7_200.0), &names, &["3", "linux"]),
        record("censored", 100.0, None, &names, &["1", ""]),
        record("running-throughout", -1e6, None, &names, &["2", "linux"]),
        low,
    ];
    for file in ["trace.csv", "trace.csv.gz"] {
        let back = write_and_read(&dir.path().join(file), &records, &names);
        assert_eq!(back, records, "{file}");
        assert!(back[1].is_censored() && back[2].is_censored());
        assert_eq!(back[0].lifetime_s(), Some(10_800.25));
    }
}

#[test]
fn columns_may_come_in_any_order() {
    let text = "end_s,start_s,priority,memory_gib,cores,vm_type,tenant_id,vm_id,zone\n,5,low,4,1,F1,t,v1,west\n";
    let records: Vec<VmRecord> =
        CsvTraceReader::from_reader(Cursor::new(text)).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0].vm_id.as_str(), records[0].start_s, records[0].end_s), ("v1", 5.0, None));
    assert_eq!(records[0].extra.get("zone"), Some("west"));
}

const HEADER: &str = "vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s\n";
const GOOD: &str = "v,t,a,1,2,regular,0,10\n";

fn first_error(body: &str) -> TraceError {
    let text = format!("{HEADER}{GOOD}{GOOD}{body}");
    CsvTraceReader::from_reader(Cursor::new(text))
        .unwrap()
        .find_map(Result::err)
        .unwrap_or_else(|| panic!("no error for {body:?}"))
}

#[test]
fn malformed_rows_are_rejected_with_their_line_number() {
    let cases = [
        ("v,t,a,one,2,regular,0,10\n", "cores"),
        ("v,t,a,0,2,regular,0,10\n", "cores"),
        ("v,t,a,1,-2,regular,0,10\n", "memory_gib"),
        ("v,t,a,1,NaN,regular,0,10\n", "memory_gib"),
        ("v,t,a,1,2,urgent,0,10\n", "priority"),
        ("v,t,a,1,2,regular,,10\n", "start_s"),
        ("v,t,a,1,2,regular,inf,10\n", "start_s"),
        ("v,t,a,1,2,regular,20,10\n", "end_s"),
        (",t,a,1,2,regular,0,10\n", "vm_id"),
    ];
    for (row, column) in cases {
        match first_error(row) {
            TraceError::BadField { line, column: got, .. } => {
                assert_eq!((line, got.as_str()), (4, column), "{row}");
            }
            other => panic!("{row}: unexpected {other}"),
        }
    }
    match first_error("v,t,a,1,2,regular,0\n") {
        TraceError::Csv { line, message } => assert_eq!(line, 4, "{message}"),
        other => panic!("unexpected {other}"),
    }
    let message = first_error("v,t,a,1,2,urgent,0,10\n").to_string();
    assert!(message.contains("line 4") && message.contains("priority"), "{message}");
}

#[test]
fn a_header_without_a_required_column_is_rejected() {
    let err =
        CsvTraceReader::from_reader(Cursor::new("vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s\n")).err();
    assert!(matches!(err, Some(TraceError::MissingColumn { column: "end_s", .. })), "{err:?}");
}

#[test]
fn reading_stops_after_the_first_error() {
    let text = format!("{HEADER}v,t,a,x,2,regular,0,10\n{GOOD}");
    let results: Vec<_> = CsvTraceReader::from_reader(Cursor::new(text)).unwrap().collect();
    assert_eq!(results.len(), 1);
    assert!(results[0].is_err());
}

#[test]
fn the_source_is_chosen_by_extension() {
    assert!(matches!(TraceSource::from_path("a.csv.gz", None), Ok(TraceSource::Csv(_))));
    assert!(matches!(TraceSource::from_path("a.CSV", None), Ok(TraceSource::Csv(_))));
    assert!(matches!(TraceSource::from_path("a.sqlite", None), Err(TraceError::AzureTrace(_))));
    assert!(matches!(TraceSource::from_path("a.parquet", None), Err(TraceError::UnsupportedFormat(_))));
}

fn arb_record(names: Arc<[String]>) -> impl Strategy<Value = VmRecord> {
    let text = "[a-zA-Z0-9 ,\"_\\-]{0,12}";
    (
        "[a-zA-Z0-9,\"\\-]{1,12}",
        text,
        text,
        (1e-3f64..1e3, 1e-3f64..1e4),
        any::<bool>(),
        -1e7f64..1e7,
        proptest::option::of(0f64..1e7),
        proptest::collection::vec(text, names.len()),
    )
        .prop_map(move |(vm_id, tenant_id, vm_type, (cores, memory_gib), low, start_s, life, values)| VmRecord {
            vm_id,
            tenant_id,
            vm_type,
            cores,
            memory_gib,
            priority: if low { Priority::Low } else { Priority::Regular },
            start_s,
            end_s: life.map(|l| start_s + l),
            extra: ExtraColumns::new(Arc::clone(&names), values),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_valid_records_round_trip_exactly(records in proptest::collection::vec(
        arb_record(vec!["batch_size".to_owned(), "note".to_owned()].into()), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let names = records[0].extra.names().to_vec();
        let back = write_and_read(&dir.path().join("t.csv"), &records, &names);
        prop_assert_eq!(back, records);
    }
}
