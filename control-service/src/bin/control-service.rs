//! `control-service`: the public `POST /allocate` front door of the stack.

use anyhow::{bail, Context, Result};
use clap::Parser;
use control_service::api::{router, AppState};
use control_service::auth::ApiKeys;
use control_service::cache::PredictionCache;
use control_service::config::{ControlConfig, ZoneConfig};
use control_service::control::{Control, Counters};
use control_service::health::spawn_probes;
use control_service::inference::InferenceClient;
use control_service::predictions::{Resolver, ResolverConfig};
use control_service::quality::QualityWatch;
use control_service::rate_limit::RateLimiter;
use control_service::safeguard::Safeguard;
use control_service::timeline::Timeline;
use control_service::upstream::Allocators;
use domain::ZoneId;
use service_common::auth::{refuse_open_beyond_loopback, token_from_env};
use service_common::cli::ServeArgs;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "control-service",
    version,
    about = "Serve POST /allocate: predict lifetimes, then place through the zone's allocator"
)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
    /// An inference server's base URL; repeat for round robin. Replaces the configured list.
    #[arg(long = "inference-server", value_name = "URL")]
    inference_servers: Vec<String>,
    /// A zone's allocator, as NAME=URL (NAME=URL,URL,... for several agents on one shared store);
    /// repeat for more zones. Sets or replaces that zone.
    #[arg(long = "zone", value_name = "NAME=URL[,URL...]")]
    zones: Vec<String>,
}

fn main() -> Result<()> {
    service_common::telemetry::init_tracing();
    let cli = Cli::parse();
    let mut config = cli.serve.config_or_default(ControlConfig::load)?;
    cli.serve.apply(&mut config.listen, &mut config.insecure_open);
    if !cli.inference_servers.is_empty() {
        config.inference.servers = cli.inference_servers;
    }
    for zone in cli.zones {
        let Some((name, url)) = zone.split_once('=') else {
            bail!("--zone `{zone}`: expected NAME=URL[,URL...], e.g. --zone zone-1=http://127.0.0.1:8082");
        };
        let urls: Vec<String> = url.split(',').map(str::to_owned).collect();
        config.zones.insert(name.to_owned(), ZoneConfig { allocator: None, allocators: urls });
    }
    config.check().context("invalid configuration")?;
    let keys = ApiKeys::from_config(&config.auth).context("loading the API keys")?;
    refuse_open_beyond_loopback(
        config.listen,
        keys.is_open(),
        config.insecure_open,
        "configure [auth] keys (docs/control-service.md#authentication)",
    )?;
    let runtime = service_common::layers::runtime(config.runtime_threads).context("starting the async runtime")?;
    runtime.block_on(serve(config, keys))
}

/// The client of one kind of upstream; with `service_token`, every call presents it (a call that
/// sets its own `Authorization`, such as the admin rollout calls, keeps its own).
fn http_client(max_idle: usize, service_token: Option<&str>) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = service_token {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .context("the service token must be printable ASCII without line breaks")?;
        // Kept out of debug output and HTTP/2 header compression tables.
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .default_headers(headers)
        .tcp_nodelay(true)
        .pool_max_idle_per_host(max_idle)
        .pool_idle_timeout(Duration::from_secs(90))
        .build()
        .context("building the HTTP client")
}

