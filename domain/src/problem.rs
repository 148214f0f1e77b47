//! RFC 9457 problem details: the one error body every service returns.

use crate::validate::ValidationError;
use serde::{Deserialize, Serialize};

/// Media type of [`Problem`] bodies.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// One offending field of a rejected request.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldProblem {
    /// Path of the field, e.g. `gang.vms[2].demand.cores`.
    pub field: String,
    pub message: String,
}

/// A machine-readable error body (`application/problem+json`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// A stable identifier of the kind of problem, e.g. `urn:problem:invalid-request`.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldProblem>,
}

impl Problem {
    pub fn new(status: u16, kind: &str, title: &str, detail: impl Into<String>) -> Self {
        Problem {
            problem_type: format!("urn:problem:{kind}"),
            title: title.to_owned(),
            status,
            detail: detail.into(),
            instance: None,
            errors: Vec::new(),
        }
    }
}

impl From<&ValidationError> for Problem {
    /// Malformed JSON is a 400; well-formed JSON that breaks a domain rule is a 422.
    fn from(err: &ValidationError) -> Self {
        let (status, kind, title) = match err {
            ValidationError::Malformed { .. } => (400, "malformed-request", "Malformed request body"),
            ValidationError::Invalid { .. } => (422, "invalid-request", "Invalid request"),
        };
        let mut problem = Problem::new(status, kind, title, err.to_string());
        problem.errors.push(FieldProblem { field: err.field().to_owned(), message: err.message().to_owned() });
        problem
    }
}
