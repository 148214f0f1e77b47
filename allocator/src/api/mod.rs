//! HTTP routes of the allocator: a thin layer over the [`Worker`] (see `docs/allocator.md`), one
//! module per resource. Each module lists its routes with `utoipa_axum::routes!`, which takes the
//! method and path from the handler's `#[utoipa::path]`: the router and the OpenAPI document come
//! from the same list.
//!
//! Every answer comes after the batch it ran in has committed; every error is an
//! `application/problem+json` body.

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

mod allocations;
pub(crate) mod consolidation;
mod drains;
mod export;
mod hosts;
mod observability;

pub use export::{CONCURRENT_EXPORTS, MAX_EXPORT_ROWS};

use crate::durable::{
    CommandError, HostDetail, HostInfo, HostPage, HostStateChange, HostSummary, Request, StoreStatus, VmInfo,
};
use crate::store::StoreLocation;
use crate::worker::{Stages, Worker};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use axum::{routing::get, Json, Router};
pub use domain::ExplainRequest;
use domain::ProblemKind;
use domain::{ValidationLimits, ZoneId};
use placement::defrag::{DrainReport, DrainRequest, Migration};
use placement::{AllocateError, ConsolidationError, DrainError};
use service_common::auth::{HasAdminToken, ServiceTokens, OPEN_PATHS};
use service_common::problem::{field_problem, path_param, problem, query_param, HasLimits};
use service_common::telemetry::PrometheusHandle;
use std::sync::Arc;
use std::time::Instant;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

/// Default and largest page of `GET /v1/hosts`.
pub const DEFAULT_HOST_PAGE: usize = 1000;
pub const MAX_HOST_PAGE: usize = 10_000;
/// Largest `top` of `POST /v1/explain`.
pub use domain::hosts::MAX_EXPLAIN_TOP;
#[derive(Clone)]
pub struct AppState {
    pub worker: Worker,
    pub limits: ValidationLimits,
    pub admin_token: Option<String>,
    /// The service credential every route but [`service_common::auth::OPEN_PATHS`] requires.
    pub service_tokens: ServiceTokens,
    pub metrics: Option<PrometheusHandle>,
    /// The zones of this allocator's inventory: a request naming another zone is rejected with
    /// `unknown_zone` (it was routed to the wrong allocator).
    pub zones: Arc<[ZoneId]>,
    /// The store, which `GET /v1/export` reads on a connection of its own (never the worker's).
    pub store: StoreLocation,
    /// Permits of the exports running ([`CONCURRENT_EXPORTS`]).
    pub exports: Arc<tokio::sync::Semaphore>,
}

impl HasLimits for AppState {
    fn limits(&self) -> &ValidationLimits {
        &self.limits
    }
}

impl HasAdminToken for AppState {
    fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_deref()
    }
}

service_common::problem_responses! {
    /// A change the worker could not commit (or the standard stack's overload and timeout).
    struct NotDurable { 503: "The change could not be made durable, or overloaded or timed out; retry." }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Allocator",
        description = "Lifetime-aware VM placement over one zone's inventory, with durable state."
    ),
    components(schemas(
        domain::AllocationRequest,
        domain::AllocationDecision,
        domain::Resources,
        placement::AllocatorStats,
        domain::QualityReport,
        domain::VersionQuality,
        domain::QualityTally,
        domain::QualityFigures,
        domain::quality::ScoreBin,
        placement::Explanation,
        VmInfo,
        HostInfo,
        HostSummary,
        HostDetail,
        HostPage,
        HostStateChange,
        StoreStatus,
        ExplainRequest,
        DrainRequest,
        DrainReport,
        Migration,
        placement::defrag::DrainHosts,
        placement::consolidation::ConsolidationConfig,
        placement::consolidation::ConsolidationReport,
        placement::consolidation::ConsolidationCounters,
        placement::consolidation::ChooserKind,
        placement::consolidation::EmptyingHost,
        placement::consolidation::PlannedHost,
        consolidation::ConsolidationPlanAnswer,
        consolidation::RoundAnswer,
        placement::defrag::MigrationOrder,
        placement::host_state::HostStateStats,
        crate::durable::PolicyHostState,
        domain::LifetimePrediction,
        domain::HostState,
        domain::Problem
    ))
)]
pub struct ApiDoc;

/// What the derived schemas of the library's types cannot say (their resource vectors, host
/// states, the drain request's ranges), and the standard responses.
struct DocumentCompletion;

