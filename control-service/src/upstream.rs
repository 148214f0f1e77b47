//! The zones' allocators: forwarding placement, release and lookup calls to the allocator of a zone,
//! with the request id carried along. The HTTP of those calls stays here: a placement comes back as
//! the allocator's decision ([`Decided`]) or as why there is none ([`AllocateFailure`]), a read of
//! its figures (statistics, realized quality) as the figures or why they are missing ([`Read`]);
//! the calls the API layer passes on to the client as they came (release, lookup, the zone views)
//! give the allocator's [`Answer`].
//!
//! A zone may have several allocation agents on one shared store: calls are spread over them in
//! turn (agents marked down by the health checks last), and a call that cannot reach an agent, or
//! that an agent answers 5xx, goes to the next one. That is safe because the agents share one
//! state: an allocation is idempotent by VM id across agents (a retry gets the first answer), a
//! release answered 404 was done already. A timeout does not fail over: the agent may be working
//! on it, and sending the same work elsewhere would only add load; the client retries.

use crate::health::{HealthPolicy, Upstream};
use domain::quality::QualityReport;
use domain::{AllocationDecision, AllocationRequest, TenantId, ZoneId};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use service_common::layers::REQUEST_ID_HEADER;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Why an allocator call has no answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The allocator did not answer in time. For a placement the outcome is unknown; retrying with
    /// the same VM ids is safe (the allocator answers a retry with the earlier decision).
    #[error("the allocator of zone `{zone}` did not answer within {timeout_ms} ms")]
    Timeout { zone: ZoneId, timeout_ms: u64 },
    /// No connection could be made, or it broke: the request may or may not have arrived.
    #[error("the allocator of zone `{zone}` could not be reached: {message}")]
    Unreachable { zone: ZoneId, message: String },
    #[error("no allocator is configured for zone `{0}`")]
    UnknownZone(ZoneId),
    /// Every agent tried answered 401: they require a service token this control service does not
    /// present (`[allocator] service_token`). Nothing was done.
    #[error("the allocator of zone `{zone}` refused the control service's service token (401)")]
    CredentialRefused { zone: ZoneId },
}

/// A placement the zone's allocator decided.
#[derive(Debug)]
pub struct Decided {
    /// The base URL of the agent that decided.
    pub agent: String,
    pub decision: AllocationDecision,
    /// Placed by this very request (201); otherwise rejected, or replayed from an earlier request (200).
    pub created: bool,
    /// The allocator's `Server-Timing`: where its part of the request's time went.
    pub server_timing: Option<String>,
}

/// Why a placement got no decision from the zone's allocator.
#[derive(Debug, thiserror::Error)]
pub enum AllocateFailure {
    /// Not reached, or no answer in time.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// It answered with an error of its own (4xx, 5xx), to pass on to the client as it came.
    #[error("the allocator answered {}", .0.status)]
    Refused(Answer),
    /// Its answer could not be read as a decision.
    #[error("the allocator of zone `{zone}` answered {status} with an unreadable decision: {error}")]
    Unreadable { zone: ZoneId, status: u16, error: String },
}

/// An agent's answer to a read of its figures: the figures, or why the answer holds none.
#[derive(Debug)]
pub struct Read<T> {
    /// The base URL of the agent that answered.
    pub agent: String,
    pub value: Result<T, BadAnswer>,
}

/// Why an allocator's answer to a read holds no figures.
#[derive(Debug, thiserror::Error)]
pub enum BadAnswer {
    /// An error status of its own.
    #[error("the allocator answered {0}")]
    Refused(StatusCode),
    /// A success whose body is not what was asked for.
    #[error("unreadable {what}: {error}")]
    Unreadable { what: &'static str, error: serde_json::Error },
}

/// An allocator's answer.
#[derive(Debug)]
pub struct Answer {
    /// The base URL of the agent that answered.
    pub agent: String,
    pub status: StatusCode,
    pub content_type: Option<String>,
    /// The allocator's `Retry-After` (on 503 and 429), passed on so the client backs off as asked.
    pub retry_after: Option<String>,
    /// The allocator's `Server-Timing`: where its part of the request's time went.
    pub server_timing: Option<String>,
    pub body: axum::body::Bytes,
}

impl Answer {
    /// The figures (`what`, named in the error) of a read's answer.
    fn read<T: DeserializeOwned>(self, what: &'static str) -> Read<T> {
        let value = if self.status.is_success() {
            serde_json::from_slice(&self.body).map_err(|error| BadAnswer::Unreadable { what, error })
        } else {
            Err(BadAnswer::Refused(self.status))
        };
        Read { agent: self.agent, value }
    }
}

pub struct Allocators {
    client: reqwest::Client,
    zones: BTreeMap<ZoneId, Zone>,
    timeout: Duration,
}

/// One zone's agents, and where the next call starts.
struct Zone {
    agents: Vec<Arc<Upstream>>,
    next: AtomicUsize,
}

impl Allocators {
    pub fn new(
        client: reqwest::Client,
        zones: impl IntoIterator<Item = (ZoneId, Vec<String>)>,
        timeout: Duration,
        health: HealthPolicy,
    ) -> Self {
        let zones = zones
            .into_iter()
            .map(|(zone, urls)| {
                let agents = urls.iter().map(|url| Upstream::new(url, health)).collect();
                (zone, Zone { agents, next: AtomicUsize::new(0) })
            })
            .collect();
        Allocators { client, zones, timeout }
    }

