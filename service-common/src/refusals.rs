//! Requests and connections a service turned away: counted in Prometheus
//! (`http_refused_total{reason}`) and summarised in at most one WARN line per second.
//!
//! Under overload a service may refuse thousands of requests a second; one log line each would cost
//! more than the refusals themselves and bury everything else in the log, so each refusal only bumps
//! a counter, and [`report_every_second`] turns the counts into a single summary line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The Prometheus counter of refusals, labelled by `reason`.
pub const REFUSED_METRIC: &str = "http_refused_total";

/// Why a request or connection was turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// More requests in flight than the admission limit: 503 with `Retry-After`.
    Overloaded,
    /// The request took longer than the request timeout: 503.
    Timeout,
    /// More open connections than the connection cap: the connection was closed at once.
    ConnectionCap,
    /// A connection started a request but did not finish its head in time: closed.
    HeaderTimeout,
}

impl Refusal {
    const ALL: [Refusal; 4] = [Refusal::Overloaded, Refusal::Timeout, Refusal::ConnectionCap, Refusal::HeaderTimeout];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Overloaded => "overloaded",
            Refusal::Timeout => "timeout",
            Refusal::ConnectionCap => "connection_cap",
            Refusal::HeaderTimeout => "header_timeout",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counts since the last summary line, one per [`Refusal`]. Process-wide, like the Prometheus
/// recorder: a binary serves one listener.
static SINCE_LAST_REPORT: [AtomicU64; 4] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Records one refusal: the Prometheus counter and the count of the next summary line. No logging
/// here, whatever the rate.
pub fn record(refusal: Refusal) {
    metrics::counter!(REFUSED_METRIC, "reason" => refusal.label()).increment(1);
    SINCE_LAST_REPORT[refusal.index()].fetch_add(1, Ordering::Relaxed);
}

/// Takes the counts since the last call, or `None` when nothing was refused.
fn take_counts() -> Option<[(Refusal, u64); 4]> {
    let counts = Refusal::ALL.map(|refusal| (refusal, SINCE_LAST_REPORT[refusal.index()].swap(0, Ordering::Relaxed)));
    counts.iter().any(|(_, count)| *count > 0).then_some(counts)
}

/// Logs, once a second and only when something was refused, one WARN line with how many requests
/// and connections were refused and why. Runs until dropped.
pub async fn report_every_second() {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Some(counts) = take_counts() {
            let [(_, overloaded), (_, timeout), (_, connection_cap), (_, header_timeout)] = counts;
            tracing::warn!(
                overloaded,
                timeout,
                connection_cap,
                header_timeout,
                "refused requests or connections in the last second (503 overloaded/timeout; closed: connection cap, header timeout)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_summarised_once_then_reset() {
        // Other tests in this binary do not refuse anything, so the counts are this test's own.
        let _ = take_counts();
        record(Refusal::Overloaded);
        record(Refusal::Overloaded);
        record(Refusal::ConnectionCap);
        let counts = take_counts().expect("refusals were recorded");
        assert_eq!(counts[Refusal::Overloaded.index()], (Refusal::Overloaded, 2));
        assert_eq!(counts[Refusal::ConnectionCap.index()], (Refusal::ConnectionCap, 1));
        assert_eq!(counts[Refusal::Timeout.index()], (Refusal::Timeout, 0));
        assert!(take_counts().is_none(), "a second summary must not repeat the first one's counts");
    }
}
