//! The inference servers as a [`Predictor`]: `POST /v1/predict` over a pooled, kept-alive HTTP
//! client, round robin over the servers that are up. A call that cannot connect or gets a 5xx counts
//! as a failure of that server (and the next one is tried, while the caller's budget lasts); after
//! the configured run of consecutive failures the server is skipped until its readiness probes
//! succeed again ([`crate::health`]). Also the rollout calls of the quality gate: the models the
//! servers list, and carrying a canary decision out.

use crate::health::{HealthPolicy, Upstream};
use crate::history::HistoryFeed;
use crate::predictions::{PredictError, Predictor};
use crate::quality::ModelStatus;
use domain::{
    HistoryEvent, HistoryRequest, InferenceServerHealth, LifetimePrediction, PredictRequest, PredictResponse,
};
use service_common::layers::REQUEST_ID_HEADER;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct InferenceClient {
    client: reqwest::Client,
    servers: Vec<Arc<Upstream>>,
    next: AtomicUsize,
    /// The tenants' history events each server has not had yet (none: not fed).
    history: Option<HistoryFeed>,
}

impl InferenceClient {
    /// A client of `servers`; with `history_max_pending`, it feeds them the tenants' history
    /// ([`crate::history`]).
    pub fn new(
        client: reqwest::Client,
        servers: &[String],
        health: HealthPolicy,
        history_max_pending: Option<usize>,
    ) -> Self {
        InferenceClient {
            client,
            servers: servers.iter().map(|s| Upstream::new(s, health)).collect(),
            next: AtomicUsize::new(0),
            history: history_max_pending.map(|max| HistoryFeed::new(servers.len(), max)),
        }
    }

    /// The tenants' history feed, when the servers are fed one.
    pub fn history(&self) -> Option<&HistoryFeed> {
        self.history.as_ref()
    }

    /// Sends each server the history events that no prediction took to it; those that do not get
    /// through wait for the next call.
    pub async fn flush_history(&self) {
        let Some(feed) = &self.history else { return };
        for (index, server) in self.servers.iter().enumerate() {
            let Some(_sending) = feed.sending(index).await else { continue };
            // One request's worth at a time, until the queue is empty or a send fails.
            loop {
                let events = feed.take(index);
                if events.is_empty() || !self.send_history(feed, index, server, events).await {
                    break;
                }
            }
        }
    }

    /// Sends `events` to server `index` on their own; false (and the events given back) when they
    /// did not get through.
    async fn send_history(
        &self,
        feed: &HistoryFeed,
        index: usize,
        server: &Upstream,
        events: Vec<HistoryEvent>,
    ) -> bool {
        let request = HistoryRequest { events };
        let sent = self.client.post(server.url("/v1/history")).json(&request).send().await;
        if let Ok(response) = &sent {
            server.record_credential(response.status() == reqwest::StatusCode::UNAUTHORIZED);
        }
        match sent {
            Ok(response) if response.status().is_success() => true,
            // The server refuses the service token: kept, for when the token is fixed.
            Ok(response) if response.status() == reqwest::StatusCode::UNAUTHORIZED => {
                feed.give_back(index, request.events);
                false
            }
            Ok(response) if response.status().is_client_error() => {
                // Refused as invalid: sending them again would not help.
                tracing::warn!(server = %server.base, status = %response.status(), "an inference server refused history events");
                true
            }
            other => {
                tracing::debug!(server = %server.base, answer = ?other.map(|r| r.status()), "history events not delivered; kept for later");
                feed.give_back(index, request.events);
                false
            }
        }
    }

    pub fn servers(&self) -> &[Arc<Upstream>] {
        &self.servers
    }

    /// The models the first server that answers lists (`GET /v1/models`).
    pub async fn models(&self, timeout: Duration) -> Option<Vec<ModelStatus>> {
        for server in &self.servers {
            let Ok(response) = self.client.get(server.url("/v1/models")).timeout(timeout).send().await else {
                continue;
            };
            if let Ok(models) = response.json::<Vec<ModelStatus>>().await {
                return Some(models);
            }
        }
        None
    }

