//! HTTP routes of the inference server: a thin layer over the registry and `lifetime-model`. The
//! routes are listed once, with `utoipa_axum::routes!`, which takes each handler's method and path
//! from its `#[utoipa::path]`: the router and the OpenAPI document come from the same list.

use crate::config::ServerConfig;
use crate::history::{HistoryStatus, ServerHistory};
use crate::registry::{BundleStatus, CanarySpec, Deployment, Registry, Rollout};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use domain::ProblemKind;
use domain::{
    HistoryEvent, HistoryRequest, LifetimePrediction, PredictRequest, PredictResponse, PredictionSource,
    RemainingPrediction, RemainingRequest, RemainingResponse, ValidationLimits,
};
use lifetime_model::RequestFeatures;
use service_common::auth::{AdminAuth, HasAdminToken, ServiceTokens, OPEN_PATHS};
use service_common::openapi::{AdminRefusals, BadJson, BrokenRule, MetricsResponses, NotJson};
use service_common::problem::{problem, HasLimits};
use service_common::telemetry::PrometheusHandle;
use service_common::ValidJson;
use std::sync::Arc;
use std::time::Instant;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub history: Arc<ServerHistory>,
    pub limits: ValidationLimits,
    pub admin_token: Option<String>,
    /// The service credential every route but [`OPEN_PATHS`] requires.
    pub service_tokens: ServiceTokens,
    pub blocking_batch_threshold: usize,
    pub metrics: Option<PrometheusHandle>,
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

impl AppState {
    pub fn new(
        config: &ServerConfig,
        registry: Arc<Registry>,
        history: Arc<ServerHistory>,
        metrics: Option<PrometheusHandle>,
    ) -> Self {
        AppState {
            registry,
            history,
            limits: ValidationLimits { max_batch: config.max_batch, ..ValidationLimits::default() },
            admin_token: config.admin_token.clone(),
            service_tokens: ServiceTokens::new(
                config.service_token.as_deref(),
                config.previous_service_token.as_deref(),
                config.admin_token.as_deref(),
            ),
            blocking_batch_threshold: config.blocking_batch_threshold,
            metrics,
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Lifetime inference server",
        description = "Lifetime predictions for VM allocation. Every error is an RFC 9457 problem \
                       (`application/problem+json`). Every route but the probes, `/metrics` and \
                       `/openapi.json` needs the service token (`Authorization: Bearer <service_token>`) when one \
                       is configured. The admin routes need `Authorization: Bearer <admin_token>`; without a \
                       configured admin token they answer 403."
    ),
    components(schemas(
        PredictRequest,
        PredictResponse,
        RemainingRequest,
        RemainingResponse,
        HistoryRequest,
        HistoryEvent,
        HistoryStatus,
        BundleStatus,
        CanarySpec,
        crate::registry::AutoCanary,
        domain::Problem
    ))
)]
pub struct ApiDoc;

/// Constraints of `CanarySpec` that the registry checks (422), and the standard responses.
struct DocumentCompletion;

impl utoipa::Modify for DocumentCompletion {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
        use utoipa::openapi::RefOr;
        if let Some(RefOr::T(Schema::Object(canary))) =
            openapi.components.as_mut().and_then(|components| components.schemas.get_mut("CanarySpec"))
        {
            canary.properties.insert(
                "share".to_owned(),
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .exclusive_minimum(Some(0.0))
                    .maximum(Some(1.0))
                    .description(Some(
                        "Share of traffic in (0, 1], chosen by a stable hash of each instance's routing key.",
                    ))
                    .into(),
            );
        }
        // Each kind of history event is an object of its own fields only (serde refuses others).
        if let Some(RefOr::T(Schema::OneOf(events))) =
            openapi.components.as_mut().and_then(|components| components.schemas.get_mut("HistoryEvent"))
        {
            for kind in &mut events.items {
                if let RefOr::T(Schema::Object(kind)) = kind {
                    kind.additional_properties =
                        Some(Box::new(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)));
                }
            }
        }
        domain::openapi::require_service_token(openapi, OPEN_PATHS);
        domain::openapi::complete(openapi);
    }
}

