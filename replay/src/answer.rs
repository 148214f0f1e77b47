//! How to read the control service's answers ([`classify_answer`]), and each VM's prediction as a CSV row ([`PredictionRow`]).

use crate::*;
use domain::{AllocationOutcome, ControlDecision, LifetimeClass, LifetimePrediction, Problem};
use serde::Serialize;

/// What one allocation request came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Placed,
    Rejected {
        code: String,
    },
    /// The VM id had been requested before (an earlier run with the same prefix): the allocator
    /// answered that request's decision again.
    Replayed {
        placed: bool,
    },
    Failed {
        kind: String,
        detail: String,
    },
}

/// One answer to `POST /allocate`, read.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub outcome: Outcome,
    /// The control service's own time for the request (`latency_us.total_us`).
    pub server_total_us: Option<u64>,
    /// Each VM's prediction, as the control service answered it.
    pub predictions: Vec<LifetimePrediction>,
}

impl Answer {
    /// Source of each VM's prediction (`model`, `cache`, `fallback_timeout`, ...).
    pub fn prediction_sources(&self) -> Vec<String> {
        self.predictions.iter().map(|p| wire_name(&p.source)).collect()
    }

    /// True when the VM now sits on a host, so it has to be released.
    pub fn is_placed(&self) -> bool {
        matches!(self.outcome, Outcome::Placed | Outcome::Replayed { placed: true })
    }

    /// A request that never got an HTTP answer (connection refused, timeout, ...).
    pub fn transport_error(kind: &str, detail: impl Into<String>) -> Self {
        Answer {
            outcome: Outcome::Failed { kind: format!("transport: {kind}"), detail: detail.into() },
            server_total_us: None,
            predictions: Vec::new(),
        }
    }
}

/// The snake_case wire name of a serde enum value (a rejection code, a prediction source).
fn wire_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        other => format!("{other:?}"),
    }
}

/// Reads an answer of the control service: a `ControlDecision` on 2xx (201 placed, 200 rejected or
/// replayed), a problem body on anything else.
pub fn classify_answer(status: u16, body: &[u8]) -> Answer {
    let failed = |kind: String, detail: String| Answer {
        outcome: Outcome::Failed { kind, detail },
        server_total_us: None,
        predictions: Vec::new(),
    };
    if !(200..300).contains(&status) {
        let detail = match serde_json::from_slice::<Problem>(body) {
            Ok(problem) => format!("{}: {} ({})", problem.title, problem.detail, problem.problem_type),
            Err(_) => String::from_utf8_lossy(&body[..body.len().min(300)]).trim().to_owned(),
        };
        return failed(format!("HTTP {status}"), detail);
    }
    let decision: ControlDecision = match serde_json::from_slice(body) {
        Ok(decision) => decision,
        Err(err) => return failed(format!("HTTP {status}, unreadable body"), err.to_string()),
    };
    let placed = matches!(decision.decision.outcome, AllocationOutcome::Placed { .. });
    let outcome = match &decision.decision.outcome {
        _ if decision.decision.replayed => Outcome::Replayed { placed },
        AllocationOutcome::Placed { .. } => Outcome::Placed,
        AllocationOutcome::Rejected { rejection } => Outcome::Rejected { code: wire_name(&rejection.code) },
    };
    Answer {
        outcome,
        server_total_us: Some(decision.latency_us.total_us),
        predictions: decision.predictions.into_iter().map(|p| p.prediction).collect(),
    }
}

/// Header of the per-VM predictions CSV (`vmreplay --predictions`): one row per allocation
/// request, in the order the answers came.
pub const PREDICTION_CSV_HEADER: &str =
    "trace_vm_id,vm_id,tenant_id,start_s,end_s,outcome,p_long,class,model_version,source,expected_lifetime_s";

/// One allocation request and the prediction its VM was placed with, for the predictions CSV:
/// what the model said of each VM, to compare with an offline evaluation of the same VMs.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictionRow {
    pub trace_vm_id: String,
    /// The id sent (with the run's prefix).
    pub vm_id: String,
    pub tenant_id: String,
    pub start_s: f64,
    pub end_s: Option<f64>,
    /// `placed`, `rejected`, `replayed` or `failed`.
    pub outcome: &'static str,
    /// `None` when the answer carried none (a failed request).
    pub prediction: Option<LifetimePrediction>,
}

impl PredictionRow {
    pub fn new(vm: &PlannedVm, answer: &Answer) -> Self {
        PredictionRow {
            trace_vm_id: vm.trace_vm_id.clone(),
            vm_id: vm.request.vm_id.as_str().to_owned(),
            tenant_id: vm.request.facts.tenant_id.as_str().to_owned(),
            start_s: vm.start_s,
            end_s: vm.end_s,
            outcome: match answer.outcome {
                Outcome::Placed => "placed",
                Outcome::Rejected { .. } => "rejected",
                Outcome::Replayed { .. } => "replayed",
                Outcome::Failed { .. } => "failed",
            },
            prediction: answer.predictions.first().cloned(),
        }
    }

    /// The row in the order of [`PREDICTION_CSV_HEADER`], without the line break. Numbers are
    /// written in full (shortest round-trip form), absent values as empty fields.
    pub fn csv_line(&self) -> String {
        let number = |value: Option<f64>| value.map_or_else(String::new, |v| v.to_string());
        let p = self.prediction.as_ref();
        [
            csv_field(&self.trace_vm_id),
            csv_field(&self.vm_id),
            csv_field(&self.tenant_id),
            self.start_s.to_string(),
            number(self.end_s),
            self.outcome.to_owned(),
            number(p.map(|p| p.p_long)),
            p.map_or_else(String::new, |p| {
                match p.class {
                    LifetimeClass::Long => "long",
                    LifetimeClass::Short => "short",
                }
                .to_owned()
            }),
            csv_field(p.and_then(|p| p.model_version.as_deref()).unwrap_or("")),
            p.map_or_else(String::new, |p| wire_name(&p.source)),
            number(p.and_then(|p| p.expected_lifetime_s)),
        ]
        .join(",")
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}
