//! `--confirm-migrations`: vmreplay as the orchestrator of an allocator that consolidates. It reads
//! the allocator's consolidation (`GET /v1/consolidation`) as the replay goes and confirms each
//! migration (`POST /v1/migrations/{vm_id}/complete?completed_at_s=`) once it has run its time on
//! the trace's clock; which ones are due is `replay::due`, this file does the HTTP.

use anyhow::{anyhow, bail, Context, Result};
use placement::consolidation::ConsolidationReport;
use replay::MigrationSummary;
use reqwest::{StatusCode, Url};
use std::path::Path;
use std::time::Duration;
use tokio::sync::oneshot;

/// Where the admin token comes from when `--admin-token-file` is not given.
pub const ADMIN_TOKEN_ENV: &str = "VMREPLAY_ADMIN_TOKEN";

pub struct Orchestrator {
    client: reqwest::Client,
    base: Url,
    summary: MigrationSummary,
    warned: bool,
}

/// The admin token from `--admin-token-file`, else from the environment.
pub fn admin_token(file: Option<&Path>) -> Result<String> {
    let token = match file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("--admin-token-file {}: cannot read it", path.display()))?
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned(),
        None => std::env::var(ADMIN_TOKEN_ENV).unwrap_or_default(),
    };
    if token.is_empty() {
        bail!(
            "--confirm-migrations needs the allocator's admin token: pass --admin-token-file PATH or set \
             ${ADMIN_TOKEN_ENV} (scripts/stack.sh writes it to target/stack/admin-token)"
        );
    }
    Ok(token)
}

impl Orchestrator {
    /// Checks that the allocator at `base` answers its consolidation to `token`: a wrong address or
    /// token fails here, before the replay sends anything.
    pub async fn connect(base: &str, token: &str, migration_s: f64, timeout: Duration) -> Result<Self> {
        if !(migration_s.is_finite() && migration_s > 0.0) {
            bail!("--migration-s must be a positive number of trace seconds, got {migration_s}");
        }
        let base = Url::parse(base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base())
            .ok_or_else(|| {
                anyhow!("--confirm-migrations `{base}` must be the allocator's http:// URL, e.g. http://127.0.0.1:8082")
            })?;
        let headers = crate::bearer_headers(token, "the admin token")?;
        let client = reqwest::Client::builder().default_headers(headers).timeout(timeout).build()?;
        let summary = MigrationSummary { allocator: base.to_string(), migration_s, ..MigrationSummary::default() };
        let mut orchestrator = Orchestrator { client, base, summary, warned: true };
        orchestrator.read().await.map_err(|err| anyhow!("--confirm-migrations: {err:#}"))?;
        orchestrator.warned = false;
        Ok(orchestrator)
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        url.set_query(None);
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// The allocator's consolidation; `None` when it is off.
    async fn read(&mut self) -> Result<Option<ConsolidationReport>> {
        let url = self.url(&["v1", "consolidation"]);
        let response =
            self.client.get(url.clone()).send().await.map_err(|err| {
                anyhow!("cannot reach the allocator at {} (GET {url}): {err}", self.summary.allocator)
            })?;
        let status = response.status();
        let body = response.bytes().await.with_context(|| format!("GET {url}: reading the body"))?;
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            bail!("GET {url} answered {status}: the allocator refused the admin token (--admin-token-file, ${ADMIN_TOKEN_ENV})");
        }
        if status == StatusCode::NOT_FOUND {
            self.summary.off = true;
            return Ok(None);
        }
        if !status.is_success() {
            bail!("GET {url} answered {status}: {}", String::from_utf8_lossy(&body).trim());
        }
        self.summary.off = false;
        let report: ConsolidationReport =
            serde_json::from_slice(&body).with_context(|| format!("GET {url}: not an allocator's consolidation"))?;
        self.summary.consolidation = Some(report.counters.clone());
        Ok(Some(report))
    }

    fn failed(&mut self, err: anyhow::Error) {
        self.summary.errors += 1;
        if !self.warned {
            self.warned = true;
            eprintln!("vmreplay: warning: confirming migrations: {err:#}");
        }
    }

    /// Confirms the migrations done by `now_s` (trace time).
    async fn confirm_due(&mut self, now_s: f64) {
        let report = match self.read().await {
            Ok(Some(report)) => report,
            Ok(None) => return,
            Err(err) => return self.failed(err),
        };
        for (vm, done_s) in replay::due(&report, self.summary.migration_s, now_s) {
            let mut url = self.url(&["v1", "migrations", vm.as_str(), "complete"]);
            url.query_pairs_mut().append_pair("completed_at_s", &done_s.to_string());
            match self.client.post(url.clone()).send().await {
                Ok(response) if response.status().is_success() => self.summary.confirmed += 1,
                // Released meanwhile (the trace's exit came first): nothing left to confirm.
                Ok(response) if response.status() == StatusCode::NOT_FOUND => self.summary.gone += 1,
                Ok(response) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    self.failed(anyhow!("POST {url} answered {status}: {}", body.trim()));
                }
                Err(err) => self.failed(anyhow!("POST {url}: {err}")),
            }
        }
    }

    /// Confirms migrations every `every` until `stop`, then reads the counters once more.
    pub async fn run(
        mut self,
        trace_now: impl Fn() -> f64,
        every: Duration,
        mut stop: oneshot::Receiver<()>,
    ) -> MigrationSummary {
        let mut ticker = tokio::time::interval(every);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = ticker.tick() => self.confirm_due(trace_now()).await,
            }
        }
        if let Err(err) = self.read().await {
            // The counters of an earlier read are not the end's.
            self.summary.consolidation = None;
            self.failed(err);
        }
        self.summary
    }
}
