//! The native half of the Python package `lifetime_alloc`: a thin PyO3 layer over the workspace's
//! libraries, so that a notebook's result is the CLI's result.
//!
//! - [`columns`]: data frames in and out as Arrow-shaped column buffers (no Arrow crate: pyarrow
//!   builds its arrays over the bytes handed back), and the records they hold;
//! - [`trace`]: reading, writing, statistics and the synthetic generator (`traces`, as `vmtrace`),
//!   with [`readahead`] overlapping gunzip and parsing;
//! - [`sim`]: one run and comparisons (`simulator`, as `simulate run` and `simulate compare`), with
//!   the policies of the registry the module's root builds;
//! - [`model`]: a bundle's predictions (`lifetime-model`, as the inference server serves them);
//! - [`train`]: training a bundle (`lifetime-train`, as its CLI does);
//! - [`errors`]: every library error as the package's Python exception, with the field at fault and
//!   what to change.
//!
//! Long work runs with the interpreter detached (`Python::detach`), so other Python threads go on.

use pyo3::prelude::*;

mod columns;
mod errors;
mod model;
mod readahead;
mod sim;
mod trace;
mod train;

/// The module's root, its `main`: the policies' registry is built here and handed to the
/// simulation functions.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let registry = placement::Registry::standard();
    trace::register(m)?;
    sim::register(m, registry)?;
    model::register(m)?;
    train::register(m)?;
    Ok(())
}
