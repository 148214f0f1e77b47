//! `GET /v1/export`: the placed and exited VMs of a window as a trace, streamed (admin).

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

use super::{field_problem, problem, query_param, retry_later, AppState};
use crate::store::{ExportError, ExportHeader, ExportSink, ExportWindow, ExportedVm, TraceExport};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use domain::ProblemKind;
use service_common::auth::AdminAuth;
use service_common::openapi::AdminRefusals;
use std::sync::Arc;
use std::time::Instant;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Most rows of one export (`max_rows`).
pub const MAX_EXPORT_ROWS: u64 = 1_000_000_000;
/// Exports running at once; another answers 503 `export-busy`.
pub const CONCURRENT_EXPORTS: usize = 1;
/// Bytes of an export's body sent at a time (chunks in flight are bounded too: [`EXPORT_CHUNKS`]).
const EXPORT_CHUNK: usize = 64 * 1024;
/// Chunks of an export waiting for the client at most.
const EXPORT_CHUNKS: usize = 4;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(export))
}

/// Parses the query of `GET /v1/export`, naming the field at fault.
fn export_window(pairs: &[(String, String)]) -> Result<ExportWindow, Response> {
    let mut window = ExportWindow::default();
    for (key, value) in pairs {
        match key.as_str() {
            "from_s" | "to_s" => {
                let at: f64 = value.trim().parse().map_err(|_| {
                    field_problem(
                        ProblemKind::MalformedRequest,
                        key,
                        format!("must be a number of seconds, got `{value}`"),
                    )
                })?;
                if !at.is_finite() {
                    return Err(field_problem(
                        ProblemKind::InvalidRequest,
                        key,
                        format!("must be a finite number, got {at}"),
                    ));
                }
                if key == "from_s" {
                    window.from_s = at;
                } else {
                    window.to_s = at;
                }
            }
            "max_rows" => {
                window.max_rows = value.parse().map_err(|_| {
                    field_problem(
                        ProblemKind::MalformedRequest,
                        "max_rows",
                        format!("must be a whole number, got `{value}`"),
                    )
                })?;
                if window.max_rows == 0 || window.max_rows > MAX_EXPORT_ROWS {
                    return Err(field_problem(
                        ProblemKind::InvalidRequest,
                        "max_rows",
                        format!("must be between 1 and {MAX_EXPORT_ROWS}"),
                    ));
                }
            }
            other => {
                return Err(field_problem(
                    ProblemKind::MalformedRequest,
                    other,
                    "unknown parameter; expected from_s, to_s or max_rows",
                ))
            }
        }
    }
    // `to_s` at or before `from_s` is an empty window: an export of no row.
    Ok(window)
}

/// The placements and exits of the VMs that started in `[from_s, to_s)` on the model's clock, as a
/// trace in the project's CSV format (docs/trace-format.md), for retraining (admin: it holds every
/// tenant's VMs). One row per VM in start order: `start_s` is its `requested_at_s` (else its
/// placement time), `end_s` its exit on the model's clock (the release's `ended_at_s`), empty while
/// it runs (censored); then `os` when any VM has one and a column per request feature. At most
/// `max_rows` rows (default 1,000,000), the earliest; `x-export-rows` says how many, and
/// `x-export-truncated` whether the window held more. Streamed: memory stays bounded.
#[utoipa::path(get, path = "/v1/export",
    params(("from_s" = Option<f64>, Query, description = "Earliest start, model clock (default: no bound)."),
           ("to_s" = Option<f64>, Query, description = "Starts before this, model clock (default: no bound); at or before `from_s`, the window is empty."),
           ("max_rows" = Option<u64>, Query, minimum = 1, maximum = 1000000000, description = "Most rows, the earliest starts first (default 1000000).")),
    responses((status = 200, description = "The trace (CSV).", body = String, content_type = "text/csv",
                   headers(("x-export-rows" = u64, description = "Rows in the body."),
                           ("x-export-truncated" = bool, description = "Whether `max_rows` left VMs of the window out."))),
              (status = 400, description = "An unknown parameter, or a value of the wrong kind (named in `errors`).", body = domain::Problem),
              (status = 422, description = "A value out of range (named in `errors`), or more distinct feature names than an export has columns for.", body = domain::Problem),
              (status = 503, description = "Another export is running, the store cannot be read, or overloaded or timed out; retry.", body = domain::Problem),
              AdminRefusals),
    security(("bearer" = [])))]
