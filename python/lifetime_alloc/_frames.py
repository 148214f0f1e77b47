"""Data frames to and from the native layer, as Arrow-shaped column buffers.

The native layer hands back ``(name, "f64", validity, values)`` and ``(name, "str", offsets, data)``
tuples of bytes (see ``python/src/columns.rs``); pyarrow builds its arrays over them without copying.
Frames go the other way in the same shape: text as Arrow ``large_string`` buffers, numbers as
float64 (NaN for missing). A missing column or one of the wrong type raises
:class:`~lifetime_alloc.errors.InvalidInputError` naming the column and the fix.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidInputError

Frame = Union[pd.DataFrame, pa.Table]
NativeColumns = List[Tuple[Any, ...]]

#: The columns of the project's trace format (docs/trace-format.md), in order.
TRACE_COLUMNS: Tuple[str, ...] = (
    "vm_id", "tenant_id", "vm_type", "cores", "memory_gib", "priority", "start_s", "end_s",
)
NUMBER_COLUMNS = frozenset({"cores", "memory_gib", "start_s", "end_s"})


def table_from_native(rows: int, columns: NativeColumns) -> pa.Table:
    """The native layer's columns as a pyarrow table (no copy of the values)."""
    arrays = []
    names = []
    for name, kind, first, second in columns:
        if kind == "f64":
            validity = pa.py_buffer(first) if first is not None else None
            arrays.append(pa.Array.from_buffers(pa.float64(), rows, [validity, pa.py_buffer(second)]))
        else:
            arrays.append(pa.Array.from_buffers(pa.large_string(), rows, [None, pa.py_buffer(first), pa.py_buffer(second)]))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def frame_from_native(rows: int, columns: NativeColumns) -> pd.DataFrame:
    """The native layer's columns as a pandas DataFrame (text as ``object``, numbers as float64)."""
    return table_from_native(rows, columns).to_pandas()


def _column(frame: Frame, name: str) -> Union[pd.Series, pa.ChunkedArray]:
    if isinstance(frame, pa.Table):
        return frame.column(name)
    return frame[name]


def _names(frame: Frame) -> List[str]:
    return [str(n) for n in (frame.column_names if isinstance(frame, pa.Table) else frame.columns)]


def _text(name: str, values: Union[pd.Series, pa.ChunkedArray]) -> Tuple[str, str, bytes, bytes]:
    try:
        if isinstance(values, pa.ChunkedArray):
            array = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
        else:
            array = pa.array(values, from_pandas=True)
        if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)
                or pa.types.is_dictionary(array.type) or pa.types.is_null(array.type)):
            raise pa.ArrowTypeError(f"holds {array.type}")
        array = pc.fill_null(pc.cast(array, pa.large_string()), "")
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as error:
        raise InvalidInputError(
            f"column `{name}` must hold text ({error})",
            field=name,
            fix=f'convert it to text: df["{name}"] = df["{name}"].astype(str)',
        ) from None
    buffers = array.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[array.offset: array.offset + len(array) + 1]
    data = buffers[2].to_pybytes() if buffers[2] is not None else b""
    return (name, "str", offsets.tobytes(), data)


def _number(name: str, values: Union[pd.Series, pa.ChunkedArray]) -> Tuple[str, str, None, bytes]:
    if isinstance(values, pa.ChunkedArray):
        ok = pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_null(values.type)
        if ok:
            numbers = pc.fill_null(pc.cast(values, pa.float64()), float("nan")).to_numpy()
    else:
        ok = pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_bool_dtype(values.dtype)
        if ok:
            numbers = values.to_numpy(dtype=np.float64, na_value=np.nan)
    if not ok:
        raise InvalidInputError(
            f"column `{name}` must hold numbers, it holds {values.type if isinstance(values, pa.ChunkedArray) else values.dtype}",
            field=name,
            fix=f'convert it to numbers: df["{name}"] = pd.to_numeric(df["{name}"])',
        )
    return (name, "f64", None, np.ascontiguousarray(numbers, dtype="<f8").tobytes())


def to_native(frame: Frame, defaults: Optional[Dict[str, Any]] = None) -> Tuple[int, NativeColumns]:
    """A trace frame as ``(rows, columns)`` for the native layer.

    It needs the trace format's columns; those in ``defaults`` may be missing (a constant fills
    them: text, a number, or ``None`` for NaN). Every other column is an extra (feature) column,
    handed over as text.
    """
    if not isinstance(frame, (pd.DataFrame, pa.Table)):
        raise InvalidInputError(
            f"expected a pandas DataFrame or a pyarrow Table, got {type(frame).__name__}",
            field="frame",
            fix="read the trace with lifetime_alloc.traces.read(), or build a DataFrame with the trace columns",
        )
    defaults = defaults or {}
    rows = frame.num_rows if isinstance(frame, pa.Table) else len(frame)
    present = _names(frame)
    columns: NativeColumns = []
    for name in TRACE_COLUMNS:
        if name in present:
            values = _column(frame, name)
        elif name in defaults:
            default = defaults[name]
            values = pd.Series([np.nan if default is None else default] * rows, dtype=object if isinstance(default, str) else np.float64)
        else:
            raise InvalidInputError(
                f"the frame has no column `{name}`",
                field=name,
                fix=f"add the column `{name}`: a trace has the columns {', '.join(TRACE_COLUMNS)} (docs/trace-format.md)",
            )
        columns.append(_number(name, values) if name in NUMBER_COLUMNS else _text(name, values))
    for name in present:
        if name in TRACE_COLUMNS:
            continue
        values = _column(frame, name)
        if not isinstance(values, pa.ChunkedArray) and not (
            pd.api.types.is_string_dtype(values.dtype) or isinstance(values.dtype, pd.CategoricalDtype)
        ):
            values = values.astype(str).where(values.notna(), "")
        columns.append(_text(name, values))
    return rows, columns


__all__: Sequence[str] = ["TRACE_COLUMNS", "table_from_native", "frame_from_native", "to_native"]
