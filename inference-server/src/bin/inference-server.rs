//! `inference-server`: serves lifetime-model bundles over HTTP.

use anyhow::{Context, Result};
use clap::Parser;
use inference_server::api::{router, AppState};
use inference_server::config::ServerConfig;
use inference_server::history::ServerHistory;
use inference_server::registry::Registry;
use service_common::auth::{refuse_open_beyond_loopback, token_from_env, ServiceTokens};
use service_common::cli::ServeArgs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "inference-server", version, about = "Serve lifetime-model bundles over HTTP")]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    /// Directory of model bundles.
    #[arg(long)]
    models_dir: Option<PathBuf>,
}

fn main() -> Result<()> {
    service_common::telemetry::init_tracing();
    let cli = Cli::parse();
    let mut config = cli.serve.config_or_default(ServerConfig::load)?;
    cli.serve.apply(&mut config.listen, &mut config.insecure_open);
    if let Some(dir) = cli.models_dir {
        config.models_dir = dir;
    }
    if let Ok(token) = std::env::var("INFERENCE_ADMIN_TOKEN") {
        config.admin_token = Some(token);
    }
    config.service_token = token_from_env("INFERENCE_SERVICE_TOKEN", config.service_token.take())?;
    config.previous_service_token =
        token_from_env("INFERENCE_PREVIOUS_SERVICE_TOKEN", config.previous_service_token.take())?;
    refuse_open_beyond_loopback(
        config.listen,
        ServiceTokens::new(config.service_token.as_deref(), None, None).is_open(),
        config.insecure_open,
        "set `service_token` or INFERENCE_SERVICE_TOKEN(_FILE)",
    )?;
    let runtime = service_common::layers::runtime(config.runtime_threads).context("starting the async runtime")?;
    runtime.block_on(serve(config))
}

async fn serve(config: ServerConfig) -> Result<()> {
    let registry = Arc::new(Registry::with_options(&config.models_dir, config.registry_options()));
    // Scans read the disk: on a blocking thread, never on the runtime's.
    let first_scan = Arc::clone(&registry);
    match tokio::task::spawn_blocking(move || first_scan.refresh()).await.context("the first models scan panicked")? {
        Ok(_) => {}
        // Start anyway and report not ready: a bundle may be rolled out into the directory later.
        Err(error @ inference_server::registry::RegistryError::NoBundle(_)) => {
            tracing::warn!(%error, "no valid model bundle yet; /readyz answers 503 until one appears");
        }
        Err(error) => {
            return Err(error).with_context(|| format!("loading bundles from {}", config.models_dir.display()));
        }
    }
    let metrics = service_common::telemetry::install_prometheus().map_err(anyhow::Error::msg)?;

    // Watch the models directory: new or changed bundles and rollout-file edits take effect here.
    // A scan waits for each bundle at most the load timeout; one that overruns even that (a listing
    // or `stat` that hangs) is waited for again on the next tick, and no second scan is stacked on it.
    let watched = Arc::clone(&registry);
    let interval = Duration::from_millis(config.watch_interval_ms.max(50));
    let scan_timeout = Duration::from_millis(config.bundle_load_timeout_ms).saturating_add(Duration::from_secs(5));
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut overrunning = None;
        // A retired bundle's memory is freed once the last request holding it is done: given back
        // to the operating system one tick after the scan that dropped it (glibc keeps it in its
        // arenas otherwise; docs/benchmarks.md, "Soak").
        let (mut retired, mut give_back) = (watched.retired(), false);
        loop {
            ticker.tick().await;
            if std::mem::take(&mut give_back) {
                let _ = tokio::task::spawn_blocking(service_common::server::release_free_memory).await;
            }
            let mut scan = overrunning.take().unwrap_or_else(|| {
                let registry = Arc::clone(&watched);
                tokio::task::spawn_blocking(move || registry.refresh())
            });
            match tokio::time::timeout(scan_timeout, &mut scan).await {
                Err(_) => {
                    tracing::warn!(timeout = ?scan_timeout, "models directory scan still running; waiting for it before the next one");
                    overrunning = Some(scan);
                }
                Ok(Ok(Err(error @ inference_server::registry::RegistryError::NoBundle(_)))) => {
                    tracing::debug!(%error, "still no valid model bundle");
                }
                Ok(Ok(Err(error))) => tracing::warn!(%error, "models directory scan failed"),
                Ok(Err(error)) => tracing::warn!(%error, "models directory scan panicked"),
                Ok(Ok(Ok(_))) => {}
            }
            give_back = watched.retired() != retired;
            retired = watched.retired();
        }
    });

    let history = Arc::new(
        ServerHistory::new(config.history.clone())
            .context("opening `history.served_rows` (check the path and its directory)")?,
    );
    let state = AppState::new(&config, registry, history, Some(metrics));
    state.service_tokens.warn_if_open("inference server", "INFERENCE_SERVICE_TOKEN");
    let app = service_common::layers::apply(router(state), &config.http);
    let listener =
        service_common::server::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, models_dir = %config.models_dir.display(), "inference server ready");
    service_common::server::serve(listener, app, &config.http, service_common::layers::shutdown_signal()).await?;
    Ok(())
}
