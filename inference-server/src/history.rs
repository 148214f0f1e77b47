//! The live history (tenants and job identities) this server predicts from (issue 18): the stable
//! bundle's feature store kept current with the events the control service sends
//! ([`lifetime_model::live`]). When the stable bundle changes, the history is rebased on the new
//! bundle's snapshot. Off (`[history] live = false`), every bundle predicts from its own frozen
//! feature store, and events are counted and dropped.

use domain::HistoryEvent;
use lifetime_model::features::RequestFeatures;
use lifetime_model::history::Past;
use lifetime_model::live::{Applied, LiveCounters, LiveHistory, LiveLimits};
use lifetime_model::LifetimeModel;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, RwLock};

/// `[history]` in the configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Keep the tenants' and jobs' history current with the control service's events (else: the
    /// bundle's frozen feature store).
    pub live: bool,
    /// Histories kept (tenants and job identities together); beyond, the least recently active
    /// one is forgotten.
    #[serde(alias = "max_tenants")]
    pub max_histories: usize,
    /// Running VMs whose start is remembered, so that their end can be recorded.
    pub max_running_vms: usize,
    /// Events kept to apply again over a new stable bundle's feature store.
    pub max_journal: usize,
    /// For audits and tests: append every prediction's encoded row, as one JSON line
    /// (`{"key", "model_version", "row"}`), to this file. It slows every prediction.
    pub served_rows: Option<PathBuf>,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        let limits = LiveLimits::default();
        HistoryConfig {
            live: true,
            max_histories: limits.max_histories,
            max_running_vms: limits.max_running_vms,
            max_journal: limits.max_journal,
            served_rows: None,
        }
    }
}

/// What `GET /v1/history` reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HistoryStatus {
    pub live: bool,
    /// The stable bundle whose feature store the history started from (none before the first
    /// event or prediction).
    pub base_version: Option<String>,
    /// Its training cut-off: events at or before it are in its feature store already.
    pub as_of_s: Option<f64>,
    pub tenants: usize,
    /// Job identities (a tenant's VMs of one type) with a history.
    pub jobs: usize,
    pub running_vms: usize,
    pub journal_events: usize,
    /// What became of the events received since the server started.
    #[schema(value_type = Object)]
    pub counters: LiveCounters,
    /// Events received while the history is off.
    pub ignored: u64,
}

struct Live {
    base_version: String,
    history: LiveHistory,
}

/// The server's history: see the module documentation.
pub struct ServerHistory {
    config: HistoryConfig,
    live: RwLock<Option<Live>>,
    ignored: std::sync::atomic::AtomicU64,
    served_rows: Option<Mutex<std::io::BufWriter<std::fs::File>>>,
}

impl ServerHistory {
    pub fn new(config: HistoryConfig) -> std::io::Result<Self> {
        let served_rows = match &config.served_rows {
            Some(path) => Some(Mutex::new(std::io::BufWriter::new(
                std::fs::OpenOptions::new().create(true).append(true).open(path)?,
            ))),
            None => None,
        };
        Ok(ServerHistory { config, live: RwLock::new(None), ignored: Default::default(), served_rows })
    }

    fn limits(&self) -> LiveLimits {
        LiveLimits {
            max_histories: self.config.max_histories,
            max_running_vms: self.config.max_running_vms,
            max_journal: self.config.max_journal,
        }
    }

    /// Makes the history follow `stable` (rebased when it changed) and applies `events`.
    pub fn apply(&self, stable: &LifetimeModel, events: &[HistoryEvent]) {
        if !self.config.live {
            self.ignored.fetch_add(events.len() as u64, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        if events.is_empty() && self.follows(stable) {
            return;
        }
        let mut live = self.live.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        self.rebase_on(&mut live, stable);
        let Some(live) = live.as_mut() else { return };
        for event in events {
            let outcome = live.history.apply(event);
            metrics::counter!("inference_history_events_total", "outcome" => outcome_name(outcome)).increment(1);
        }
        let sizes = live.history.sizes();
        metrics::gauge!("inference_history_tenants").set(sizes.tenants as f64);
        metrics::gauge!("inference_history_jobs").set(sizes.jobs as f64);
        metrics::gauge!("inference_history_running_vms").set(sizes.running_vms as f64);
        metrics::gauge!("inference_history_journal_events").set(sizes.journal_events as f64);
    }

    fn follows(&self, stable: &LifetimeModel) -> bool {
        let live = self.live.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        live.as_ref().is_some_and(|live| live.base_version == stable.version())
    }

    fn rebase_on(&self, live: &mut Option<Live>, stable: &LifetimeModel) {
        match live {
            Some(current) if current.base_version == stable.version() => {}
            Some(current) => {
                let (replayed, lost) = current.history.rebase(stable.feature_store());
                tracing::info!(
                    from = %current.base_version, to = %stable.version(), replayed, lost,
                    "the stable bundle changed: the tenants' history starts again from its feature store"
                );
                if lost {
                    tracing::warn!(
                        "events after the new bundle's cut-off had left the journal: the history misses them"
                    );
                }
                metrics::counter!("inference_history_rebases_total").increment(1);
                current.base_version = stable.version().to_owned();
            }
            None => {
                *live = Some(Live {
                    base_version: stable.version().to_owned(),
                    history: LiveHistory::new(stable.feature_store(), self.limits()),
                })
            }
        }
    }

    /// Runs `work` with a function that gives a request's past as `model` reads it: from the live
    /// history, or (off, or before the first event) from `model`'s own feature store.
    pub fn with_past<T>(&self, work: impl FnOnce(&dyn Fn(&LifetimeModel, &RequestFeatures) -> Past) -> T) -> T {
        let live = self.live.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let history = live.as_ref().filter(|_| self.config.live).map(|live| &live.history);
        work(&|model, request| match history {
            Some(history) => model.past(history, request),
            None => model.past(model.feature_store(), request),
        })
    }

    /// Appends a served row to the audit file, if one is configured.
    pub fn record_row(&self, key: &str, model_version: &str, row: &[f64]) {
        let Some(file) = &self.served_rows else { return };
        let line = serde_json::json!({ "key": key, "model_version": model_version, "row": row });
        let mut file = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(error) = writeln!(file, "{line}").and_then(|()| file.flush()) {
            tracing::warn!(%error, "the served-rows file could not be written");
        }
    }

    pub fn status(&self) -> HistoryStatus {
        let live = self.live.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let sizes = live.as_ref().map(|l| l.history.sizes()).unwrap_or_default();
        HistoryStatus {
            live: self.config.live,
            base_version: live.as_ref().map(|l| l.base_version.clone()),
            as_of_s: live.as_ref().map(|l| l.history.as_of_s()),
            tenants: sizes.tenants,
            jobs: sizes.jobs,
            running_vms: sizes.running_vms,
            journal_events: sizes.journal_events,
            counters: live.as_ref().map(|l| l.history.counters()).unwrap_or_default(),
            ignored: self.ignored.load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}

fn outcome_name(outcome: Applied) -> &'static str {
    match outcome {
        Applied::Applied => "applied",
        Applied::Duplicate => "duplicate",
        Applied::UnknownVm => "unknown_vm",
        Applied::BeforeSnapshot => "before_snapshot",
        Applied::Invalid => "invalid",
    }
}
