//! `/v1/consolidation`: consolidation under a migration budget (SPEC section 11): its settings,
//! the plan a round would carry out (a dry run), rounds, pause and resume. Its migrations are
//! confirmed as a drain's are, with `POST /v1/migrations/{vm_id}/complete`.

use super::{call, command_error, AppState, NotDurable};
use crate::durable::{
    ConsolidationPlan, ConsolidationRound, ConsolidationStatus, PauseConsolidation, SetConsolidation,
};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use placement::consolidation::{ConsolidationConfig, ConsolidationReport, PlannedHost};
use serde::{Deserialize, Serialize};
use service_common::auth::AdminAuth;
use service_common::openapi::{AdminRefusals, NotJson};
use service_common::ValidJson;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(status, configure, turn_off))
        .routes(routes!(plan))
        .routes(routes!(round))
        .routes(routes!(pause))
        .routes(routes!(resume))
}

service_common::problem_responses! {
    /// A consolidation route while consolidation is off.
    struct ConsolidationOff { 404: "Consolidation is off." }
}

/// The hosts a round would empty now, and where consolidation stands.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConsolidationPlanAnswer {
    /// Best first, within the budget the round would have.
    pub plan: Vec<PlannedHost>,
    pub consolidation: ConsolidationReport,
}

/// The hosts a round started.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RoundAnswer {
    pub started: Vec<PlannedHost>,
}

/// Where consolidation stands: its settings, the budget left, the hosts being emptied, the
/// migrations in flight and its counters.
#[utoipa::path(get, path = "/v1/consolidation",
    responses((status = 200, description = "Consolidation's settings and progress.", body = ConsolidationReport),
              ConsolidationOff))]
async fn status(State(state): State<AppState>) -> Response {
    match call(&state, "consolidation-status", ConsolidationStatus).await {
        Ok(report) => Json(report).into_response(),
        Err(error) => command_error(error),
    }
}

/// Says when the in-flight limit cannot carry out the budget (the report says it too).
pub(crate) fn warn_of_shortfall(report: &ConsolidationReport) {
    if let Some(most) = report.budget_shortfall {
        tracing::warn!(
            budget_per_host_day = report.config.budget_per_host_day,
            in_flight_limit = report.in_flight_limit,
            carried_out_per_host_day = most,
            "consolidation: {} migrations in flight carry out at most {most:.3} migrations per host-day, less than \
             the budget; set max_in_flight = \"auto\" or raise it",
            report.in_flight_limit
        );
    }
}

/// Turns consolidation on with these settings, or changes them (admin); hosts being emptied and
/// migrations in flight carry on. Durable: the settings stand across restarts, over the config
/// file's `[consolidation]`.
#[utoipa::path(put, path = "/v1/consolidation", request_body = ConsolidationConfig,
    responses((status = 200, description = "The settings in force.", body = ConsolidationReport),
              (status = 400, description = "Malformed JSON, a wrong type, an unknown field.", body = domain::Problem),
              (status = 422, description = "A setting breaks a rule (named in `errors`).", body = domain::Problem),
              NotJson, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn configure(
    State(state): State<AppState>,
    _: AdminAuth,
    ValidJson(config): ValidJson<ConsolidationConfig>,
) -> Response {
    match call(&state, "consolidation-set", SetConsolidation { config: Some(config), only_if_off: false }).await {
        Ok(Some(report)) => {
            tracing::info!(settings = %report.config, in_flight_limit = report.in_flight_limit, "consolidation on");
            warn_of_shortfall(&report);
            Json(report).into_response()
        }
        Ok(None) => command_error(crate::durable::CommandError::Consolidation(placement::ConsolidationError::Off)),
        Err(error) => command_error(error),
    }
}

/// Turns consolidation off (admin): the hosts being emptied return to service. Refused while its
/// migrations are in flight: pause it, confirm them, then turn it off.
#[utoipa::path(delete, path = "/v1/consolidation",
    responses((status = 204, description = "Consolidation is off."),
              (status = 409, description = "Its migrations are in flight.", body = domain::Problem),
              AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn turn_off(State(state): State<AppState>, _: AdminAuth) -> Response {
    match call(&state, "consolidation-set", SetConsolidation { config: None, only_if_off: false }).await {
        Ok(_) => {
            tracing::info!("consolidation off");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(error) => command_error(error),
    }
}

/// The plan: the hosts a round would choose now, best first, with the VMs each would move or wait
/// for and what the chooser expects; a dry run that changes nothing.
#[utoipa::path(get, path = "/v1/consolidation/plan",
    responses((status = 200, description = "What a round would do now.", body = ConsolidationPlanAnswer),
              ConsolidationOff))]
async fn plan(State(state): State<AppState>) -> Response {
    match call(&state, "consolidation-plan", ConsolidationPlan).await {
        Ok((plan, consolidation)) => Json(ConsolidationPlanAnswer { plan, consolidation }).into_response(),
        Err(error) => command_error(error),
    }
}

/// Runs a round now (admin), whatever the period: the chosen hosts leave service and their first
/// migrations start (each confirmed with `POST /v1/migrations/{vm_id}/complete`). The next round
/// is due a period later.
#[utoipa::path(post, path = "/v1/consolidation/rounds",
    responses((status = 200, description = "The hosts the round started.", body = RoundAnswer),
              ConsolidationOff, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn round(State(state): State<AppState>, _: AdminAuth) -> Response {
    match call(&state, "consolidation-round", ConsolidationRound { due_only: false }).await {
        Ok(started) => {
            tracing::info!(hosts = started.len(), "consolidation round");
            Json(RoundAnswer { started }).into_response()
        }
        Err(error) => command_error(error),
    }
}

/// Pauses consolidation (admin): no new host and no new migration; those in flight complete.
#[utoipa::path(post, path = "/v1/consolidation/pause",
    responses((status = 200, description = "Paused.", body = ConsolidationReport),
              ConsolidationOff, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn pause(State(state): State<AppState>, _: AdminAuth) -> Response {
    paused(state, true).await
}

/// Resumes consolidation (admin).
#[utoipa::path(post, path = "/v1/consolidation/resume",
    responses((status = 200, description = "Running.", body = ConsolidationReport),
              ConsolidationOff, AdminRefusals, NotDurable),
    security(("bearer" = [])))]
async fn resume(State(state): State<AppState>, _: AdminAuth) -> Response {
    paused(state, false).await
}

async fn paused(state: AppState, paused: bool) -> Response {
    match call(&state, "consolidation-pause", PauseConsolidation(paused)).await {
        Ok(report) => {
            tracing::info!(paused, "consolidation");
            Json(report).into_response()
        }
        Err(error) => command_error(error),
    }
}
