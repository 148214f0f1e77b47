"""VM request traces: read, write, statistics and the synthetic generator.

Each function is the library call ``vmtrace`` makes (``docs/trace-format.md``):

>>> import lifetime_alloc.traces as traces
>>> df = traces.generate(days=1, seed=42)          # vmtrace generate --days 1 --seed 42
>>> traces.write(df, "trace.csv.gz")               # the project's CSV, gzip by extension
>>> traces.stats("trace.csv.gz")["vms"]            # vmtrace stats --json

A trace frame has the columns ``vm_id, tenant_id, vm_type, cores, memory_gib, priority, start_s,
end_s`` (``end_s`` missing, NaN, for a VM still running at the end) and any extra (feature) columns
as text.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple, Union

import pandas as pd
import pyarrow as pa

from . import _native
from ._frames import TRACE_COLUMNS, Frame, frame_from_native, table_from_native, to_native

PathLike = Union[str, "os.PathLike[str]"]
#: An Azure packing-trace machine type: ``(machine_id, cores, memory_gib)``.
Machine = Tuple[int, float, float]


def read(path: PathLike, *, machine: Optional[Machine] = None) -> pd.DataFrame:
    """Reads a trace into a pandas DataFrame.

    ``path``: the project's CSV (``.csv`` or ``.csv.gz``) or an Azure packing-trace 2020 sqlite
    (``.sqlite``/``.db``), whose fractional VM sizes are read against ``machine``:
    ``(machine_id, cores, memory_gib)``. Rows are checked as ``vmtrace`` checks them; an error
    names the line and column. Raises :class:`FileNotFoundError` for a missing file.
    """
    rows, columns, _skipped = _native.read_trace(os.fspath(path), machine)
    return frame_from_native(rows, columns)


def read_arrow(path: PathLike, *, machine: Optional[Machine] = None) -> pa.Table:
    """:func:`read`, as a pyarrow Table (``large_string`` text, float64 numbers; no pandas copy)."""
    rows, columns, _skipped = _native.read_trace(os.fspath(path), machine)
    return table_from_native(rows, columns)


def write(frame: Frame, path: PathLike) -> int:
    """Writes a trace frame (DataFrame or pyarrow Table) as the project's CSV; ``.gz`` compresses.

    Every row is checked as the reader checks it (a missing column, a column of the wrong type or
    a bad value raises :class:`~lifetime_alloc.errors.InvalidInputError` naming it). Returns the
    number of rows written.
    """
    rows, columns = to_native(frame)
    return int(_native.write_trace(os.fspath(path), rows, columns))


def stats(trace: Union[PathLike, Frame], *, machine: Optional[Machine] = None,
          trace_end_s: Optional[float] = None) -> Dict[str, Any]:
    """The statistics ``vmtrace stats --json`` prints, of a trace file or a trace frame.

    ``trace_end_s``: when the trace was cut (its censoring time); default: its latest start or end.
    """
    if isinstance(trace, (pd.DataFrame, pa.Table)):
        rows, columns = to_native(trace)
        text = _native.frame_stats(rows, columns, trace_end_s)
    else:
        text = _native.trace_stats(os.fspath(trace), machine, trace_end_s)
    return json.loads(text)


def generate(*, seed: int = 42, days: float = 7.0, warmup_days: float = 2.0,
             requests_per_hour: float = 400.0, tenants: int = 1500, censor: bool = True) -> pd.DataFrame:
    """The seeded synthetic trace ``vmtrace generate`` writes, calibrated to the papers' statistics.

    ``warmup_days`` of arrivals before time 0 leave their survivors with negative starts;
    ``censor=False`` keeps the true end of VMs still running at the end.
    """
    rows, columns = _native.generate_trace(seed, days, warmup_days, requests_per_hour, tenants, censor)
    return frame_from_native(rows, columns)


__all__ = ["read", "read_arrow", "write", "stats", "generate", "Machine", "TRACE_COLUMNS"]