/// The routes and their OpenAPI document, from one list.
fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(predict))
        .routes(routes!(remaining_lifetime))
        .routes(routes!(record_history, history_status))
        .routes(routes!(list_models))
        .routes(routes!(reload_models))
        .routes(routes!(set_canary))
        .routes(routes!(promote_canary))
        .routes(routes!(rollback_canary))
        .routes(routes!(service_common::openapi::healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_endpoint))
        .split_for_parts();
    // Once every path is in: the service credential and the standard answers go on each of them.
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
    let router = router.route("/openapi.json", get(|| async move { Json(openapi) })).with_state(state);
    service_common::auth::protect(router, tokens)
}

service_common::problem_responses! {
    /// A prediction route before any valid bundle is deployed (or the standard stack's 503).
    struct NoModel { 503: "No valid model is deployed yet (`urn:problem:no-model`), or overloaded or timed out." }

    /// A rollout change that could not be recorded.
    struct RolloutNotWritten { 500: "`rollout.toml` could not be written." }
}

fn no_model() -> Response {
    problem(ProblemKind::NoModel, "no valid model bundle is deployed yet")
}

fn now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn predict_batch(
    deployment: &Deployment,
    history: &ServerHistory,
    request: &PredictRequest,
) -> Vec<LifetimePrediction> {
    let now = now_s();
    // The events the control service sent with the request come first: the prediction sees them.
    history.apply(&deployment.stable, &request.history);
    history.with_past(|past| {
        request
            .instances
            .iter()
            .map(|instance| {
                let key = instance.routing_key();
                let model = deployment.route(&key);
                let started = Instant::now();
                let features = RequestFeatures::from_instance(instance, now);
                let row = model.encode_with(&features, &past(model, &features));
                history.record_row(&key, model.version(), &row);
                let prediction = model.predict_row(&row, request.interval_class);
                let version = model.version().to_owned();
                metrics::histogram!("inference_prediction_duration_seconds", "model_version" => version.clone())
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!("inference_predictions_total", "model_version" => version).increment(1);
                model.to_wire(&prediction, PredictionSource::Model)
            })
            .collect()
    })
}

fn remaining_batch(
    deployment: &Deployment,
    history: &ServerHistory,
    request: &RemainingRequest,
) -> Vec<RemainingPrediction> {
    let now = now_s();
    history.apply(&deployment.stable, &[]);
    history.with_past(|past| {
        request
            .instances
            .iter()
            .map(|instance| {
                let model = deployment.route(&instance.vm.routing_key());
                let started = Instant::now();
                let features = RequestFeatures::from_instance(&instance.vm, now);
                let remaining = model.predict_remaining_with(&features, &past(model, &features), instance.uptime_s);
                let version = model.version().to_owned();
                metrics::histogram!("inference_remaining_duration_seconds", "model_version" => version.clone())
                    .record(started.elapsed().as_secs_f64());
                metrics::counter!("inference_remaining_predictions_total", "model_version" => version.clone())
                    .increment(1);
                RemainingPrediction { remaining_lifetime_s: remaining, model_version: version }
            })
            .collect()
    })
}

/// Predicts lifetime class, interval and expected lifetime for a batch of VMs.
#[utoipa::path(post, path = "/v1/predict", request_body = PredictRequest,
    responses((status = 200, description = "One prediction per instance, in order.", body = PredictResponse),
              BadJson, NotJson, BrokenRule, NoModel))]
async fn predict(State(state): State<AppState>, ValidJson(request): ValidJson<PredictRequest>) -> Response {
    let size = request.instances.len();
    let history = Arc::clone(&state.history);
    answer(&state, "predict", size, move |deployment| PredictResponse {
        predictions: predict_batch(deployment, &history, &request),
    })
    .await
}

/// Predicts the remaining lifetime of running VMs given their uptime.
#[utoipa::path(post, path = "/v1/remaining-lifetime", request_body = RemainingRequest,
    responses((status = 200, description = "One prediction per instance, in order.", body = RemainingResponse),
              BadJson, NotJson, BrokenRule, NoModel))]
