//! Background readiness probes of upstream services: each target's `/readyz` is asked at an interval
//! and its flag set from the answer, so request paths can skip (or report) a down upstream without
//! waiting for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One upstream's readiness as last seen.
#[derive(Debug)]
pub struct Upstream {
    pub base: String,
    ready: AtomicBool,
}

impl Upstream {
    /// A new upstream, presumed ready until a call or a probe says otherwise: the first request
    /// finds out quickly either way.
    pub fn new(base: &str) -> Arc<Self> {
        Arc::new(Upstream { base: base.trim_end_matches('/').to_owned(), ready: AtomicBool::new(true) })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn set_ready(&self, ready: bool) {
        if self.ready.swap(ready, Ordering::Relaxed) != ready {
            if ready {
                tracing::info!(upstream = %self.base, "upstream is ready again");
            } else {
                tracing::warn!(upstream = %self.base, "upstream is down; skipping it until a probe succeeds");
            }
        }
    }
}

/// Probes every target's `/readyz` each `interval` (answers slower than the interval count as down)
/// until the runtime shuts down.
pub fn spawn_probes(client: reqwest::Client, targets: Vec<Arc<Upstream>>, interval: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            for target in &targets {
                let probe = client.get(target.url("/readyz")).timeout(interval).send().await;
                target.set_ready(probe.is_ok_and(|response| response.status().is_success()));
            }
        }
    });
}
