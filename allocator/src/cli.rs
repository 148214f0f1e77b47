//! The `allocator` command line: serves one zone's placement over HTTP, with durable state. The
//! program's `main` builds the [`Registry`] of policies and calls [`main`]; a program with
//! policies of its own registers them there.

use crate::api::{router, AppState};
use crate::config::{Clock, ServiceConfig};
use crate::durable::{ConsolidationRound, DurableAllocator, SetConsolidation, SetRepredictor};
use crate::store::StoreLocation;
use crate::worker::{unix_now_s, WeakWorker, Worker};
use anyhow::{Context, Result};
use clap::Parser;
use domain::ZoneId;
use placement::reprediction::BundleRepredictor;
use placement::Registry;
use service_common::auth::{refuse_open_beyond_loopback, token_from_env, ServiceTokens};
use service_common::cli::ServeArgs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "allocator", version, about = "Serve lifetime-aware VM placement over HTTP, with durable state")]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    /// Where the durable state lives: an SQLite file, or a PostgreSQL URL (postgres://...).
    #[arg(long)]
    store: Option<String>,
    /// Directory of model bundles that NILAS and LAVA repredict with (the inference server's).
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// The time VMs are placed and released at: `wall`, or `request` for trace replays at
    /// compressed time (the config's `clock`, docs/allocator.md).
    #[arg(long, value_parser = ["wall", "request"])]
    clock: Option<String>,
}

/// Serves the zone the command line and its configuration describe, every policy's rules and
/// presets looked up in `registry`.
pub fn main(registry: Registry) -> Result<()> {
    service_common::server::tune_malloc_for_churn();
    service_common::telemetry::init_tracing();
    let cli = Cli::parse();
    let mut config = cli.serve.config_or_default(ServiceConfig::load)?;
    cli.serve.apply(&mut config.listen, &mut config.insecure_open);
    if let Some(store) = cli.store {
        config.store = StoreLocation::from(store);
    }
    if let Some(dir) = cli.models_dir {
        config.models_dir = Some(dir);
    }
    match cli.clock.as_deref() {
        Some("request") => config.clock = Clock::Request,
        Some(_) => config.clock = Clock::Wall,
        None => {}
    }
    config.admin_token = token_from_env("ALLOCATOR_ADMIN_TOKEN", config.admin_token.take())?;
    config.service_token = token_from_env("ALLOCATOR_SERVICE_TOKEN", config.service_token.take())?;
    config.previous_service_token =
        token_from_env("ALLOCATOR_PREVIOUS_SERVICE_TOKEN", config.previous_service_token.take())?;
    config.admin_token = config.admin_token.take().filter(|t| !t.is_empty());
    let service_tokens = ServiceTokens::new(
        config.service_token.as_deref(),
        config.previous_service_token.as_deref(),
        config.admin_token.as_deref(),
    );
    // Before the store is opened: a refused start changes nothing.
    refuse_open_beyond_loopback(
        config.listen,
        service_tokens.is_open(),
        config.insecure_open,
        "set `service_token` or ALLOCATOR_SERVICE_TOKEN(_FILE)",
    )?;
    let inventory = config.inventory()?;
    let zones: Arc<[ZoneId]> = inventory.zones.iter().map(|zone| zone.id.clone()).collect();
    let started = Instant::now();
    // On the request clock, a store is reopened at its own latest time (the clock never goes back).
    let opened_at_s = match config.clock {
        Clock::Wall => unix_now_s(),
        Clock::Request => 0.0,
    };
    let mut durable =
        DurableAllocator::open(&inventory, &config.allocator, &registry, config.store.clone(), opened_at_s)
            .with_context(|| format!("recovering the allocator state from `store` = {}", config.store))?;
    durable.set_outcome_config(config.quality.outcome_config());
    durable.set_exit_retention(config.export.retention());
    let (hosts, vms) = durable.allocator().map_or((0, 0), |a| (a.state().hosts().len(), a.state().vm_count()));
    tracing::info!(
        store = %config.store, hosts, vms, policy = %durable.allocator().map_or("", |a| a.policy().name()),
        recovery_ms = started.elapsed().as_millis() as u64, "state recovered"
    );
    if let Some(consolidation) = config.consolidation.clone() {
        // The config's section, unless the store holds a consolidation of its own (set through
        // the API), which stands.
        let request = SetConsolidation { config: Some(consolidation.clone()), only_if_off: true };
        let report = durable.execute_one(request, opened_at_s).context("turning consolidation on")?;
        if report.as_ref().is_some_and(|r| r.config != consolidation) {
            tracing::warn!(
                "[consolidation] differs from the settings the store holds (set through the API), which stand; \
                 DELETE /v1/consolidation and restart to take the file's"
            );
        }
        if let Some(report) = &report {
            crate::api::consolidation::warn_of_shortfall(report);
        }
    }
    let reads_exits = durable.allocator().is_some_and(|a| a.policy().reads_exit_times());
    let (worker, handle) =
        Worker::spawn(durable, config.max_batch, config.queue, config.clock).context("starting the worker")?;

    let runtime = service_common::layers::runtime(config.runtime_threads).context("starting the async runtime")?;
    if let (Some(dir), true) = (config.models_dir.clone(), reads_exits) {
        runtime.spawn(follow_models(dir, config.model_poll_s, worker.clone()));
    }
    // On the request clock the worker runs the rounds as the requests' times pass them.
    if matches!(config.clock, Clock::Wall) {
        runtime.spawn(consolidation_rounds(worker.downgrade()));
    }
    runtime.block_on(serve(&config, worker, zones, service_tokens))?;
    // Every handle on the worker is gone with the server: let it finish its last batch and close
    // the store (committed batches are durable either way).
    let deadline = Instant::now() + Duration::from_secs(5);
    while !handle.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if handle.is_finished() {
        let _ = handle.join();
    }
    Ok(())
}

