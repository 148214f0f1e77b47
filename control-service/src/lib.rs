//! The control service: the public `POST /allocate` front door with its prediction cache, timeout
//! fallback and safeguard, forwarding to the allocator of the request's zone.
//!
//! Empty until the control-service issue lands; see `ARCHITECTURE.md` for what it will own.
