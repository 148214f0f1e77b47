//! Why a replay cannot be planned or reported, and the window flags' check.

use crate::*;
use std::path::PathBuf;
use traces::window::{InvalidWindow, WindowError};
use traces::TraceError;

/// Why a replay cannot be planned or reported.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("{flag} {message}")]
    InvalidFlag { flag: &'static str, message: String },
    #[error("reading the trace: {0}")]
    Trace(#[from] TraceError),
    /// No VM, or none in the window.
    #[error("{}{}", .0, window_hint(.0))]
    Window(WindowError),
    #[error("writing the plot {}: {message}", path.display())]
    Plot { path: PathBuf, message: String },
}

/// What to change when the window holds no VM.
fn window_hint(error: &WindowError) -> &'static str {
    match error {
        WindowError::EmptyWindow { .. } => ": change --from-s or --duration-s",
        _ => "",
    }
}

impl From<InvalidWindow> for ReplayError {
    fn from(error: InvalidWindow) -> Self {
        invalid(error.field.flag(), error.message)
    }
}

impl From<WindowError> for ReplayError {
    fn from(error: WindowError) -> Self {
        match error {
            WindowError::Invalid(error) => error.into(),
            WindowError::Trace(error) => ReplayError::Trace(error),
            other => ReplayError::Window(other),
        }
    }
}

pub(crate) fn invalid(flag: &'static str, message: impl Into<String>) -> ReplayError {
    ReplayError::InvalidFlag { flag, message: message.into() }
}

/// Checks the window flags, naming the flag at fault.
pub fn check_window(window: &WindowSpec) -> Result<(), ReplayError> {
    Ok(window.validate()?)
}