async fn export(
    State(state): State<AppState>,
    _: AdminAuth,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Response {
    let window = match query_param(query).and_then(|pairs| export_window(&pairs)) {
        Ok(window) => window,
        Err(response) => return response,
    };
    let Ok(permit) = Arc::clone(&state.exports).try_acquire_owned() else {
        return retry_later(problem(ProblemKind::ExportBusy, "another export is running; retry when it is done"));
    };
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (chunks_tx, chunks_rx) = tokio::sync::mpsc::channel(EXPORT_CHUNKS);
    let location = state.store.clone();
    let started = Instant::now();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let output = ChunkSink { buffer: Vec::with_capacity(EXPORT_CHUNK), chunks: chunks_tx.clone() };
        let mut sink = StreamedExport { trace: TraceExport::new(output), ready: Some(ready_tx) };
        let result = crate::store::export_trace(&location, &window, &mut sink);
        let ready = sink.ready.take();
        let result = result.and_then(|rows| sink.trace.finish().map(|()| rows));
        match result {
            Ok(rows) => {
                tracing::info!(
                    rows,
                    from_s = window.from_s,
                    to_s = window.to_s,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "exported"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "the export failed");
                match ready {
                    // Before the header: the handler answers with a problem.
                    Some(ready) => {
                        let _ = ready.send(Err(error));
                    }
                    // Midway: the body ends in an error, so the client sees it incomplete.
                    None => {
                        let _ = chunks_tx.blocking_send(Err(std::io::Error::other(error.to_string())));
                    }
                }
            }
        }
    });
    let header = match ready_rx.await {
        Ok(Ok(header)) => header,
        Ok(Err(ExportError::TooManyFeatures { limit })) => {
            return field_problem(
                ProblemKind::InvalidRequest,
                "to_s",
                format!("the window's VMs carry more than {limit} distinct feature names; export a shorter window"),
            )
        }
        Ok(Err(error)) => return retry_later(problem(ProblemKind::StoreUnavailable, error.to_string())),
        Err(_) => return problem(ProblemKind::Internal, "the export stopped"),
    };
    let mut response = axum::body::Body::from_stream(Chunks(chunks_rx)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    headers.insert("x-export-rows", HeaderValue::from(header.rows));
    let truncated = if header.rows < header.rows_in_window { "true" } else { "false" };
    headers.insert("x-export-truncated", HeaderValue::from_static(truncated));
    response
}

/// An export's output: the CSV in chunks of [`EXPORT_CHUNK`] bytes, handed to the response body
/// through a bounded channel (a slow client holds the export back rather than filling memory).
struct ChunkSink {
    buffer: Vec<u8>,
    chunks: tokio::sync::mpsc::Sender<Result<axum::body::Bytes, std::io::Error>>,
}

impl ChunkSink {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(EXPORT_CHUNK));
        self.chunks
            .blocking_send(Ok(axum::body::Bytes::from(chunk)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl std::io::Write for ChunkSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= EXPORT_CHUNK {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// The trace export, telling the handler once its header is known (it then answers 200 and
/// streams the rows).
struct StreamedExport {
    trace: TraceExport<ChunkSink>,
    ready: Option<tokio::sync::oneshot::Sender<Result<ExportHeader, ExportError>>>,
}

impl ExportSink for StreamedExport {
    fn header(&mut self, header: &ExportHeader) -> Result<(), ExportError> {
        self.trace.header(header)?;
        if let Some(ready) = self.ready.take() {
            // The handler is gone (timed out): writing goes on into a closed channel and stops.
            let _ = ready.send(Ok(header.clone()));
        }
        Ok(())
    }

    fn row(&mut self, vm: &ExportedVm) -> Result<(), ExportError> {
        self.trace.row(vm)
    }
}

/// The chunks of an export as the response body's stream.
struct Chunks(tokio::sync::mpsc::Receiver<Result<axum::body::Bytes, std::io::Error>>);

impl futures_core::Stream for Chunks {
    type Item = Result<axum::body::Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}
