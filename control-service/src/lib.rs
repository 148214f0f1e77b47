//! The control service: the public `POST /allocate` front door. For each request it builds the
//! model's feature key of every VM, answers from the prediction cache or asks an inference server
//! within a timeout budget, falls back to short-lived when it cannot, applies the long-lived-share
//! safeguard, and forwards the request with its predictions to the allocator of the request's zone.
//!
//! The decisions about predictions (keys, cache, safeguard, fallback) live in [`feature_key`],
//! [`cache`], [`safeguard`] and [`predictions`], which know nothing of HTTP; [`auth`] (API keys) and
//! [`rate_limit`] (per-tenant token buckets) decide who may call and how often; [`history`] feeds
//! every arrival and exit to the inference servers' tenant history; [`quality`] gates a model whose
//! realized quality falls below its floors and judges canaries by evidence; [`inference`] and
//! [`upstream`] are the HTTP clients (every upstream call is theirs), [`health`] their readiness.
//! [`control`] is the service's state and the allocate logic, with no HTTP in it; [`api`] is the
//! axum layer over it, [`http`] what its handlers share, [`dashboard`] the operator's web console
//! with its zone views, [`timeline`] its figures over time.

pub mod api;
pub mod auth;
pub mod cache;
pub mod cloud;
pub mod config;
pub mod control;
pub mod dashboard;
pub mod feature_key;
pub mod health;
pub mod history;
pub mod http;
pub mod inference;
pub mod predictions;
pub mod quality;
pub mod rate_limit;
pub mod safeguard;
pub mod timeline;
pub mod upstream;
