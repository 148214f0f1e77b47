//! The zones' allocators: forwarding placement, release and lookup calls to the allocator of a zone,
//! with the request id carried along. Answers come back as status and body, for the API layer to
//! pass on; only transport failures are errors here.

use crate::health::{HealthPolicy, Upstream};
use domain::{AllocationRequest, TenantId, ZoneId};
use reqwest::StatusCode;
use service_common::layers::REQUEST_ID_HEADER;
use std::collections::BTreeMap;
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
}

/// An allocator's answer.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: Option<String>,
    /// The allocator's `Retry-After` (on 503 and 429), passed on so the client backs off as asked.
    pub retry_after: Option<String>,
    pub body: axum::body::Bytes,
}

pub struct Allocators {
    client: reqwest::Client,
    zones: BTreeMap<ZoneId, Arc<Upstream>>,
    timeout: Duration,
}

impl Allocators {
    pub fn new(
        client: reqwest::Client,
        zones: impl IntoIterator<Item = (ZoneId, String)>,
        timeout: Duration,
        health: HealthPolicy,
    ) -> Self {
        let zones = zones.into_iter().map(|(zone, url)| (zone, Upstream::new(&url, health))).collect();
        Allocators { client, zones, timeout }
    }

    pub fn zones(&self) -> impl Iterator<Item = (&ZoneId, &Arc<Upstream>)> {
        self.zones.iter()
    }

    pub fn contains(&self, zone: &ZoneId) -> bool {
        self.zones.contains_key(zone)
    }

    pub async fn allocate(
        &self,
        zone: &ZoneId,
        request: &AllocationRequest,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        let upstream = self.upstream(zone)?;
        let call = self.client.post(upstream.url("/v1/allocations")).json(request);
        self.send(zone, call, request_id).await
    }

    /// Releases a VM; with an `owner`, only if that tenant placed it (the allocator checks and
    /// releases in one step, and answers 404 for another tenant's VM).
    pub async fn release(
        &self,
        zone: &ZoneId,
        vm_id: &str,
        owner: Option<&TenantId>,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        let upstream = self.upstream(zone)?;
        let call = self.client.delete(upstream.url(&vm_path(vm_id, owner)));
        self.send(zone, call, request_id).await
    }

    /// Where a VM is; with an `owner`, 404 unless that tenant placed it.
    pub async fn lookup(
        &self,
        zone: &ZoneId,
        vm_id: &str,
        owner: Option<&TenantId>,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        let upstream = self.upstream(zone)?;
        let call = self.client.get(upstream.url(&vm_path(vm_id, owner)));
        self.send(zone, call, request_id).await
    }

    pub async fn stats(&self, zone: &ZoneId, request_id: Option<&str>) -> Result<Answer, UpstreamError> {
        let upstream = self.upstream(zone)?;
        let call = self.client.get(upstream.url("/v1/stats"));
        self.send(zone, call, request_id).await
    }

    fn upstream(&self, zone: &ZoneId) -> Result<&Arc<Upstream>, UpstreamError> {
        self.zones.get(zone).ok_or_else(|| UpstreamError::UnknownZone(zone.clone()))
    }

    async fn send(
        &self,
        zone: &ZoneId,
        mut call: reqwest::RequestBuilder,
        request_id: Option<&str>,
    ) -> Result<Answer, UpstreamError> {
        if let Some(id) = request_id {
            call = call.header(REQUEST_ID_HEADER, id);
        }
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let failed = |error: reqwest::Error| {
            if error.is_timeout() {
                UpstreamError::Timeout { zone: zone.clone(), timeout_ms }
            } else {
                UpstreamError::Unreachable { zone: zone.clone(), message: error.to_string() }
            }
        };
        let upstream = self.upstream(zone)?;
        let response = call.timeout(self.timeout).send().await.map_err(|error| {
            if !error.is_timeout() {
                upstream.record_failure();
            }
            failed(error)
        })?;
        upstream.record_success();
        let status = response.status();
        let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let (content_type, retry_after) = (header(reqwest::header::CONTENT_TYPE), header(reqwest::header::RETRY_AFTER));
        let body = response.bytes().await.map_err(failed)?;
        Ok(Answer { status, content_type, retry_after, body })
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
fn encode_segment(segment: &str) -> String {
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
