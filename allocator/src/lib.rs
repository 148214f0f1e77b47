//! The allocator: live inventory, the Protean-style rule engine, the lifetime-aware placement
//! policies and durable state; the `allocator` binary will be a thin HTTP layer over this library.
//!
//! Empty until the allocator issue lands; see `ARCHITECTURE.md` for what it will own.