async fn remaining_lifetime(
    State(state): State<AppState>,
    ValidJson(request): ValidJson<RemainingRequest>,
) -> Response {
    let size = request.instances.len();
    let history = Arc::clone(&state.history);
    answer(&state, "remaining-lifetime", size, move |deployment| RemainingResponse {
        predictions: remaining_batch(deployment, &history, &request),
    })
    .await
}

/// Records events of the tenants' history (arrivals and exits, from the control service), in
/// order; a prediction afterwards sees them. Events the history cannot use (a second start, the end
/// of an unknown VM, events before the stable bundle's cut-off, an end before its start) are
/// counted in the answer, never refused.
#[utoipa::path(post, path = "/v1/history", request_body = HistoryRequest,
    responses((status = 200, description = "The history after the events.", body = HistoryStatus),
              (status = 503, description = "No valid model is deployed yet (`urn:problem:no-model`): the events are not recorded.", body = domain::Problem),
              BadJson, NotJson, BrokenRule))]
async fn record_history(State(state): State<AppState>, ValidJson(request): ValidJson<HistoryRequest>) -> Response {
    let Some(deployment) = state.registry.deployment() else { return no_model() };
    let history = Arc::clone(&state.history);
    let recorded = tokio::task::spawn_blocking(move || {
        history.apply(&deployment.stable, &request.events);
        history.status()
    })
    .await;
    match recorded {
        Ok(status) => Json(status).into_response(),
        Err(error) => problem(ProblemKind::Internal, error.to_string()),
    }
}

/// The tenants' history this server predicts from: its base bundle, its size and what became of
/// the events it received.
#[utoipa::path(get, path = "/v1/history", responses((status = 200, description = "The history.", body = HistoryStatus)))]
async fn history_status(State(state): State<AppState>) -> Json<HistoryStatus> {
    Json(state.history.status())
}

/// Runs a prediction endpoint's work on the current deployment (inline for small batches, on the
/// blocking pool for large ones) and records its latency.
async fn answer<T: serde::Serialize + Send + 'static>(
    state: &AppState,
    endpoint: &'static str,
    size: usize,
    work: impl FnOnce(&Deployment) -> T + Send + 'static,
) -> Response {
    let started = Instant::now();
    let Some(deployment) = state.registry.deployment() else { return no_model() };
    let result = if size < state.blocking_batch_threshold {
        Ok(work(&deployment))
    } else {
        tokio::task::spawn_blocking(move || work(&deployment))
            .await
            .map_err(|e| problem(ProblemKind::Internal, format!("prediction failed: {e}")))
    };
    metrics::histogram!("inference_request_duration_seconds", "endpoint" => endpoint)
        .record(started.elapsed().as_secs_f64());
    match result {
        Ok(body) => Json(body).into_response(),
        Err(response) => response,
    }
}

/// Lists the bundles in the models directory and their state.
#[utoipa::path(get, path = "/v1/models", responses((status = 200, description = "Every bundle directory and its state.", body = [BundleStatus])))]
async fn list_models(State(state): State<AppState>) -> Json<Vec<BundleStatus>> {
    Json(state.registry.statuses())
}

/// Runs an admin route's change of the registry on the blocking pool (it reads and writes the
/// models directory), answering with the bundles after it.
async fn blocking_admin<T: Send + 'static>(
    state: &AppState,
    work: impl FnOnce(&Registry) -> Result<T, crate::registry::RegistryError> + Send + 'static,
) -> Response {
    let registry = Arc::clone(&state.registry);
    let outcome = tokio::task::spawn_blocking(move || work(&registry).map(|_| registry.statuses())).await;
    match outcome {
        Ok(Ok(statuses)) => Json(statuses).into_response(),
        Ok(Err(error @ crate::registry::RegistryError::UnknownBundle(_)))
        | Ok(Err(error @ crate::registry::RegistryError::Invalid(_))) => {
            problem(ProblemKind::InvalidRollout, error.to_string())
        }
        Ok(Err(error)) => problem(ProblemKind::RolloutFailed, error.to_string()),
        Err(error) => problem(ProblemKind::Internal, error.to_string()),
    }
}

