"""The progress bar of long runs: tqdm when it is installed, else a line on stderr; off with
``progress=False``."""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional


class Bar:
    """A callback ``(done, total)`` that draws a bar; :meth:`close` ends it."""

    def __init__(self, description: str, unit: str) -> None:
        self._description = description
        self._unit = unit
        self._tqdm: Any = None
        self._started = time.monotonic()
        self._last_total = 0

    def __call__(self, done: int, total: int) -> None:
        if self._tqdm is None:
            try:
                from tqdm.auto import tqdm  # type: ignore[import-untyped]

                self._tqdm = tqdm(total=total, desc=self._description, unit=f" {self._unit}", leave=False)
            except ImportError:
                self._tqdm = False
        self._last_total = total
        if self._tqdm:
            self._tqdm.n = done
            self._tqdm.refresh()
        else:
            share = done / total if total else 1.0
            sys.stderr.write(f"\r{self._description}: {done}/{total} {self._unit} ({100 * share:.0f}%, "
                             f"{time.monotonic() - self._started:.1f} s)")
            sys.stderr.flush()

    def close(self) -> None:
        if self._tqdm:
            self._tqdm.close()
        elif self._tqdm is False:
            sys.stderr.write("\n")


def bar(progress: bool, description: str, unit: str = "events") -> Optional[Bar]:
    """A bar when ``progress`` is on, else None (the native layer then reports nothing)."""
    return Bar(description, unit) if progress else None


def close(bar: Optional[Callable[..., None]]) -> None:
    if isinstance(bar, Bar):
        bar.close()
