//! Statistics, realized quality, health, readiness and the Prometheus metrics.

use super::{call, command_error, problem, AppState};
use crate::durable::{ConsolidationStatus, Quality, Stats, Status, StoreStatus};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use domain::ProblemKind;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(stats))
        .routes(routes!(quality))
        .routes(routes!(service_common::openapi::healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_endpoint))
}

/// Occupancy, packing density, empty hosts, VMs by lifetime, rejections by reason.
#[utoipa::path(get, path = "/v1/stats", responses((status = 200, description = "The statistics.", body = placement::AllocatorStats)))]
async fn stats(State(state): State<AppState>) -> Response {
    match call(&state, "stats", Stats).await {
        Ok(stats) => Json(stats).into_response(),
        Err(error) => command_error(error),
    }
}

/// The realized quality of the lifetime predictions VMs were placed with, per model version, over
/// a sliding window of resolved outcomes: a VM resolves when it exits, or as long-lived once it
/// outlives the threshold still running. The windows' tallies add up across zones.
#[utoipa::path(get, path = "/v1/quality", responses((status = 200, description = "The realized quality.", body = domain::QualityReport)))]
async fn quality(State(state): State<AppState>) -> Response {
    match call(&state, "quality", Quality).await {
        Ok(report) => Json(report).into_response(),
        Err(error) => command_error(error),
    }
}

/// The store is open and the allocator answers.
#[utoipa::path(get, path = "/readyz",
    responses((status = 200, description = "Ready: the store and its figures.", body = StoreStatus),
              (status = 503, description = "The store is unavailable.", body = domain::Problem)))]
async fn readyz(State(state): State<AppState>) -> Response {
    match state.worker.call(Status).await {
        Ok(status) => Json(status).into_response(),
        Err(error) => command_error(error),
    }
}

/// Prometheus metrics (text exposition format 0.0.4).
#[utoipa::path(get, path = "/metrics", responses(service_common::openapi::MetricsResponses))]
async fn metrics_endpoint(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => {
            if let Ok(report) = call(&state, "quality", Quality).await {
                record_quality(&report);
            }
            if let Ok(stats) = call(&state, "stats", Stats).await {
                record_stats(&stats);
            }
            if let Ok(report) = call(&state, "consolidation-status", ConsolidationStatus).await {
                record_consolidation(&report);
            }
            service_common::telemetry::render_metrics(handle)
        }
        None => problem(ProblemKind::NoMetrics, "no metrics recorder is installed"),
    }
}

/// The occupancy of `GET /v1/stats` as gauges, read at each scrape (O(VMs), like `/v1/stats`): hosts,
/// empty hosts, VMs and cores by predicted lifetime class, packing density, empty-to-free; and the
/// rejections since start by reason and the repredictions as counters.
fn record_stats(stats: &placement::AllocatorStats) {
    metrics::gauge!("allocator_hosts").set(stats.hosts as f64);
    metrics::gauge!("allocator_available_hosts").set(stats.available_hosts as f64);
    metrics::gauge!("allocator_empty_hosts").set(stats.empty_hosts as f64);
    metrics::gauge!("allocator_packing_density").set(stats.packing_density);
    metrics::gauge!("allocator_empty_to_free_ratio").set(stats.empty_to_free_ratio);
    metrics::gauge!("allocator_allocated_cores").set(stats.allocated_cores);
    metrics::gauge!("allocator_capacity_cores").set(stats.capacity_cores);
    metrics::gauge!("allocator_allocated_memory_gib").set(stats.allocated_memory_gib);
    metrics::gauge!("allocator_capacity_memory_gib").set(stats.capacity_memory_gib);
    for (class, vms, cores) in
        [("short", stats.vms_short, stats.cores_short), ("long", stats.vms_long, stats.cores_long)]
    {
        metrics::gauge!("allocator_vms", "class" => class).set(vms as f64);
        metrics::gauge!("allocator_vm_cores", "class" => class).set(cores);
    }
    for (reason, count) in &stats.rejections {
        metrics::counter!("allocator_rejections_total", "reason" => reason.clone()).absolute(*count);
    }
    metrics::counter!("allocator_repredictions_total").absolute(stats.repredictions);
}

/// Consolidation's counters, budget and progress, read at each scrape while it is on.
fn record_consolidation(report: &placement::consolidation::ConsolidationReport) {
    let c = &report.counters;
    for (name, value) in [
        ("allocator_consolidation_rounds_total", c.rounds),
        ("allocator_consolidation_hosts_started_total", c.hosts_started),
        ("allocator_consolidation_hosts_emptied_total", c.hosts_emptied),
        ("allocator_consolidation_hosts_abandoned_total", c.hosts_abandoned),
        ("allocator_consolidation_migrations_started_total", c.migrations_started),
        ("allocator_consolidation_migrations_completed_total", c.migrations_completed),
        ("allocator_consolidation_migrations_avoided_total", c.avoided),
        ("allocator_consolidation_migrations_cancelled_total", c.cancelled),
        ("allocator_consolidation_migrations_wasted_total", c.wasted),
        ("allocator_consolidation_migrations_wasted_6h_total", c.wasted_6h),
    ] {
        metrics::counter!(name).absolute(value);
    }
    metrics::gauge!("allocator_consolidation_budget").set(report.budget);
    metrics::gauge!("allocator_consolidation_hosts_emptying").set(report.hosts.len() as f64);
    metrics::gauge!("allocator_consolidation_migrations_in_flight").set(report.in_flight.len() as f64);
    metrics::gauge!("allocator_consolidation_in_flight_limit").set(report.in_flight_limit as f64);
    metrics::gauge!("allocator_consolidation_paused").set(if report.paused { 1.0 } else { 0.0 });
    metrics::gauge!("allocator_consolidation_moved_gib").set(c.moved_gib);
}

/// The realized quality as gauges, per model version: `allocator_prediction_quality{version, figure}`
/// and the resolved and pending VMs.
fn record_quality(report: &domain::QualityReport) {
    for version in &report.versions {
        let v = version.version.clone();
        metrics::gauge!("allocator_prediction_outcomes_resolved", "version" => v.clone())
            .set(version.resolved_total as f64);
        metrics::gauge!("allocator_prediction_outcomes_pending", "version" => v.clone()).set(version.pending as f64);
        for (figure, value) in version.figures.named() {
            if let Some(value) = value {
                metrics::gauge!("allocator_prediction_quality", "version" => v.clone(), "figure" => figure).set(value);
            }
        }
    }
}
