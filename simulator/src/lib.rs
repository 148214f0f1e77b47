//! The trace-replay simulator: replays traces event by event through the allocator library's very
//! own policy code and measures packing density, empty hosts and the offline bound.
//!
//! Empty until the simulator issue lands; see `ARCHITECTURE.md` for what it will own.
