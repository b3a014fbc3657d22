"""single_threaded_blas: OpenBLAS on one thread inside the context, restored after it."""

from __future__ import annotations

import threading

import pytest

from kvmem.memory.blas_threads import blas_threads, single_threaded_blas


def test_nested_and_concurrent_contexts_restore_the_count() -> None:
    before = blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS with thread control")
    inside: list[int | None] = []
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with single_threaded_blas():
            entered.set()
            release.wait(5)
            inside.append(blas_threads())

    worker = threading.Thread(target=other)
    worker.start()
    entered.wait(5)
    with single_threaded_blas():
        with single_threaded_blas():
            inside.append(blas_threads())
        inside.append(blas_threads())
    inside.append(blas_threads())  # the other thread's context is still open
    release.set()
    worker.join(5)
    assert inside == [1, 1, 1, 1]
    assert blas_threads() == before
