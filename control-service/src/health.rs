//! Readiness of upstream services: each target's `/readyz` is probed in the background, and calls
//! report their outcome too, so request paths can skip (or report) a down upstream without waiting
//! for it. One slow or failed probe proves little (a GC pause, a busy core), so an upstream is
//! marked down only after `down_after_failures` consecutive failures, and up again after
//! `up_after_successes` consecutive successful probes; a probe has its own timeout, not the interval.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The paths of the calls every `POST /allocate` makes, whose URLs each [`Upstream`] parses once:
/// parsing them per call (the host through IDNA processing) was 4% of the control service's CPU
/// under the e2e bench (issue 32).
pub const PARSED_PATHS: [&str; 2] = ["/v1/allocations", "/v1/predict"];

/// When an upstream counts as down or up again, and how long a probe may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthPolicy {
    pub probe_timeout_ms: u64,
    pub down_after_failures: u32,
    pub up_after_successes: u32,
}

/// One upstream's readiness as last concluded from its probes and calls.
#[derive(Debug)]
pub struct Upstream {
    pub base: String,
    /// The URLs of [`PARSED_PATHS`] on this upstream, parsed once.
    parsed: Vec<(&'static str, reqwest::Url)>,
    policy: HealthPolicy,
    ready: AtomicBool,
    /// Consecutive failures since the last success.
    failures: AtomicU32,
    /// Consecutive successes since the last failure.
    successes: AtomicU32,
    /// The upstream's last answer to a call was 401: it refuses the service token this service
    /// presents (a configuration error, logged once per change, not once per call).
    credential_refused: AtomicBool,
}

impl Upstream {
    /// A new upstream, presumed ready until calls or probes say otherwise: the first request finds
    /// out quickly either way.
    pub fn new(base: &str, policy: HealthPolicy) -> Arc<Self> {
        let base = base.trim_end_matches('/').to_owned();
        let parsed =
            PARSED_PATHS.iter().filter_map(|path| Some((*path, reqwest::Url::parse(&format!("{base}{path}")).ok()?)));
        Arc::new(Upstream {
            parsed: parsed.collect(),
            base,
            policy,
            ready: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            credential_refused: AtomicBool::new(false),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A `method` request of `client` to `path` on this upstream, with the URL parsed once for the
    /// paths of [`PARSED_PATHS`].
    pub fn request(&self, client: &reqwest::Client, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        match self.parsed.iter().find(|(parsed, _)| *parsed == path) {
            Some((_, url)) => client.request(method, url.clone()),
            None => client.request(method, self.url(path)),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// A probe or a call failed: down once `down_after_failures` failed in a row.
    pub fn record_failure(&self) {
        self.successes.store(0, Ordering::Relaxed);
        let failures = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if failures >= self.policy.down_after_failures {
            self.set_ready(false);
        }
    }

    /// A probe or a call succeeded: up again once `up_after_successes` succeeded in a row. (Calls
    /// reach only upstreams that are up, so in practice probes bring a down upstream back.)
    pub fn record_success(&self) {
        // Skip the writes on the hot path of a healthy upstream.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.is_ready() {
            return;
        }
        let successes = self.successes.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if successes >= self.policy.up_after_successes {
            self.set_ready(true);
        }
    }

    /// A call was answered: 401 means the upstream refuses this service's service token. Logged
    /// at ERROR when that starts and at INFO when it ends, and counted in
    /// `control_upstream_credential_refused_total`.
    pub fn record_credential(&self, refused: bool) {
        if refused {
            metrics::counter!("control_upstream_credential_refused_total", "upstream" => self.base.clone())
                .increment(1);
        }
        // Skip the write on the hot path of an upstream that accepts the token.
        if self.credential_refused.load(Ordering::Relaxed) == refused {
            return;
        }
        if self.credential_refused.swap(refused, Ordering::Relaxed) != refused {
            if refused {
                tracing::error!(
                    upstream = %self.base,
                    "the upstream refuses this control service's service token (401): check that its \
                     `service_token` and this service's `[allocator]`/`[inference]` `service_token` are the same"
                );
            } else {
                tracing::info!(upstream = %self.base, "the upstream accepts the service token again");
            }
        }
    }

    fn set_ready(&self, ready: bool) {
        if self.ready.swap(ready, Ordering::Relaxed) != ready {
            if ready {
                tracing::info!(upstream = %self.base, "upstream is ready again");
            } else {
                tracing::warn!(
                    upstream = %self.base,
                    failures = self.policy.down_after_failures,
                    "upstream is down after consecutive failures; skipping it until its probes succeed"
                );
            }
        }
    }
}

/// Probes each target's `/readyz` every `interval`, each within the target's own probe timeout,
/// until the runtime shuts down. Targets are probed independently, so one slow target does not
/// delay the others' probes.
pub fn spawn_probes(client: reqwest::Client, targets: Vec<Arc<Upstream>>, interval: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    for target in targets {
        let client = client.clone();
        tokio::spawn(async move {
            let timeout = Duration::from_millis(target.policy.probe_timeout_ms.max(1));
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                let probe = client.get(target.url("/readyz")).timeout(timeout).send().await;
                if probe.is_ok_and(|response| response.status().is_success()) {
                    target.record_success();
                } else {
                    target.record_failure();
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(down_after_failures: u32, up_after_successes: u32) -> Arc<Upstream> {
        Upstream::new("http://u/", HealthPolicy { probe_timeout_ms: 100, down_after_failures, up_after_successes })
    }

    #[test]
    fn down_only_after_consecutive_failures() {
        let u = upstream(3, 1);
        assert_eq!(u.url("/readyz"), "http://u/readyz");
        u.record_failure();
        u.record_failure();
        assert!(u.is_ready(), "two failures of three");
        // A success in between restarts the count.
        u.record_success();
        u.record_failure();
        u.record_failure();
        assert!(u.is_ready());
        u.record_failure();
        assert!(!u.is_ready());
    }

    #[test]
    fn up_again_after_consecutive_successes() {
        let u = upstream(1, 2);
        u.record_failure();
        assert!(!u.is_ready());
        u.record_success();
        assert!(!u.is_ready(), "one success of two");
        u.record_failure();
        u.record_success();
        assert!(!u.is_ready(), "the failure restarted the count");
        u.record_success();
        assert!(u.is_ready());
    }

    #[tokio::test]
    async fn a_probe_slower_than_the_interval_but_within_its_timeout_succeeds() {
        use axum::routing::get;
        let app = axum::Router::new().route(
            "/readyz",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(60)).await;
                "ready"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let target = Upstream::new(
            &format!("http://{address}"),
            HealthPolicy { probe_timeout_ms: 1_000, down_after_failures: 1, up_after_successes: 1 },
        );
        // Start down: only successful probes can bring it up.
        target.record_failure();
        spawn_probes(reqwest::Client::new(), vec![target.clone()], Duration::from_millis(20));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(target.is_ready(), "60 ms answers within a 1 s probe timeout count, whatever the 20 ms interval");
    }
}
