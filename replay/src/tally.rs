//! What the run's requests and releases came to ([`Tally`]), and latency percentiles.

use crate::*;
use serde::Serialize;
use std::collections::BTreeMap;

/// Releases of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReleaseTally {
    /// `DELETE` requests sent (or attempted).
    pub requests: u64,
    /// Answered 2xx.
    pub released: u64,
    /// Answered 404: the VM was already gone.
    pub not_found: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// Of the requests, those sent at the end of the run for VMs still alive.
    pub at_end: u64,
    /// VMs left placed at the end (`--keep`, or releases that failed or were interrupted).
    pub left_placed: u64,
}

/// Everything counted during the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    pub requests: u64,
    pub placed: u64,
    pub rejected: u64,
    pub rejected_by_code: BTreeMap<String, u64>,
    pub replayed: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<String, u64>,
    /// The first few distinct error messages, to show what went wrong.
    pub error_samples: Vec<String>,
    pub predictions_by_source: BTreeMap<String, u64>,
    pub client_latency_us: Vec<u64>,
    pub server_total_us: Vec<u64>,
    pub releases: ReleaseTally,
}

impl Tally {
    pub fn record_allocation(&mut self, answer: &Answer, client_us: u64) {
        self.requests += 1;
        self.client_latency_us.push(client_us);
        if let Some(us) = answer.server_total_us {
            self.server_total_us.push(us);
        }
        for source in answer.prediction_sources() {
            *self.predictions_by_source.entry(source).or_default() += 1;
        }
        match &answer.outcome {
            Outcome::Placed => self.placed += 1,
            Outcome::Rejected { code } => {
                self.rejected += 1;
                *self.rejected_by_code.entry(code.clone()).or_default() += 1;
            }
            Outcome::Replayed { .. } => self.replayed += 1,
            Outcome::Failed { kind, detail } => {
                self.errors += 1;
                *self.errors_by_kind.entry(kind.clone()).or_default() += 1;
                self.note_error(format!("POST /allocate: {kind}: {detail}"));
            }
        }
    }

    /// Records a release: its HTTP status, or the transport error's kind and message.
    pub fn record_release(&mut self, answer: Result<u16, (String, String)>, at_end: bool) {
        let releases = &mut self.releases;
        releases.requests += 1;
        releases.at_end += u64::from(at_end);
        let kind = match answer {
            Ok(status) if (200..300).contains(&status) => {
                releases.released += 1;
                return;
            }
            Ok(404) => {
                releases.not_found += 1;
                return;
            }
            Ok(status) => {
                self.note_error(format!("DELETE /allocate: HTTP {status}"));
                format!("HTTP {status}")
            }
            Err((kind, detail)) => {
                self.note_error(format!("DELETE /allocate: transport: {kind}: {detail}"));
                format!("transport: {kind}")
            }
        };
        let releases = &mut self.releases;
        releases.errors += 1;
        *releases.errors_by_kind.entry(kind).or_default() += 1;
    }

    fn note_error(&mut self, message: String) {
        if self.error_samples.len() < ERROR_SAMPLES && !self.error_samples.contains(&message) {
            self.error_samples.push(message);
        }
    }

    /// Share of allocation requests that failed (0 when none was sent).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 / self.requests as f64
        }
    }
}

/// The `q` quantile (0..=1) of sorted values by nearest rank: an observed value, never an
/// interpolation; `None` for no values.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50 / p99 / max of one latency, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl LatencySummary {
    pub fn from_us(samples_us: &[u64]) -> Self {
        let mut ms: Vec<f64> = samples_us.iter().map(|&us| us as f64 / 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        LatencySummary {
            count: ms.len(),
            p50_ms: percentile(&ms, 0.50),
            p99_ms: percentile(&ms, 0.99),
            max_ms: ms.last().copied(),
        }
    }
}
