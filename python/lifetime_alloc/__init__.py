"""lifetime_alloc: the lifetime-aware VM allocation system from Python.

A thin layer over the project's Rust libraries (the same code the CLIs and the services run):

- :mod:`lifetime_alloc.traces`: read and write traces as DataFrames or Arrow tables, statistics,
  the synthetic generator (``vmtrace``);
- :mod:`lifetime_alloc.simulation`: run a configuration, compare configurations over seeds
  (``simulate run`` / ``simulate compare``);
- :mod:`lifetime_alloc.models`: load a bundle and predict on a DataFrame (the inference server's
  numbers); :mod:`lifetime_alloc.training`: train a bundle (``lifetime-train``);
- :mod:`lifetime_alloc.client`: the control service, allocator and inference server over HTTP;
- :mod:`lifetime_alloc.errors`: the exceptions, each naming the field at fault and the fix.
"""

from . import client, errors, models, simulation, traces, training
from .errors import (
    InvalidInputError,
    LifetimeAllocError,
    MissingFileError,
    ServiceError,
    ServiceUnavailableError,
)

__version__ = "0.1.0"

__all__ = [
    "client",
    "errors",
    "models",
    "simulation",
    "traces",
    "training",
    "LifetimeAllocError",
    "InvalidInputError",
    "MissingFileError",
    "ServiceError",
    "ServiceUnavailableError",
]
