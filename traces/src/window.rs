//! The one way to cut a trace to a time window, shared by the replay client (`vmreplay`) and the
//! simulator: the VMs that start in `[from_s, from_s + duration_s)`, the earliest `max_vms` of them,
//! in start order (ties in trace order), the instant the window ends, and optionally the **warm-up**:
//! the VMs that started before the window and still run at its start.
//!
//! [`select`] reads the records in one pass. Without warm-up and with a cap it keeps at most
//! `max_vms` records in memory, so a multi-million-row trace costs no more than its window.
//! [`first_start`] is the earliest start of a trace, the usual default window start.

use crate::error::TraceError;
use crate::record::VmRecord;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt;

/// Which part of a trace to keep.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowSpec {
    /// Trace time the window starts at; the caller's default when absent (see [`select`]).
    pub from_s: Option<f64>,
    /// Trace seconds the window lasts; up to the last VM start when absent.
    pub duration_s: Option<f64>,
    /// At most this many VMs starting in the window (the earliest ones); no cap when absent.
    pub max_vms: Option<usize>,
}

/// A setting of [`WindowSpec`], for error messages in the caller's own terms (a flag, a config key).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WindowField {
    FromS,
    DurationS,
    MaxVms,
}

impl WindowField {
    /// The field's name, as in configuration files: `from_s`, `duration_s`, `max_vms`.
    pub fn name(self) -> &'static str {
        match self {
            WindowField::FromS => "from_s",
            WindowField::DurationS => "duration_s",
            WindowField::MaxVms => "max_vms",
        }
    }

    /// The command-line flag of the field: `--from-s`, `--duration-s`, `--max-vms`.
    pub fn flag(self) -> &'static str {
        match self {
            WindowField::FromS => "--from-s",
            WindowField::DurationS => "--duration-s",
            WindowField::MaxVms => "--max-vms",
        }
    }
}

impl fmt::Display for WindowField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A [`WindowSpec`] setting out of range; `message` reads after the field's name.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidWindow {
    pub field: WindowField,
    pub message: String,
}

fn invalid(field: WindowField, message: impl Into<String>) -> InvalidWindow {
    InvalidWindow { field, message: message.into() }
}

fn check_from(from_s: f64) -> Result<(), InvalidWindow> {
    if from_s.is_finite() {
        Ok(())
    } else {
        Err(invalid(WindowField::FromS, format!("must be a finite number of trace seconds, got {from_s}")))
    }
}

impl WindowSpec {
    /// Checks every setting: a finite start, a positive finite duration, a cap of at least one VM.
    pub fn validate(&self) -> Result<(), InvalidWindow> {
        if let Some(from_s) = self.from_s {
            check_from(from_s)?;
        }
        if let Some(duration) = self.duration_s {
            if !(duration.is_finite() && duration > 0.0) {
                return Err(invalid(
                    WindowField::DurationS,
                    format!("must be > 0 trace seconds (leave it out for no end), got {duration}"),
                ));
            }
        }
        if self.max_vms == Some(0) {
            return Err(invalid(WindowField::MaxVms, "must be at least 1 (leave it out for no cap)"));
        }
        Ok(())
    }
}

/// Whether [`select`] also keeps the VMs already running at the window start.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Warmup {
    /// Only the VMs that start in the window (the replay client: it cannot place VMs in the past).
    Skip,
    /// Also the VMs that start before the window and end after its start, or never (the
    /// simulator places them first). They are not counted against `max_vms` and not capped.
    Keep,
}

/// Why a window cannot be cut.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("reading the trace: {0}")]
    Trace(#[from] TraceError),
    #[error("the trace holds no VM")]
    EmptyTrace,
    #[error(
        "no VM of the trace starts in the window {window}; the trace's VMs start between {first_start_s} s and \
         {last_start_s} s"
    )]
    EmptyWindow { window: String, first_start_s: f64, last_start_s: f64 },
    #[error("{0}")]
    Invalid(#[from] InvalidWindow),
}

/// The records of a window and what the pass learnt about the whole trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// Window start.
    pub from_s: f64,
    /// Window end: `from_s + duration_s`, or the last kept start when there is no duration or
    /// `max_vms` cut the window short.
    pub to_s: f64,
    /// The VMs starting in the window, earliest first (ties in trace order); never empty.
    pub vms: Vec<VmRecord>,
    /// With [`Warmup::Keep`], the VMs running at the window start, in start order (ties in trace
    /// order); empty with [`Warmup::Skip`].
    pub warmup: Vec<VmRecord>,
    /// True when `max_vms` left VMs of the window out.
    pub truncated: bool,
    /// Trace records read.
    pub records_read: u64,
    /// Earliest and latest start in the whole trace.
    pub first_start_s: f64,
    pub last_start_s: f64,
    /// Latest start or end in the whole trace: up to when the trace observed its VMs.
    pub trace_end_s: f64,
}