    /// Carries a canary decision out on every server (`POST /v1/models/promote` or `/rollback`
    /// with the admin token); returns the servers that did not take it.
    pub async fn carry_out(&self, verdict: &str, token: &str, timeout: Duration) -> Vec<String> {
        let path = format!("/v1/models/{verdict}");
        let mut failures = Vec::new();
        for server in &self.servers {
            let sent = self.client.post(server.url(&path)).bearer_auth(token).timeout(timeout).send().await;
            match sent {
                Ok(response) if response.status().is_success() => {}
                Ok(response) => failures.push(format!("{}: HTTP {}", server.base, response.status())),
                Err(error) => failures.push(format!("{}: {error}", server.base)),
            }
        }
        failures
    }

    pub fn health(&self) -> Vec<InferenceServerHealth> {
        self.servers.iter().map(|s| InferenceServerHealth { url: s.base.clone(), healthy: s.is_ready() }).collect()
    }

    async fn ask(
        &self,
        index: usize,
        request: &PredictRequest,
        request_id: Option<&str>,
    ) -> Result<Vec<LifetimePrediction>, PredictError> {
        let server = &self.servers[index];
        // The events this server has not had yet go first, with the request.
        let Some(feed) = &self.history else { return self.send(server, request, request_id).await };
        let events = feed.take_after_sends(index).await;
        if events.is_empty() {
            return self.send(server, request, request_id).await;
        }
        let with_history = PredictRequest { history: events.clone(), ..request.clone() };
        // Given back unless the server answered, also when the caller's budget drops this call.
        let mut undelivered = Undelivered { feed, index, events: Some(events) };
        let answer = self.send(server, &with_history, request_id).await;
        if answer.is_ok() {
            undelivered.events = None;
        }
        answer
    }

    async fn send(
        &self,
        server: &Upstream,
        request: &PredictRequest,
        request_id: Option<&str>,
    ) -> Result<Vec<LifetimePrediction>, PredictError> {
        let mut call = server.request(&self.client, reqwest::Method::POST, "/v1/predict").json(request);
        if let Some(id) = request_id {
            call = call.header(REQUEST_ID_HEADER, id);
        }
        let response = call.send().await.map_err(|error| {
            server.record_failure();
            PredictError::Failed(format!("{}: {error}", server.base))
        })?;
        let status = response.status();
        server.record_credential(status == reqwest::StatusCode::UNAUTHORIZED);
        if !status.is_success() {
            if status.is_server_error() {
                server.record_failure();
            }
            let body = response.text().await.unwrap_or_default();
            return Err(PredictError::Failed(format!("{} answered {status}: {body}", server.base)));
        }
        server.record_success();
        let answer: PredictResponse = response
            .json()
            .await
            .map_err(|error| PredictError::Failed(format!("{}: unreadable answer: {error}", server.base)))?;
        Ok(answer.predictions)
    }
}

/// History events on their way to a server: back to its queue when dropped undelivered.
struct Undelivered<'a> {
    feed: &'a HistoryFeed,
    index: usize,
    events: Option<Vec<HistoryEvent>>,
}

impl Drop for Undelivered<'_> {
    fn drop(&mut self) {
        if let Some(events) = self.events.take() {
            self.feed.give_back(self.index, events);
        }
    }
}

impl Predictor for InferenceClient {
    async fn predict(
        &self,
        request: PredictRequest,
        request_id: Option<&str>,
    ) -> Result<Vec<LifetimePrediction>, PredictError> {
        let count = self.servers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut last_error = PredictError::Unavailable;
        for offset in 0..count {
            let index = (start + offset) % count;
            if !self.servers[index].is_ready() {
                continue;
            }
            match self.ask(index, &request, request_id).await {
                Ok(answers) => return Ok(answers),
                Err(error) => {
                    tracing::debug!(%error, "inference call failed; trying the next server");
                    last_error = error;
                }
            }
        }
        Err(last_error)
    }
}
