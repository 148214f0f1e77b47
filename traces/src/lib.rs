//! VM request traces: one record type, three sources behind one iterator, and trace statistics.
//!
//! - [`csv_format`]: the project's CSV (`.csv` or `.csv.gz`), read and written ([`csv_chunks`]: read
//!   with its rows parsed on several threads); see
//!   `docs/trace-format.md`.
//! - [`azure_sqlite`]: the Azure packing trace 2020 (sqlite tables `vm` and `vmType`), mapped onto one
//!   machine type.
//! - [`synthetic`]: a seeded generator calibrated to the published statistics of the papers.
//!
//! [`TraceSource::open`] turns any of them into a [`TraceReader`], an iterator of [`VmRecord`]s that the
//! trainer, the simulator and the replay client all consume. [`stats`] summarises any trace;
//! [`window`] cuts it to the time window the simulator and the replay client both replay.

pub mod azure_sqlite;
pub mod csv_chunks;
pub mod csv_format;
pub mod error;
pub mod record;
pub mod source;
pub mod stats;
pub mod synthetic;
pub mod window;

pub use error::TraceError;
pub use record::{ExtraColumns, VmRecord, NO_TENANT};
pub use source::{TraceReader, TraceSource};
pub use stats::{TraceStats, TraceStatsBuilder};
