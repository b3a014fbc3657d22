"""copy_threads(): KVMEM_COPY_THREADS wins; else half the CPUs, at least 1, at most 8."""

from __future__ import annotations

import pytest

from kvmem.engine.transfer import kv_copy


@pytest.mark.parametrize(("cpus", "want"), [(1, 1), (2, 1), (8, 4), (16, 8), (64, 8)])
def test_default_is_half_the_cpus_capped(monkeypatch, cpus: int, want: int) -> None:
    monkeypatch.delenv("KVMEM_COPY_THREADS", raising=False)
    monkeypatch.setattr(kv_copy.os, "cpu_count", lambda: cpus)
    assert kv_copy.copy_threads() == want


@pytest.mark.parametrize(("env", "want"), [("3", 3), ("12", 12), ("0", 4), ("x", 4)])
def test_env_overrides_when_positive(monkeypatch, env: str, want: int) -> None:
    monkeypatch.setenv("KVMEM_COPY_THREADS", env)
    monkeypatch.setattr(kv_copy.os, "cpu_count", lambda: 8)
    assert kv_copy.copy_threads() == want