    /// Every zone with its agents.
    pub fn zones(&self) -> impl Iterator<Item = (&ZoneId, &[Arc<Upstream>])> {
        self.zones.iter().map(|(zone, z)| (zone, z.agents.as_slice()))
    }

    pub fn contains(&self, zone: &ZoneId) -> bool {
        self.zones.contains_key(zone)
    }

    /// Places `request` in `zone`: the allocator's decision (201 placed, 200 rejected or replayed),
    /// else its own error answer as it came, or why there is no answer.
    pub async fn allocate(
        &self,
        zone: &ZoneId,
        request: &AllocationRequest,
        request_id: Option<&str>,
    ) -> Result<Decided, AllocateFailure> {
        let answer = self
            .send(zone, request_id, |client, agent| {
                agent.request(client, reqwest::Method::POST, "/v1/allocations").json(request)
            })
            .await?;
        if !matches!(answer.status, StatusCode::OK | StatusCode::CREATED) {
            return Err(AllocateFailure::Refused(answer));
        }
        let decision = serde_json::from_slice(&answer.body).map_err(|error| AllocateFailure::Unreadable {
            zone: zone.clone(),
            status: answer.status.as_u16(),
            error: error.to_string(),
        })?;
        Ok(Decided {
            agent: answer.agent,
            decision,
            created: answer.status == StatusCode::CREATED,
            server_timing: answer.server_timing,
        })
    }

    /// Releases a VM; with an `owner`, only if that tenant placed it (the allocator checks and
    /// releases in one step, and answers 404 for another tenant's VM). `ended_at_s` (the model's
    /// clock) resolves the VM's realized outcome.
    pub async fn release(
        &self,
        zone: &ZoneId,
        vm_id: &str,
        owner: Option<&TenantId>,
        ended_at_s: Option<f64>,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        let mut path = vm_path(vm_id, owner);
        if let Some(at) = ended_at_s.filter(|at| at.is_finite()) {
            path.push(if owner.is_some() { '&' } else { '?' });
            path.push_str(&format!("ended_at_s={at}"));
        }
        self.send(zone, request_id, |client, agent| client.delete(agent.url(&path))).await
    }

    /// Where a VM is; with an `owner`, 404 unless that tenant placed it.
    pub async fn lookup(
        &self,
        zone: &ZoneId,
        vm_id: &str,
        owner: Option<&TenantId>,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        let path = vm_path(vm_id, owner);
        self.send(zone, request_id, |client, agent| client.get(agent.url(&path))).await
    }

    /// The zone's allocator statistics (`GET /v1/stats`), as the allocator wrote them.
    pub async fn stats(
        &self,
        zone: &ZoneId,
        request_id: Option<&str>,
    ) -> Result<Read<serde_json::Value>, UpstreamError> {
        let answer = self.send(zone, request_id, |client, agent| client.get(agent.url("/v1/stats"))).await?;
        Ok(answer.read("statistics"))
    }

    /// The zone's realized prediction quality (`GET /v1/quality`).
    pub async fn quality(&self, zone: &ZoneId) -> Result<Read<QualityReport>, UpstreamError> {
        let answer = self.send(zone, None, |client, agent| client.get(agent.url("/v1/quality"))).await?;
        Ok(answer.read("quality report"))
    }

    /// A read of the allocator's public API (`path` with its query, already percent-encoded), for
    /// the operator's zone views.
    pub async fn get(&self, zone: &ZoneId, path: &str, request_id: Option<&str>) -> Result<Answer, UpstreamError> {
        self.send(zone, request_id, |client, agent| client.get(agent.url(path))).await
    }

    /// A `PUT` of `body` as JSON to the allocator's `path` (already percent-encoded).
    pub async fn put_json(
        &self,
        zone: &ZoneId,
        path: &str,
        body: &impl serde::Serialize,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        let body = serde_json::to_vec(body).unwrap_or_default();
        self.send(zone, request_id, |client, agent| {
            client.put(agent.url(path)).header(reqwest::header::CONTENT_TYPE, "application/json").body(body.clone())
        })
        .await
    }

