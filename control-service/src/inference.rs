//! The inference servers as a [`Predictor`]: `POST /v1/predict` over a pooled, kept-alive HTTP
//! client, round robin over the servers that are up. A call that cannot connect or gets a 5xx counts
//! as a failure of that server (and the next one is tried, while the caller's budget lasts); after
//! the configured run of consecutive failures the server is skipped until its readiness probes
//! succeed again ([`crate::health`]).

use crate::health::{HealthPolicy, Upstream};
use crate::predictions::{PredictError, Predictor};
use domain::{InferenceServerHealth, LifetimePrediction, PredictRequest, PredictResponse};
use service_common::layers::REQUEST_ID_HEADER;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct InferenceClient {
    client: reqwest::Client,
    servers: Vec<Arc<Upstream>>,
    next: AtomicUsize,
}

impl InferenceClient {
    pub fn new(client: reqwest::Client, servers: &[String], health: HealthPolicy) -> Self {
        InferenceClient {
            client,
            servers: servers.iter().map(|s| Upstream::new(s, health)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    pub fn servers(&self) -> &[Arc<Upstream>] {
        &self.servers
    }

    pub fn health(&self) -> Vec<InferenceServerHealth> {
        self.servers.iter().map(|s| InferenceServerHealth { url: s.base.clone(), healthy: s.is_ready() }).collect()
    }

    async fn ask(
        &self,
        server: &Upstream,
        request: &PredictRequest,
        request_id: Option<&str>,
    ) -> Result<Vec<LifetimePrediction>, PredictError> {
        let mut call = self.client.post(server.url("/v1/predict")).json(request);
        if let Some(id) = request_id {
            call = call.header(REQUEST_ID_HEADER, id);
        }
        let response = call.send().await.map_err(|error| {
            server.record_failure();
            PredictError::Failed(format!("{}: {error}", server.base))
        })?;
        let status = response.status();
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
            let server = &self.servers[(start + offset) % count];
            if !server.is_ready() {
                continue;
            }
            match self.ask(server, &request, request_id).await {
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
