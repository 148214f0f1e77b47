//! The trace replay client: drives a trace through the control service's `POST /allocate`.
//! (Being written; see the `vmreplay` binary.)
