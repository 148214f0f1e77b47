"""Traces: a round trip through the project's CSV, statistics equal to `vmtrace stats --json`,
and bad input raised as the package's exceptions."""

from __future__ import annotations

import gzip
import json
import subprocess

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from conftest import binary
from lifetime_alloc import traces
from lifetime_alloc.errors import InvalidInputError, MissingFileError


def test_generate_write_read_round_trip(small_trace: pd.DataFrame, tmp_path) -> None:
    assert tuple(small_trace.columns[:8]) == traces.TRACE_COLUMNS
    assert small_trace["end_s"].isna().any(), "a censored trace has VMs still running at its end"
    path = tmp_path / "trace.csv.gz"
    assert traces.write(small_trace, path) == len(small_trace)
    back = traces.read(path)
    pd.testing.assert_frame_equal(back, small_trace)


def test_a_trace_of_many_blocks_reads_back_whole(tmp_path) -> None:
    # Several MiB of text: the reader parses it in blocks of 1 MiB on several threads and joins
    # their columns; LF and CRLF line endings read the same.
    trace = traces.generate(seed=3, days=4.0, warmup_days=1.0)
    path = tmp_path / "big.csv.gz"
    traces.write(trace, path)
    back = traces.read(path)
    assert len(back) > 40_000
    pd.testing.assert_frame_equal(back, trace)
    crlf = tmp_path / "big-crlf.csv"
    with gzip.open(path, "rb") as text:
        crlf.write_bytes(text.read().replace(b"\n", b"\r\n"))
    pd.testing.assert_frame_equal(traces.read(crlf), trace)
    pd.testing.assert_frame_equal(traces.read_arrow(crlf).to_pandas(), trace)


def test_read_arrow_types(small_trace: pd.DataFrame, tmp_path) -> None:
    path = tmp_path / "trace.csv"
    traces.write(small_trace, path)
    table = traces.read_arrow(path)
    assert table.num_rows == len(small_trace)
    assert table.schema.field("cores").type == pa.float64()
    assert table.schema.field("vm_id").type == pa.large_string()
    assert table.column("end_s").null_count == int(small_trace["end_s"].isna().sum())
    # A pyarrow table is accepted wherever a frame is.
    assert traces.stats(table) == traces.stats(small_trace)


def test_stats_equal_the_cli(small_trace: pd.DataFrame, tmp_path) -> None:
    path = tmp_path / "trace.csv.gz"
    traces.write(small_trace, path)
    cli = subprocess.run([str(binary("vmtrace")), "stats", "--json", str(path)], check=True,
                         capture_output=True, text=True)
    assert traces.stats(path) == json.loads(cli.stdout)
    assert traces.stats(small_trace) == json.loads(cli.stdout)


def test_generate_equals_the_cli(tmp_path) -> None:
    path = tmp_path / "gen.csv"
    subprocess.run([str(binary("vmtrace")), "generate", "--out", str(path), "--days", "0.5", "--seed", "3"],
                   check=True, capture_output=True)
    pd.testing.assert_frame_equal(traces.generate(days=0.5, seed=3), traces.read(path))


def test_missing_file_is_file_not_found(tmp_path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        traces.read(tmp_path / "nope.csv")
    assert isinstance(error.value, MissingFileError)


def test_missing_column_names_it(small_trace: pd.DataFrame, tmp_path) -> None:
    with pytest.raises(InvalidInputError) as error:
        traces.write(small_trace.drop(columns=["cores"]), tmp_path / "x.csv")
    assert error.value.field == "cores"
    assert "add the column `cores`" in str(error.value)


def test_wrong_type_names_the_column(small_trace: pd.DataFrame, tmp_path) -> None:
    bad = small_trace.assign(cores=small_trace["cores"].astype(str))
    with pytest.raises(ValueError) as error:
        traces.write(bad, tmp_path / "x.csv")
    assert error.value.field == "cores"
    assert "pd.to_numeric" in error.value.fix


def test_bad_value_names_the_row_and_column(small_trace: pd.DataFrame, tmp_path) -> None:
    bad = small_trace.copy()
    bad.loc[bad.index[3], "memory_gib"] = -1.0
    with pytest.raises(InvalidInputError) as error:
        traces.write(bad, tmp_path / "x.csv")
    assert error.value.field == "memory_gib"
    assert "row 3" in str(error.value)


def test_bad_csv_names_the_line(tmp_path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("vm_id,tenant_id,vm_type,cores,memory_gib,priority,start_s,end_s\nv1,t,D2,two,8,,0,10\n")
    with pytest.raises(InvalidInputError) as error:
        traces.read(path)
    assert error.value.field == "cores"
    assert "line 2" in str(error.value)


def test_not_a_frame() -> None:
    with pytest.raises(InvalidInputError) as error:
        traces.write([1, 2, 3], "x.csv")  # type: ignore[arg-type]
    assert error.value.field == "frame"


def test_generator_settings_are_checked() -> None:
    with pytest.raises(InvalidInputError) as error:
        traces.generate(tenants=0)
    assert error.value.field == "tenants"
    with pytest.raises(InvalidInputError):
        traces.generate(days=float(np.nan))
