//! The lifetime model: feature computation shared by training and serving, the LightGBM trainer,
//! evaluation, model bundles and in-process prediction.
//!
//! Empty until the lifetime-model issue lands; see `ARCHITECTURE.md` for what it will own. It must
//! never know HTTP: the inference server and the allocator link it as a library.