    /// A `DELETE` of the allocator's `path` (already percent-encoded).
    pub async fn delete(&self, zone: &ZoneId, path: &str, request_id: Option<&str>) -> Result<Answer, UpstreamError> {
        self.send(zone, request_id, |client, agent| client.delete(agent.url(path))).await
    }

    /// A dry run of the allocator's public API (`POST /v1/explain`), with the caller's JSON body
    /// passed on as it came: the allocator validates it.
    pub async fn explain(
        &self,
        zone: &ZoneId,
        body: axum::body::Bytes,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        self.send(zone, request_id, |client, agent| {
            client
                .post(agent.url("/v1/explain"))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone())
        })
        .await
    }

    /// The zone's agents in the order this call tries them: in turn from the zone's next one,
    /// those marked down last.
    fn order(&self, zone: &ZoneId) -> Result<Vec<Arc<Upstream>>, UpstreamError> {
        let z = self.zones.get(zone).ok_or_else(|| UpstreamError::UnknownZone(zone.clone()))?;
        let start = z.next.fetch_add(1, Ordering::Relaxed);
        let n = z.agents.len();
        let mut agents: Vec<Arc<Upstream>> = (0..n).map(|i| z.agents[(start + i) % n].clone()).collect();
        // Stable: the turn order stays among the ready ones and among the others.
        agents.sort_by_key(|agent| !agent.is_ready());
        Ok(agents)
    }

    async fn send(
        &self,
        zone: &ZoneId,
        request_id: Option<&str>,
        build: impl Fn(&reqwest::Client, &Upstream) -> reqwest::RequestBuilder,
    ) -> Result<Answer, UpstreamError> {
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let agents = self.order(zone)?;
        let mut last_error = None;
        for (i, agent) in agents.iter().enumerate() {
            let is_last = i + 1 == agents.len();
            let mut call = build(&self.client, agent).timeout(self.timeout);
            if let Some(id) = request_id {
                call = call.header(REQUEST_ID_HEADER, id);
            }
            let response = match call.send().await {
                Ok(response) => response,
                Err(error) if error.is_timeout() => {
                    return Err(UpstreamError::Timeout { zone: zone.clone(), timeout_ms })
                }
                Err(error) => {
                    agent.record_failure();
                    metrics::counter!("control_allocator_failovers_total", "zone" => zone.to_string()).increment(1);
                    last_error = Some(UpstreamError::Unreachable { zone: zone.clone(), message: error.to_string() });
                    continue;
                }
            };
            agent.record_success();
            let status = response.status();
            let refused = status == StatusCode::UNAUTHORIZED;
            agent.record_credential(refused);
            if refused {
                // Never the caller's fault: its own key was checked here. Another agent may have
                // the token already (a rotation in progress).
                last_error = Some(UpstreamError::CredentialRefused { zone: zone.clone() });
                continue;
            }
            if status.is_server_error() && !is_last {
                metrics::counter!("control_allocator_failovers_total", "zone" => zone.to_string()).increment(1);
                continue;
            }
            let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let (content_type, retry_after, server_timing) = (
                header(reqwest::header::CONTENT_TYPE),
                header(reqwest::header::RETRY_AFTER),
                header(service_common::timing::SERVER_TIMING),
            );
            let body = response.bytes().await.map_err(|error| {
                if error.is_timeout() {
                    UpstreamError::Timeout { zone: zone.clone(), timeout_ms }
                } else {
                    UpstreamError::Unreachable { zone: zone.clone(), message: error.to_string() }
                }
            })?;
            return Ok(Answer { agent: agent.base.clone(), status, content_type, retry_after, server_timing, body });
        }
        Err(last_error.unwrap_or_else(|| UpstreamError::UnknownZone(zone.clone())))
    }
}

/// The allocator's path of one VM, restricted to `owner`'s VMs when given.
fn vm_path(vm_id: &str, owner: Option<&TenantId>) -> String {
    let path = format!("/v1/allocations/{}", encode_segment(vm_id));
    match owner {
        Some(owner) => format!("{path}?tenant={}", encode_segment(owner.as_str())),
        None => path,
    }
}

/// Percent-encodes a path segment. Validated ids never need it; it keeps anything else harmless.
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(super::encode_segment("vm-1_a.b~"), "vm-1_a.b~");
        assert_eq!(super::encode_segment("a/b c?"), "a%2Fb%20c%3F");
        let owner = domain::TenantId::from("t:1");
        assert_eq!(super::vm_path("v1", Some(&owner)), "/v1/allocations/v1?tenant=t%3A1");
        assert_eq!(super::vm_path("v1", None), "/v1/allocations/v1");
    }
}
