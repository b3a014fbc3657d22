"""numpy's huge-page advice: off for an engine's host buffers unless the user chose."""

from __future__ import annotations

import pytest

from kvmem.engine.transfer.host_pages import NUMPY_VARIABLE, numpy_multiarray, use_ordinary_pages

multiarray = numpy_multiarray()


@pytest.fixture
def advice():
    """numpy's advice as it was before the test, restored after it."""
    before = multiarray._set_madvise_hugepage(True)
    yield
    multiarray._set_madvise_hugepage(before)


def test_the_advice_is_turned_off(monkeypatch, advice) -> None:
    monkeypatch.delenv(NUMPY_VARIABLE, raising=False)
    assert use_ordinary_pages() is True
    assert multiarray._set_madvise_hugepage(True) is False  # returns what it was


@pytest.mark.parametrize("value", ["0", "1"])
def test_the_users_numpy_variable_wins(monkeypatch, advice, value) -> None:
    monkeypatch.setenv(NUMPY_VARIABLE, value)
    assert use_ordinary_pages() is False
    assert multiarray._set_madvise_hugepage(True) is True  # left as it was
