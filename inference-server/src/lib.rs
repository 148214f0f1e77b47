//! The inference server: loads lifetime-model bundles, serves predictions over HTTP and rolls out new
//! bundles (validation, hot swap, canary).
//!
//! Empty until the lifetime-model issue lands; see `ARCHITECTURE.md` for what it will own.
