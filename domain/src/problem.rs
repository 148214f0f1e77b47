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

/// Prefix of every problem's `type`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:problem:";

/// Defines [`ProblemKind`] from one table: variant, `type` slug, HTTP status, title, and when it is
/// answered (for the documentation).
macro_rules! problem_kinds {
    ($($kind:ident = ($slug:literal, $status:literal, $title:literal, $when:literal),)*) => {
        /// Every kind of problem the three services answer with, each with one `type`, status and
        /// title: the vocabulary clients match on (`docs/api.md` lists it, checked by a test).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ProblemKind {
            $($kind,)*
        }

        impl ProblemKind {
            /// Every kind, in the documentation's order.
            pub const ALL: &'static [ProblemKind] = &[$(ProblemKind::$kind,)*];

            /// The `type` without its `urn:problem:` prefix, e.g. `not-durable`.
            pub fn slug(self) -> &'static str {
                match self {
                    $(ProblemKind::$kind => $slug,)*
                }
            }

            pub fn status(self) -> u16 {
                match self {
                    $(ProblemKind::$kind => $status,)*
                }
            }

            pub fn title(self) -> &'static str {
                match self {
                    $(ProblemKind::$kind => $title,)*
                }
            }

            /// Which service answers it, and when.
            pub fn when(self) -> &'static str {
                match self {
                    $(ProblemKind::$kind => $when,)*
                }
            }
        }
    };
}

problem_kinds! {
    MalformedRequest = ("malformed-request", 400, "Malformed request", "any: malformed JSON, a wrong type, a missing or unknown field, or a query value of the wrong kind (named in `errors`)"),
    InvalidRequest = ("invalid-request", 422, "Invalid request", "any: a field breaks a rule (named in `errors`)"),
    MalformedQuery = ("malformed-query", 400, "Malformed query", "any: the query string cannot be read, or names an unknown parameter"),
    MalformedPath = ("malformed-path", 400, "Malformed path parameter", "any: a path parameter cannot be read"),
    UnreadableBody = ("unreadable-body", 400, "Unreadable request body", "any: the body could not be read"),
    UnsupportedMediaType = ("unsupported-media-type", 415, "Unsupported media type", "any: the body is not declared `application/json`"),
    BodyTooLarge = ("body-too-large", 413, "Request body too large", "any: the body is over the service's limit"),
    Unauthorized = ("unauthorized", 401, "Unauthorized", "any: no valid API key, service token or admin token (`WWW-Authenticate: Bearer`)"),
    AdminDisabled = ("admin-disabled", 403, "Admin API disabled", "allocator, inference server: no admin token is configured"),
    NotFound = ("not-found", 404, "Not found", "any: no such route, or no such zone in the console's zone views"),
    MethodNotAllowed = ("method-not-allowed", 405, "Method not allowed", "any: the route does not take this method"),
    NoMetrics = ("no-metrics", 404, "Metrics disabled", "any: the server records no metrics"),
    Overloaded = ("overloaded", 503, "Service overloaded", "any: too many requests in flight (`Retry-After`)"),
    Timeout = ("timeout", 503, "Request timed out", "any: the request took longer than the service's timeout; it may still be carried out, retrying is safe (`Retry-After`)"),
    Internal = ("internal", 500, "Internal error", "any: a bug or an I/O failure; the detail says which"),
    VmIdReused = ("vm-id-reused", 409, "VM id already used", "allocator: the VM id is placed already with another tenant, demand or type"),
    PartialGang = ("partial-gang", 409, "Gang partly placed", "allocator: part of the gang is placed already"),
    UnknownVm = ("unknown-vm", 404, "Unknown VM", "allocator, control service: the VM is not placed (or is another tenant's)"),
    UnknownHost = ("unknown-host", 404, "Unknown host", "allocator: the host is not in the inventory"),
    HostInUse = ("host-in-use", 409, "Host in use", "allocator: a host is not removed while VMs are on it, nor given less capacity than they use"),
    DoesNotFit = ("does-not-fit", 409, "VM does not fit", "allocator: a VM recorded on a host needs more than the host has free"),
    NotDurable = ("not-durable", 503, "Change not durable", "allocator: the change could not be made durable and was undone; retry (`Retry-After`)"),
    StoreUnavailable = ("store-unavailable", 503, "Store unavailable", "allocator: the store cannot be used right now; retry (`Retry-After`)"),
    DrainBusy = ("drain-busy", 409, "Drain in progress", "allocator: a drain is running already"),
    NoDrain = ("no-drain", 404, "No drain", "allocator: no drain was ever started"),
    NoHostsToDrain = ("no-hosts-to-drain", 422, "No host to drain", "allocator: the drain request selects no host"),
    NotMigrating = ("not-migrating", 404, "VM not migrating", "allocator: the VM is not migrating"),
    ConsolidationOff = ("consolidation-off", 404, "Consolidation off", "allocator: consolidation is not configured (`PUT /v1/consolidation` or `[consolidation]`)"),
    ConsolidationBusy = ("consolidation-busy", 409, "Consolidation migrations in flight", "allocator: consolidation cannot be turned off while its migrations are in flight; pause it first"),
    ExportBusy = ("export-busy", 503, "Export in progress", "allocator: another export is running; retry (`Retry-After`)"),
    UnknownZone = ("unknown-zone", 422, "Unknown zone", "control service: the request names a zone it does not route"),
    OperatorOnly = ("operator-only", 403, "Operator only", "control service: fleet-wide reads need the operator's key"),
    ForbiddenTenant = ("forbidden-tenant", 403, "Forbidden tenant", "control service: the request names another tenant than the key's (named in `errors`)"),
    RateLimited = ("rate-limited", 429, "Too many requests", "control service: the tenant is over its request rate (`Retry-After`)"),
    AllocatorUnreachable = ("allocator-unreachable", 502, "Allocator unreachable", "control service: no allocator of the zone answered (`Retry-After`)"),
    AllocatorTimeout = ("allocator-timeout", 504, "Allocator timed out", "control service: the allocator did not answer in time; retrying with the same VM ids is safe"),
    AllocatorCredentialRefused = ("allocator-credential-refused", 502, "Allocator refused the service token", "control service: the zone's allocators refused its service token (a configuration error; nothing was done)"),
    BadAllocatorAnswer = ("bad-allocator-answer", 502, "Unreadable allocator answer", "control service: the allocator's answer could not be read"),
    NotReady = ("not-ready", 503, "Not ready", "control service: an allocator or the inference server is not ready"),
    NoModel = ("no-model", 503, "No model loaded", "inference server: no valid model bundle is deployed yet"),
    InvalidRollout = ("invalid-rollout", 422, "Invalid rollout", "inference server: an unknown or invalid bundle, or a share outside (0, 1]"),
    RolloutFailed = ("rollout-failed", 500, "Rollout failed", "inference server: `rollout.toml` could not be written"),
}