/// Keeps the repredicting model in step with the models directory, by the inference server's own
/// rules (a bundle is validated before use; a bad one leaves the current model in place). Scans run
/// on a blocking thread: they read the disk, and this runtime's thread serves the requests.
async fn follow_models(dir: PathBuf, poll_s: f64, worker: Worker) {
    let registry = Arc::new(lifetime_model::registry::Registry::new(&dir));
    let mut current: Option<String> = None;
    // A retired bundle's memory, given back to the operating system on the scan after the one that
    // dropped it (the worker let go of it by then; glibc keeps it in its arenas otherwise).
    let (mut retired, mut give_back) = (registry.retired(), false);
    loop {
        if std::mem::take(&mut give_back) {
            let _ = tokio::task::spawn_blocking(service_common::server::release_free_memory).await;
        }
        let scanning = Arc::clone(&registry);
        let scanned = tokio::task::spawn_blocking(move || scanning.refresh()).await;
        match scanned {
            Ok(Ok(_)) => {
                let model = registry.deployment().map(|d| d.stable.clone());
                let version = model.as_ref().map(|m| m.version().to_owned());
                if version != current {
                    let model =
                        model.map(|m| Arc::new(BundleRepredictor(m)) as Arc<dyn placement::reprediction::Repredictor>);
                    match worker.call(SetRepredictor(model)).await {
                        Ok(_) => {
                            tracing::info!(models = %dir.display(), version = ?version, "repredicting with the deployed bundle");
                            current = version;
                        }
                        Err(error) => tracing::warn!(%error, "could not switch the repredicting model"),
                    }
                }
            }
            Ok(Err(error)) => tracing::warn!(models = %dir.display(), %error, "scanning the models directory failed"),
            Err(error) => tracing::error!(models = %dir.display(), %error, "the models directory scan panicked"),
        }
        give_back = registry.retired() != retired;
        retired = registry.retired();
        tokio::time::sleep(Duration::from_secs_f64(poll_s.max(0.1))).await;
    }
}

/// Runs consolidation's rounds when they are due: every second the worker checks (a command that
/// writes nothing while consolidation is off or not due, so it costs no commit).
/// It holds the worker weakly: the worker still stops when the server's handles are gone.
async fn consolidation_rounds(worker: WeakWorker) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(worker) = worker.upgrade() else { return };
        match worker.call(ConsolidationRound { due_only: true }).await {
            Ok(started) if !started.is_empty() => tracing::info!(hosts = started.len(), "consolidation round"),
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "consolidation round failed"),
        }
    }
}

async fn serve(
    config: &ServiceConfig,
    worker: Worker,
    zones: Arc<[ZoneId]>,
    service_tokens: ServiceTokens,
) -> Result<()> {
    let metrics = service_common::telemetry::install_prometheus().map_err(anyhow::Error::msg)?;
    let admin_token = config.admin_token.clone();
    service_tokens.warn_if_open("allocator", "ALLOCATOR_SERVICE_TOKEN");
    let state = AppState {
        zones,
        worker,
        limits: config.limits.clone(),
        admin_token,
        service_tokens,
        metrics: Some(metrics),
        store: config.store.clone(),
        exports: Arc::new(tokio::sync::Semaphore::new(crate::api::CONCURRENT_EXPORTS)),
    };
    let app = service_common::layers::apply(router(state), &config.http);
    let listener =
        service_common::server::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, max_batch = config.max_batch, "allocator ready");
    service_common::server::serve(listener, app, &config.http, service_common::layers::shutdown_signal()).await?;
    Ok(())
}