async fn serve(mut config: ControlConfig, keys: ApiKeys) -> Result<()> {
    let metrics = service_common::telemetry::install_prometheus().map_err(anyhow::Error::msg)?;
    config.inference.service_token =
        token_from_env("CONTROL_INFERENCE_SERVICE_TOKEN", config.inference.service_token.take())?;
    config.allocator.service_token =
        token_from_env("CONTROL_ALLOCATOR_SERVICE_TOKEN", config.allocator.service_token.take())?;
    for (upstream, token, variable) in [
        ("inference servers", &config.inference.service_token, "CONTROL_INFERENCE_SERVICE_TOKEN"),
        ("allocators", &config.allocator.service_token, "CONTROL_ALLOCATOR_SERVICE_TOKEN"),
    ] {
        if token.is_none() {
            // An upstream that requires one refuses every call with 401; say why up front.
            tracing::warn!(
                "no service token for the {upstream}: calls carry no credential, which only upstreams in open mode \
                 accept (set `service_token` or {variable}; docs/control-service.md#service-credentials)"
            );
        }
    }
    let inference_http = http_client(config.inference.max_idle_connections, config.inference.service_token.as_deref())?;
    let allocator_http = http_client(config.allocator.max_idle_connections, config.allocator.service_token.as_deref())?;
    if keys.is_open() {
        // Every start, so that an open front door is never a silent default in production.
        tracing::warn!(
            "OPEN MODE: the public API needs no API key and every caller may act for any tenant (look up and \
             release any VM, set any request time); for local demos only. Configure [auth] keys \
             (docs/control-service.md#authentication) before exposing this service"
        );
    } else {
        let (tenants, operators) = keys.counts();
        tracing::info!(tenant_keys = tenants, operator_keys = operators, "API keys required");
    }
    let inference = InferenceClient::new(
        inference_http.clone(),
        &config.inference.servers,
        config.inference.health(),
        config.inference.history.then_some(config.inference.history_max_pending),
    );
    spawn_probes(
        inference_http,
        inference.servers().to_vec(),
        Duration::from_millis(config.inference.health_interval_ms),
    );
    let allocators = Allocators::new(
        allocator_http.clone(),
        config.zones.iter().map(|(name, zone)| (ZoneId(name.clone()), zone.urls())),
        Duration::from_millis(config.allocator.timeout_ms),
        config.allocator.health(),
    );
    spawn_probes(
        allocator_http,
        allocators.zones().flat_map(|(_, agents)| agents.iter().cloned()).collect(),
        Duration::from_millis(config.allocator.health_interval_ms),
    );
    if let Ok(token) = std::env::var("CONTROL_INFERENCE_ADMIN_TOKEN") {
        config.quality.inference_admin_token = Some(token).filter(|t| !t.is_empty());
    }
    let mut resolver = Resolver::new(
        inference,
        PredictionCache::new(config.cache.max_entries, Duration::from_secs(config.cache.ttl_s)),
        Safeguard::new(config.safeguard.clone()),
        ResolverConfig {
            budget: Duration::from_millis(config.inference.timeout_ms),
            key: config.cache.key_spec()?,
            interval_class: config.inference.interval_class,
        },
    );
    let watched = config.quality.enabled && !config.inference.servers.is_empty();
    if watched {
        resolver = resolver.with_quality(Arc::new(QualityWatch::new(config.quality.clone())));
    }
    let control = Control {
        resolver,
        allocators,
        default_zone: ZoneId(config.default_zone.clone()),
        limits: config.limits.clone(),
        started: Instant::now(),
        counters: Counters::default(),
        keys,
        rate_limiter: RateLimiter::new(config.rate_limit.clone()),
        max_skew_s: config.request_time.max_skew_s,
        timeline: Timeline::new(config.dashboard.history_samples, config.dashboard.history_interval_ms),
    };
    let control = Arc::new(control);
    if config.inference.history {
        // History events that no prediction took along go on their own.
        let flushing = Arc::clone(&control);
        every(Duration::from_millis(config.inference.history_flush_ms.max(10)), move || {
            let flushing = Arc::clone(&flushing);
            async move { flushing.resolver.predictor().flush_history().await }
        });
    }
    if config.dashboard.history_samples > 0 {
        // The console's timeline.
        let sampling = Arc::clone(&control);
        every(Duration::from_millis(config.dashboard.history_interval_ms), move || {
            let sampling = Arc::clone(&sampling);
            async move { sampling.sample_timeline().await }
        });
    }
    if config.cache.max_entries > 0 && !config.inference.servers.is_empty() {
        // The rollout the cached answers are keyed on (the stable bundle and the canary's share).
        let following = Arc::clone(&control);
        let timeout = Duration::from_millis(config.inference.timeout_ms.max(1_000));
        every(Duration::from_millis(config.cache.rollout_poll_ms), move || {
            let following = Arc::clone(&following);
            async move { following.follow_rollout(timeout).await }
        });
    }
    if watched {
        // The zones' realized quality, the quality gate and auto canaries.
        let watching = Arc::clone(&control);
        let timeout = Duration::from_millis(config.allocator.timeout_ms.max(1_000));
        every(Duration::from_millis(config.quality.poll_ms), move || {
            let watching = Arc::clone(&watching);
            async move { watching.poll_quality(timeout).await }
        });
    }
    let app = service_common::layers::apply(router(AppState { control, metrics: Some(metrics) }), &config.http);
    let listener =
        service_common::server::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(
        listen = %config.listen,
        zones = ?config.zones.keys().collect::<Vec<_>>(),
        inference_servers = ?config.inference.servers,
        "control service listening"
    );
    service_common::server::serve(listener, app, &config.http, service_common::layers::shutdown_signal()).await?;
    Ok(())
}

/// Runs `work` every `period` on the runtime, a late round delaying the next rather than bunching.
fn every<F, Fut>(period: Duration, work: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            work().await;
        }
    });
}