impl ProblemKind {
    /// The kind of a problem `type`, e.g. `urn:problem:not-durable`.
    pub fn of_type(problem_type: &str) -> Option<Self> {
        let slug = problem_type.strip_prefix(PROBLEM_TYPE_PREFIX)?;
        ProblemKind::ALL.iter().copied().find(|kind| kind.slug() == slug)
    }
}

impl Problem {
    /// A problem of `kind`, saying what happened in `detail`.
    pub fn of(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Problem {
            problem_type: format!("{PROBLEM_TYPE_PREFIX}{}", kind.slug()),
            title: kind.title().to_owned(),
            status: kind.status(),
            detail: detail.into(),
            instance: None,
            errors: Vec::new(),
        }
    }

    /// A problem of `kind` with one offending field.
    pub fn field(kind: ProblemKind, field: impl Into<String>, message: impl Into<String>) -> Self {
        let (field, message) = (field.into(), message.into());
        let mut problem = Problem::of(kind, format!("field `{field}`: {message}"));
        problem.errors.push(FieldProblem { field, message });
        problem
    }

    /// Its kind, if it is one of the vocabulary's.
    pub fn kind(&self) -> Option<ProblemKind> {
        ProblemKind::of_type(&self.problem_type)
    }
}

impl From<&ValidationError> for Problem {
    /// Malformed JSON is a 400; well-formed JSON that breaks a domain rule is a 422.
    fn from(err: &ValidationError) -> Self {
        let kind = match err {
            ValidationError::Malformed { .. } => ProblemKind::MalformedRequest,
            ValidationError::Invalid { .. } => ProblemKind::InvalidRequest,
        };
        let mut problem = Problem::of(kind, err.to_string());
        problem.errors.push(FieldProblem { field: err.field().to_owned(), message: err.message().to_owned() });
        problem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_type_and_an_error_status() {
        let mut slugs = std::collections::HashSet::new();
        for kind in ProblemKind::ALL {
            assert!(slugs.insert(kind.slug()), "{kind:?}: `{}` twice", kind.slug());
            assert!((400..600).contains(&kind.status()), "{kind:?}");
            let problem = Problem::of(*kind, "detail");
            assert_eq!(problem.kind(), Some(*kind));
            assert_eq!(problem.problem_type, format!("urn:problem:{}", kind.slug()));
        }
        assert_eq!(ProblemKind::of_type("urn:problem:no-such-kind"), None);
    }

    /// `docs/api.md` lists every problem type as the code defines it.
    #[test]
    fn the_api_documentation_lists_every_problem_type() {
        let mut table = String::from("| `type` | status | title | answered by, and when |\n|---|---:|---|---|\n");
        for kind in ProblemKind::ALL {
            table += &format!(
                "| `urn:problem:{}` | {} | {} | {} |\n",
                kind.slug(),
                kind.status(),
                kind.title(),
                kind.when()
            );
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/api.md");
        let doc = std::fs::read_to_string(path).unwrap();
        let (begin, end) = ("<!-- problem-types: begin -->\n", "<!-- problem-types: end -->");
        let start = doc.find(begin).expect("the begin marker") + begin.len();
        let stop = doc.find(end).expect("the end marker");
        if std::env::var_os("PROBLEM_TABLE_UPDATE").is_some() {
            std::fs::write(path, format!("{}{table}{}", &doc[..start], &doc[stop..])).unwrap();
            return;
        }
        assert_eq!(&doc[start..stop], table, "docs/api.md is stale: rerun with PROBLEM_TABLE_UPDATE=1");
    }
}