/// Rescans the models directory now (admin).
#[utoipa::path(post, path = "/v1/models/reload",
    responses((status = 200, description = "The bundles after the scan.", body = [BundleStatus]),
              (status = 500, description = "The models directory could not be read.", body = domain::Problem),
              AdminRefusals),
    security(("bearer" = [])))]
async fn reload_models(State(state): State<AppState>, _: AdminAuth) -> Response {
    blocking_admin(&state, |registry| registry.refresh()).await
}

/// Sends a share of traffic to a canary bundle (admin); recorded in `rollout.toml`. The body is
/// read as JSON whatever its declared content type.
#[utoipa::path(post, path = "/v1/models/canary", request_body = CanarySpec,
    responses((status = 200, description = "The bundles with the new rollout.", body = [BundleStatus]),
              (status = 422, description = "Unknown or invalid bundle, or a share outside (0, 1].", body = domain::Problem),
              BadJson, AdminRefusals, RolloutNotWritten),
    security(("bearer" = [])))]
async fn set_canary(State(state): State<AppState>, _: AdminAuth, body: axum::body::Bytes) -> Response {
    let spec: CanarySpec = match serde_json::from_slice(&body) {
        Ok(spec) => spec,
        Err(error) => return problem(ProblemKind::MalformedRequest, error.to_string()),
    };
    blocking_admin(&state, move |registry| {
        let mut rollout = registry.rollout();
        if rollout.stable.is_none() {
            rollout.stable = registry.deployment().map(|d| d.stable_name.clone());
        }
        rollout.canary = Some(spec);
        registry.set_rollout(&rollout)
    })
    .await
}

/// Makes the canary the stable bundle (admin).
#[utoipa::path(post, path = "/v1/models/promote",
    responses((status = 200, description = "The bundles with the new rollout.", body = [BundleStatus]),
              (status = 422, description = "There is no canary to promote.", body = domain::Problem),
              AdminRefusals, RolloutNotWritten),
    security(("bearer" = [])))]
async fn promote_canary(State(state): State<AppState>, _: AdminAuth) -> Response {
    blocking_admin(&state, |registry| {
        let rollout = registry.rollout();
        let Some(canary) = rollout.canary else {
            return Err(crate::registry::RegistryError::Invalid("there is no canary to promote".to_owned()));
        };
        registry.set_rollout(&Rollout { stable: Some(canary.bundle), canary: None })
    })
    .await
}

/// Drops the canary; all traffic goes to the stable bundle (admin).
#[utoipa::path(post, path = "/v1/models/rollback",
    responses((status = 200, description = "The bundles with the new rollout.", body = [BundleStatus]),
              (status = 422, description = "The stable bundle is no longer valid.", body = domain::Problem),
              AdminRefusals, RolloutNotWritten),
    security(("bearer" = [])))]
async fn rollback_canary(State(state): State<AppState>, _: AdminAuth) -> Response {
    blocking_admin(&state, |registry| {
        let mut rollout = registry.rollout();
        if rollout.stable.is_none() {
            rollout.stable = registry.deployment().map(|d| d.stable_name.clone());
        }
        rollout.canary = None;
        registry.set_rollout(&rollout)
    })
    .await
}

/// A valid model is deployed and predictions can be served.
#[utoipa::path(get, path = "/readyz",
    responses((status = 200, description = "Ready: `ready: <stable model version>`.", body = String, content_type = "text/plain"),
              (status = 503, description = "No valid model is deployed yet (`urn:problem:no-model`).", body = domain::Problem)))]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.registry.deployment() {
        Some(deployment) => format!("ready: {}", deployment.stable.version()).into_response(),
        None => no_model(),
    }
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(get, path = "/metrics", responses(MetricsResponses))]
async fn metrics_endpoint(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => service_common::telemetry::render_metrics(handle),
        None => problem(ProblemKind::NoMetrics, "no metrics recorder is installed"),
    }
}
