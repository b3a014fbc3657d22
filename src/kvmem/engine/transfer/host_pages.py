"""Host memory for the history: ordinary pages, not transparent huge pages.

numpy asks the kernel for transparent huge pages (`madvise(MADV_HUGEPAGE)`) for every
array of 4 MiB and more. Where the kernel's THP `defrag` setting is `madvise` (the
default of many distributions), such a fault may compact memory before it returns a huge
page. A KVMem engine allocates fresh host memory all the time: the host store grows by a
buffer per harvested block, and the query rows, the staging buffers and the index's
temporaries are large arrays. On a 2-core VM (2026-12-05) the first touch of madvised
memory ran at 0.1-0.2 GB/s against 2.5 GB/s with ordinary pages, and it was most of
the gap of KVMem's prefill to plain llama.cpp under budget there: a 4K prefill of the
synthetic 16-layer model took 14.15 s against 12.30 s with ordinary pages (stock: about
12.0 s; the copy-out 728 -> 59 ms, the state read 495 -> 58 ms, the query rows' copy
857 -> 57 ms).

So an engine with KVMem turns numpy's huge-page advice off for the process, unless the
user chose with numpy's own variable, `NUMPY_MADVISE_HUGEPAGE` (0 or 1), which wins.
The KV cache itself is llama.cpp's memory and is not affected.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

logger = logging.getLogger(__name__)

NUMPY_VARIABLE = "NUMPY_MADVISE_HUGEPAGE"


def use_ordinary_pages() -> bool:
    """Stop numpy's huge-page advice for new arrays; False when the user's
    NUMPY_MADVISE_HUGEPAGE decides it, or this numpy cannot be told."""
    if os.environ.get(NUMPY_VARIABLE, "") != "":
        return False
    setter = getattr(numpy_multiarray(), "_set_madvise_hugepage", None)
    if setter is None:
        return False
    if setter(False):
        logger.debug("numpy's transparent huge page advice is off for host buffers")
    return True


def numpy_multiarray() -> ModuleType:
    """numpy's `multiarray` module, which holds the advice's switch (numpy 2 or 1.x)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    return multiarray
