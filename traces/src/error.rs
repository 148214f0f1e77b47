//! Errors of trace reading and writing; every row error carries its line number.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}: {message}")]
    Csv { line: u64, message: String },
    #[error("the header lacks the required column `{column}` (expected at least {expected})")]
    MissingColumn { column: &'static str, expected: String },
    #[error("the header names column `{column}` twice")]
    DuplicateColumn { column: String },
    #[error("line {line}, column `{column}`: {message} (value {value:?})")]
    BadField { line: u64, column: String, value: String, message: String },
    #[cfg(feature = "azure-sqlite")]
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(
        "{0}: this build reads no sqlite traces; convert the trace to CSV with `vmtrace convert`, or build with \
         `--features azure-sqlite`"
    )]
    SqliteNotBuilt(PathBuf),
    #[error("sqlite trace: {0}")]
    AzureTrace(String),
    #[error("VM `{vm_id}` of the trace: `{field}` {message}")]
    BadRecord { vm_id: String, field: &'static str, message: String },
    #[error("unsupported trace file `{0}`: expected .csv, .csv.gz, .sqlite or .db")]
    UnsupportedFormat(PathBuf),
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TraceError::Io { path: path.into(), source }
    }
}