impl utoipa::Modify for DocumentCompletion {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use domain::openapi::set_property;
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
        use utoipa::openapi::Ref;
        let resources = || Ref::from_schema_name("Resources");
        set_property(openapi, "VmInfo", "demand", resources());
        for property in ["capacity", "used", "free"] {
            set_property(openapi, "HostInfo", property, resources());
        }
        set_property(openapi, "HostInfo", "state", Ref::from_schema_name("HostState"));
        set_property(openapi, "HostStateChange", "previous", Ref::from_schema_name("HostState"));
        set_property(openapi, "HostStateChange", "state", Ref::from_schema_name("HostState"));
        let host_id = ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(256));
        let listed = ArrayBuilder::new().items(host_id).min_items(Some(1)).max_items(Some(1000));
        let listed = ObjectBuilder::new()
            .property("listed", listed)
            .required("listed")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some("These hosts (1 to 1000 ids)."));
        let pick = ObjectBuilder::new()
            .property("pick", ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)))
            .required("pick")
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some("The `n` available non-empty hosts cheapest to empty."));
        domain::openapi::set_schema(
            openapi,
            "DrainHosts",
            utoipa::openapi::schema::OneOfBuilder::new().item(listed).item(pick).into(),
        );
        set_property(
            openapi,
            "DrainRequest",
            "max_in_flight",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(1))
                .maximum(Some(placement::defrag::MAX_IN_FLIGHT as f64))
                .description(Some("Most migrations in flight at once (default 3).")),
        );
        consolidation_ranges(openapi);
        // `offset` is read as a `usize`: any whole number up to 2^64 - 1, beyond `int64`'s range.
        domain::openapi::set_parameter_schema(
            openapi,
            "/v1/hosts",
            "offset",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .maximum(Some(u64::MAX))
                .description(Some("Hosts to skip.")),
        );
        domain::openapi::complete(openapi);
    }
}

/// The routes and their OpenAPI document, from one list: each resource module's `routes!`.
fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(allocations::routes())
        .merge(hosts::routes())
        .merge(drains::routes())
        .merge(consolidation::routes())
        .merge(export::routes())
        .merge(observability::routes())
        .split_for_parts();
    // Once every path is in: the service credential and the standard answers go on each of them.
    domain::openapi::require_service_token(&mut openapi, OPEN_PATHS);
    utoipa::Modify::modify(&DocumentCompletion, &mut openapi);
    (router, openapi)
}

/// The OpenAPI document of every route (`GET /openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes().1
}

/// The full router, every route but the probes, `/metrics` and `/openapi.json` behind the service
/// credential, without the standard layers (see `service_common::layers::apply`).
pub fn router(state: AppState) -> Router {
    let (router, openapi) = routes();
    let tokens = state.service_tokens.clone();
    let router = router
        .route("/openapi.json", get(|| async move { Json(openapi) }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state);
    service_common::auth::protect(router, tokens)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    problem(ProblemKind::NotFound, format!("no route for `{}`", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    problem(ProblemKind::MethodNotAllowed, format!("`{}` does not accept {method}", uri.path()))
}

/// Runs a command on the worker, timing it per endpoint.
/// The ranges of `[consolidation]`'s settings, and the choosers a service runs (not `oracle`,
/// which only the simulator can).
fn consolidation_ranges(openapi: &mut utoipa::openapi::OpenApi) {
    use domain::openapi::set_property;
    use placement::consolidation::{ChooserKind, MAX_BUDGET, MAX_SECONDS};
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let number = |min: f64, max: f64, text: &str| {
        ObjectBuilder::new().schema_type(Type::Number).minimum(Some(min)).maximum(Some(max)).description(Some(text))
    };
    let schema = "ConsolidationConfig";
    set_property(openapi, schema, "budget_per_host_day", number(0.0, MAX_BUDGET, "Migrations per host per day."));
    set_property(
        openapi,
        schema,
        "every_s",
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .exclusive_minimum(Some(0.0))
            .maximum(Some(MAX_SECONDS))
            .description(Some("Seconds between rounds.")),
    );
    set_property(openapi, schema, "migration_s", number(0.0, MAX_SECONDS, "How long a migration takes, seconds."));
    set_property(
        openapi,
        schema,
        "max_waste",
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .exclusive_minimum(Some(0.0))
            .maximum(Some(1.0))
            .description(Some("Lifetime-aware choosers skip hosts whose moves are this likely wasted.")),
    );
    set_property(
        openapi,
        schema,
        "auto_headroom",
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .exclusive_minimum(Some(0.0))
            .maximum(Some(placement::consolidation::MAX_HEADROOM))
            .description(Some("`auto`'s factor over the migrations the budget keeps in flight on average.")),
    );
    set_property(
        openapi,
        schema,
        "empty_below_pct",
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Number, Type::Null]))
            .minimum(Some(0.0))
            .maximum(Some(100.0))
            .description(Some("Choose hosts only while fewer hosts than this share are empty (percent).")),
    );
    let whole = |min: f64, max: f64, text: &str| {
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(min)).maximum(Some(max)).description(Some(text))
    };
    let in_flight = placement::defrag::MAX_IN_FLIGHT as f64;
    let auto = ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["auto"]))
        .description(Some("Enough to carry out the budget on the zone as it is (the default)."));
    set_property(
        openapi,
        schema,
        "max_in_flight",
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(whole(1.0, in_flight, "This many, whatever the zone's size."))
            .item(auto)
            .description(Some("Most migrations in flight at once: `auto` or a number.")),
    );
    // Read as a `usize`: any whole number up to 2^64 - 1 (as an `f64`, that bound would round up).
    set_property(
        openapi,
        schema,
        "candidates",
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .maximum(Some(u64::MAX))
            .description(Some("Hosts a lifetime-aware round reads.")),
    );
    let served = ChooserKind::NAMES.iter().filter(|n| **n != ChooserKind::Oracle.name()).map(|n| serde_json::json!(n));
    set_property(
        openapi,
        schema,
        "chooser",
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(served))
            .description(Some("How hosts are chosen (`oracle` is the simulator's only).")),
    );
}

