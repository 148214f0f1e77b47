//! What the three HTTP services share, so that each service crate holds only its own routes.
//!
//! - [`problem`]: RFC 9457 problem responses, and [`ValidJson`], the body extractor that runs
//!   `domain::decode_json` and answers 400/422 with a problem naming the field.
//! - [`layers`]: the standard tower stack: request id (generated or carried over from
//!   `x-request-id`), tracing, timeout, load shedding with a concurrency limit (503 with
//!   `Retry-After`, never an unbounded queue), and a body size limit.
//! - [`server`]: serving a router with a connection cap, a header-read timeout and an idle
//!   timeout, instead of `axum::serve`.
//! - [`refusals`]: refused requests and connections, counted in Prometheus and summarised in at
//!   most one WARN line a second.
//! - [`cli`]: the flags every service binary takes (`--config`, `--listen`, `--insecure-open`).
//! - [`telemetry`]: tracing subscriber and the Prometheus recorder behind `/metrics`.
//! - [`timing`]: per-stage timing of a request in its answer's `Server-Timing` header.
//! - [`auth`]: the admin routes' guard (`auth::AdminAuth`), and the service credential that every
//!   data route of the allocator and the inference server requires (`auth::protect`).
//! - [`openapi`]: the OpenAPI responses the services' documents share, each written once, and the
//!   liveness probe.

// axum's rejections are `Response`s; boxing them would only obscure the handlers.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod cli;
pub mod layers;
pub mod openapi;
pub mod problem;
pub mod refusals;
pub mod server;
pub mod telemetry;
pub mod timing;

pub use problem::{problem_response, ValidJson};