/// The earliest VM start of a trace; [`WindowError::EmptyTrace`] when it holds no VM.
pub fn first_start<R: Borrow<VmRecord>>(
    records: impl IntoIterator<Item = Result<R, TraceError>>,
) -> Result<f64, WindowError> {
    let mut first: Option<f64> = None;
    for record in records {
        let start = record?.borrow().start_s;
        first = Some(first.map_or(start, |f| f.min(start)));
    }
    first.ok_or(WindowError::EmptyTrace)
}

/// A record waiting in a selection, ordered by (start, position in the trace): in the window's
/// max-heap the top is the latest one, the first to drop when `max_vms` is exceeded.
struct Candidate {
    start_s: f64,
    seq: u64,
    record: VmRecord,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.start_s.total_cmp(&other.start_s).then(self.seq.cmp(&other.seq))
    }
}

/// Cuts the window `spec` out of `records` (any order) in one pass.
///
/// The window starts at `spec.from_s`, or at `default_from_s` when the spec gives none (the
/// replay client passes the trace's [`first_start`], the simulator that start but not before 0).
/// A record is in the window when `from_s <= start < from_s + duration_s`; of those, the earliest
/// `max_vms` are kept. Errors: an invalid spec or start ([`WindowError::Invalid`]), a record that
/// cannot be read, no record at all, no record in the window (the message says where the trace's
/// starts lie).
pub fn select(
    records: impl IntoIterator<Item = Result<VmRecord, TraceError>>,
    spec: &WindowSpec,
    default_from_s: f64,
    warmup: Warmup,
) -> Result<Window, WindowError> {
    spec.validate()?;
    let from_s = spec.from_s.unwrap_or(default_from_s);
    check_from(from_s)?;
    let window_end = spec.duration_s.map_or(f64::INFINITY, |d| from_s + d);
    let cap = spec.max_vms.unwrap_or(usize::MAX);
    let mut heap = BinaryHeap::new();
    let mut running = Vec::new();
    let mut truncated = false;
    let mut records_read = 0u64;
    let (mut first_start_s, mut last_start_s, mut trace_end_s) = (f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY);
    for record in records {
        let record = record?;
        records_read += 1;
        first_start_s = first_start_s.min(record.start_s);
        last_start_s = last_start_s.max(record.start_s);
        trace_end_s = trace_end_s.max(record.start_s).max(record.end_s.unwrap_or(f64::NEG_INFINITY));
        let candidate = Candidate { start_s: record.start_s, seq: records_read, record };
        if candidate.start_s < from_s {
            if warmup == Warmup::Keep && candidate.record.end_s.is_none_or(|end| end > from_s) {
                running.push(candidate);
            }
        } else if candidate.start_s < window_end {
            heap.push(candidate);
            if heap.len() > cap {
                heap.pop();
                truncated = true;
            }
        }
    }
    if records_read == 0 {
        return Err(WindowError::EmptyTrace);
    }
    let vms: Vec<VmRecord> = heap.into_sorted_vec().into_iter().map(|c| c.record).collect();
    let Some(last) = vms.last() else {
        let window = if window_end.is_finite() {
            format!("[{from_s} s, {window_end} s)")
        } else {
            format!("from {from_s} s on")
        };
        return Err(WindowError::EmptyWindow { window, first_start_s, last_start_s });
    };
    let to_s = if window_end.is_finite() && !truncated { window_end } else { last.start_s };
    running.sort_unstable();
    Ok(Window {
        from_s,
        to_s,
        vms,
        warmup: running.into_iter().map(|c| c.record).collect(),
        truncated,
        records_read,
        first_start_s,
        last_start_s,
        trace_end_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ExtraColumns;
    use domain::Priority;

    fn record(id: &str, start_s: f64, end_s: Option<f64>) -> VmRecord {
        VmRecord {
            vm_id: id.to_owned(),
            tenant_id: "t1".to_owned(),
            vm_type: "D2".to_owned(),
            cores: 2.0,
            memory_gib: 8.0,
            priority: Priority::Regular,
            start_s,
            end_s,
            extra: ExtraColumns::default(),
        }
    }

    fn ok(records: Vec<VmRecord>) -> impl Iterator<Item = Result<VmRecord, TraceError>> {
        records.into_iter().map(Ok)
    }

    fn spec(from_s: Option<f64>, duration_s: Option<f64>, max_vms: Option<usize>) -> WindowSpec {
        WindowSpec { from_s, duration_s, max_vms }
    }

    fn ids(records: &[VmRecord]) -> Vec<&str> {
        records.iter().map(|r| r.vm_id.as_str()).collect()
    }

    #[test]
    fn the_window_keeps_its_starts_in_start_order_with_ties_in_trace_order() {
        let records = vec![
            record("late", 500.0, None),
            record("b", 20.0, Some(30.0)),
            record("before", 5.0, Some(80.0)),
            record("a", 10.0, Some(400.0)),
            record("a2", 10.0, None),
            record("edge", 110.0, None),
        ];
        let window = select(ok(records), &spec(Some(10.0), Some(100.0), None), 0.0, Warmup::Skip).unwrap();
        assert_eq!(ids(&window.vms), ["a", "a2", "b"], "the start is in, the end is out");
        assert!(window.warmup.is_empty(), "no warm-up asked for");
        assert_eq!((window.from_s, window.to_s, window.records_read, window.truncated), (10.0, 110.0, 6, false));
        assert_eq!((window.first_start_s, window.last_start_s, window.trace_end_s), (5.0, 500.0, 500.0));
    }

    #[test]
    fn without_a_duration_the_window_ends_at_its_last_start_and_the_default_start_applies() {
        let records = || ok(vec![record("x", 300.0, Some(900.0)), record("y", 100.0, None), record("z", 50.0, None)]);
        let window = select(records(), &spec(None, None, None), 100.0, Warmup::Skip).unwrap();
        assert_eq!(ids(&window.vms), ["y", "x"]);
        assert_eq!((window.from_s, window.to_s, window.trace_end_s), (100.0, 300.0, 900.0));
        // A given start wins over the default.
        let window = select(records(), &spec(Some(0.0), None, None), 100.0, Warmup::Skip).unwrap();
        assert_eq!((ids(&window.vms), window.from_s), (vec!["z", "y", "x"], 0.0));
    }

    #[test]
    fn max_vms_keeps_the_earliest_and_ends_the_window_at_the_last_of_them() {
        let records = || ok((0..10).rev().map(|i| record(&format!("v{i}"), f64::from(i) * 10.0, None)).collect());
        let window = select(records(), &spec(None, Some(1000.0), Some(3)), 0.0, Warmup::Skip).unwrap();
        assert_eq!(ids(&window.vms), ["v0", "v1", "v2"]);
        assert_eq!((window.to_s, window.truncated, window.records_read), (20.0, true, 10));
        // A cap the window does not reach changes nothing: the window keeps its own end.
        let window = select(records(), &spec(None, Some(1000.0), Some(10)), 0.0, Warmup::Skip).unwrap();
        assert_eq!((window.vms.len(), window.to_s, window.truncated), (10, 1000.0, false));
        // Ties at the cap: the earlier in the trace stays.
        let tied = vec![record("first", 5.0, None), record("second", 5.0, None), record("zero", 0.0, None)];
        let window = select(ok(tied), &spec(None, None, Some(2)), 0.0, Warmup::Skip).unwrap();
        assert_eq!(ids(&window.vms), ["zero", "first"]);
    }

    #[test]
    fn with_a_cap_and_no_warm_up_the_pass_holds_at_most_the_cap_in_memory() {
        // Every record shares one Arc of column names: its count, less the generator's own, is the
        // number of records alive, observed as each next record is asked for.
        let names: std::sync::Arc<[String]> = vec!["pool".to_owned()].into();
        let most_alive = std::cell::Cell::new(0usize);
        let records = (0..10_000u32).rev().map(|i| {
            most_alive.set(most_alive.get().max(std::sync::Arc::strong_count(&names) - 1));
            let mut r = record(&format!("v{i}"), f64::from(i), None);
            r.extra = ExtraColumns::new(names.clone(), vec!["p".to_owned()]);
            Ok(r)
        });
        let window = select(records, &spec(Some(0.0), None, Some(5)), 0.0, Warmup::Skip).unwrap();
        assert_eq!(ids(&window.vms), ["v0", "v1", "v2", "v3", "v4"]);
        assert!(most_alive.get() <= 5, "{} records were alive at once", most_alive.get());
        // With the warm-up kept, what runs at the start is kept too, however much it is.
        let most_alive = std::cell::Cell::new(0usize);
        let records = (0..1_000u32).map(|i| {
            most_alive.set(most_alive.get().max(std::sync::Arc::strong_count(&names) - 1));
            let mut r = record(&format!("v{i}"), f64::from(i), None);
            r.extra = ExtraColumns::new(names.clone(), vec!["p".to_owned()]);
            Ok(r)
        });
        let window = select(records, &spec(Some(990.0), None, Some(5)), 0.0, Warmup::Keep).unwrap();
        assert_eq!((window.warmup.len(), window.vms.len()), (990, 5));
        assert!(most_alive.get() >= 990);
    }

    #[test]
    fn the_warm_up_is_what_runs_at_the_window_start_in_start_order_and_is_not_capped() {
        let records = vec![
            record("ended-before", -50.0, Some(50.0)),
            record("ends-at-start", -40.0, Some(100.0)),
            record("runs-on", 20.0, Some(150.0)),
            record("never-ends", -60.0, None),
            record("tie-a", 20.0, None),
            record("in-1", 100.0, Some(120.0)),
            record("in-2", 130.0, None),
        ];
        let window = select(ok(records.clone()), &spec(Some(100.0), None, Some(1)), 0.0, Warmup::Keep).unwrap();
        assert_eq!(ids(&window.warmup), ["never-ends", "runs-on", "tie-a"]);
        assert_eq!(ids(&window.vms), ["in-1"]);
        assert_eq!((window.to_s, window.truncated), (100.0, true));
        let skipped = select(ok(records), &spec(Some(100.0), None, Some(1)), 0.0, Warmup::Skip).unwrap();
        assert!(skipped.warmup.is_empty());
        assert_eq!(ids(&skipped.vms), ["in-1"]);
    }

    #[test]
    fn an_empty_window_names_the_window_and_where_the_trace_starts() {
        let records = || ok(vec![record("a", 50.0, None), record("b", -20.0, Some(10.0))]);
        let err = select(records(), &spec(Some(1000.0), None, None), 0.0, Warmup::Keep).unwrap_err();
        assert!(
            matches!(err, WindowError::EmptyWindow { first_start_s, last_start_s, .. }
                if first_start_s == -20.0 && last_start_s == 50.0),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "no VM of the trace starts in the window from 1000 s on; the trace's VMs start between -20 s and 50 s"
        );
        let err = select(records(), &spec(None, Some(10.0), None), 60.0, Warmup::Skip).unwrap_err();
        assert!(err.to_string().contains("window [60 s, 70 s)"), "{err}");
        // Only running VMs before the window: still empty (the warm-up alone is no window).
        let err = select(records(), &spec(Some(51.0), None, None), 0.0, Warmup::Keep).unwrap_err();
        assert!(matches!(err, WindowError::EmptyWindow { .. }), "{err:?}");
    }

    #[test]
    fn an_empty_trace_and_a_read_error_are_reported_as_such() {
        let err = select(ok(Vec::new()), &WindowSpec::default(), 0.0, Warmup::Skip).unwrap_err();
        assert!(matches!(err, WindowError::EmptyTrace), "{err:?}");
        assert_eq!(err.to_string(), "the trace holds no VM");
        assert!(matches!(first_start(ok(Vec::new())), Err(WindowError::EmptyTrace)));
        let broken = vec![Ok(record("a", 0.0, None)), Err(TraceError::Csv { line: 3, message: "bad row".into() })];
        let err = select(broken, &WindowSpec::default(), 0.0, Warmup::Skip).unwrap_err();
        assert_eq!(err.to_string(), "reading the trace: line 3: bad row");
    }

    #[test]
    fn first_start_is_the_minimum_of_owned_or_borrowed_records() {
        let records = vec![record("a", 50.0, None), record("b", -20.0, None), record("c", 7.0, None)];
        assert_eq!(first_start(records.iter().map(Ok)).unwrap(), -20.0);
        assert_eq!(first_start(ok(records)).unwrap(), -20.0);
    }

    #[test]
    fn invalid_settings_name_their_field() {
        let check = |spec: WindowSpec| spec.validate().unwrap_err();
        let err = check(spec(Some(f64::NAN), None, None));
        assert_eq!((err.field, err.field.flag()), (WindowField::FromS, "--from-s"));
        assert_eq!(err.to_string(), "from_s: must be a finite number of trace seconds, got NaN");
        let err = check(spec(None, Some(0.0), None));
        assert_eq!(err.field, WindowField::DurationS);
        assert!(err.message.starts_with("must be > 0 trace seconds"), "{err}");
        assert_eq!(check(spec(None, Some(f64::INFINITY), None)).field, WindowField::DurationS);
        assert_eq!(check(spec(None, None, Some(0))).field, WindowField::MaxVms);
        assert_eq!(check(spec(None, None, Some(0))).field.flag(), "--max-vms");
        assert!(spec(Some(-5.0), Some(1.0), Some(1)).validate().is_ok());
        // select checks the spec and the default start it falls back on.
        let records = || ok(vec![record("a", 0.0, None)]);
        let err = select(records(), &spec(None, None, Some(0)), 0.0, Warmup::Skip).unwrap_err();
        assert!(matches!(err, WindowError::Invalid(InvalidWindow { field: WindowField::MaxVms, .. })), "{err:?}");
        let err = select(records(), &WindowSpec::default(), f64::INFINITY, Warmup::Skip).unwrap_err();
        assert!(matches!(err, WindowError::Invalid(InvalidWindow { field: WindowField::FromS, .. })), "{err:?}");
    }
}
