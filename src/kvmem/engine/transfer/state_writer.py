"""Sequential writes into a preallocated state blob (state_codec's builders).

Small fields are written at once; the large K/V row sections are collected for one native
call (`native`: kv_copy, the GIL released), or deferred to a thread pool (`copier`), or
copied at once with numpy (neither). `finish` runs or waits for them; the bytes are the
same on every path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

import numpy as np

from .kv_copy import CopyPlan, NativeCopy


def _transpose_v(dst: np.ndarray, parts: Sequence[np.ndarray], n_embd_v: int, el: int) -> None:
    """Write V rows (cells x channels) transposed (channels x cells), as llama.cpp stores V
    without flash attention."""
    rows = np.concatenate(parts)  # [n_cells, v_row_bytes]
    n_cells = len(rows)
    data = rows.reshape(n_cells, n_embd_v, el).transpose(1, 0, 2)  # [n_embd_v, n_cells, el]
    dst.reshape(n_embd_v, n_cells, el)[...] = data


def _concat_rows(dst: np.ndarray, parts: Sequence[np.ndarray]) -> None:
    np.concatenate(parts, out=dst)


class StateWriter:
    """Sequential writes into a preallocated blob. The large row sections are collected
    for one native call (`native`), or deferred to a thread pool (`copier`); `finish`
    runs or waits for them."""

    def __init__(
        self, out: np.ndarray, copier: Executor | None = None, native: NativeCopy | None = None
    ) -> None:
        self.out = out  # uint8 [n_bytes]
        self.at = 0
        self._copier = copier
        self._jobs: list[Future[None]] = []
        self._plan: CopyPlan | None = native.plan() if native is not None else None

    def defer(self, fn: Callable[..., None], *args: object) -> None:
        """Run fn(*args) now, or on the copier's threads when there is one."""
        if self._copier is None:
            fn(*args)
        else:
            self._jobs.append(self._copier.submit(fn, *args))

    def finish(self) -> None:
        if self._plan is not None:
            self._plan.run()
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.result()

    def view(self, n: int) -> np.ndarray:
        v = self.out[self.at : self.at + n]  # [n]
        self.at += n
        return v

    def put(self, data: bytes) -> None:
        self.view(len(data))[:] = np.frombuffer(data, dtype=np.uint8)

    def rows(self, parts: Sequence[np.ndarray], n_cells: int, row_bytes: int) -> None:
        dst = self.view(n_cells * row_bytes).reshape(n_cells, row_bytes)  # [n_cells, row]
        if self._plan is not None:
            self._plan.concat(dst, parts)
        else:
            self.defer(_concat_rows, dst, list(parts))

    def columns(self, parts: Sequence[np.ndarray], n_cells: int, row_bytes: int, el: int) -> None:
        """V rows of `parts` written transposed (channels x cells)."""
        dst = self.view(n_cells * row_bytes)  # [n_embd_v * n_cells * el]
        if self._plan is not None:
            self._plan.to_columns(dst, parts, el)
        else:
            self.defer(_transpose_v, dst, list(parts), row_bytes // el, el)