async fn call<R: Request>(state: &AppState, endpoint: &'static str, request: R) -> Result<R::Output, CommandError> {
    call_timed(state, endpoint, request).await.0
}

/// [`call`], with where the command's time went on the worker.
async fn call_timed<R: Request>(
    state: &AppState,
    endpoint: &'static str,
    request: R,
) -> (Result<R::Output, CommandError>, Option<Stages>) {
    let started = Instant::now();
    let reply = state.worker.call_timed(request).await;
    metrics::histogram!("allocator_request_duration_seconds", "endpoint" => endpoint)
        .record(started.elapsed().as_secs_f64());
    reply
}

fn retry_later(mut response: Response) -> Response {
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn command_error(error: CommandError) -> Response {
    let detail = error.to_string();
    match error {
        CommandError::Conflict(AllocateError::IdReused { .. }) => problem(ProblemKind::VmIdReused, detail),
        CommandError::Conflict(AllocateError::PartialGang { .. }) => problem(ProblemKind::PartialGang, detail),
        CommandError::UnknownVm(_) => problem(ProblemKind::UnknownVm, detail),
        CommandError::UnknownHost(_) => problem(ProblemKind::UnknownHost, detail),
        CommandError::HostInUse(_) => problem(ProblemKind::HostInUse, detail),
        CommandError::DoesNotFit(_) => problem(ProblemKind::DoesNotFit, detail),
        CommandError::NotDurable(_) => retry_later(problem(ProblemKind::NotDurable, detail)),
        CommandError::Unavailable(_) => retry_later(problem(ProblemKind::StoreUnavailable, detail)),
        CommandError::Drain(DrainError::Busy) => problem(ProblemKind::DrainBusy, detail),
        CommandError::Drain(DrainError::NoDrain) => problem(ProblemKind::NoDrain, detail),
        CommandError::Drain(DrainError::UnknownHost(_)) => problem(ProblemKind::UnknownHost, detail),
        CommandError::Drain(DrainError::NoHosts) => problem(ProblemKind::NoHostsToDrain, detail),
        CommandError::Drain(DrainError::NotMigrating(_)) => problem(ProblemKind::NotMigrating, detail),
        CommandError::Consolidation(ConsolidationError::Off) => problem(ProblemKind::ConsolidationOff, detail),
        CommandError::Consolidation(ConsolidationError::Busy) => problem(ProblemKind::ConsolidationBusy, detail),
        CommandError::Consolidation(ConsolidationError::Config(e)) => {
            field_problem(ProblemKind::InvalidRequest, e.field, e.message)
        }
        CommandError::Consolidation(ConsolidationError::NoOracle) => {
            field_problem(ProblemKind::InvalidRequest, "chooser", detail)
        }
    }
}

/// A time on the model's clock from the query (`field`), refused (422) unless finite.
fn finite_time(field: &'static str, at: Option<f64>) -> Result<Option<f64>, Response> {
    match at {
        Some(at) if !at.is_finite() => {
            Err(field_problem(ProblemKind::InvalidRequest, field, format!("must be a finite number, got {at}")))
        }
        at => Ok(at),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_openapi_document_lists_the_routes() {
        let doc = serde_json::to_value(super::openapi()).unwrap();
        for (path, method) in [
            ("/v1/allocations", "post"),
            ("/v1/allocations/{vm_id}", "get"),
            ("/v1/allocations/{vm_id}", "delete"),
            ("/v1/hosts/{host_id}/drain", "post"),
            ("/v1/drains", "get"),
            ("/v1/drains", "post"),
            ("/v1/explain", "post"),
            ("/metrics", "get"),
        ] {
            assert!(doc["paths"][path][method].is_object(), "{method} {path}");
        }
    }
}
