"""The fidelity reference cache: a round trip, and a key that changes with the settings
and with every turn's tokens."""

from __future__ import annotations

import numpy as np

from kvmem.bench.reference_cache import load_reference, reference_key, save_reference


def test_reference_round_trip_and_keys(tmp_path) -> None:
    turns = [([1, 2, 3], [4, 5]), ([1, 2, 3, 4, 5, 6], [7])]
    key = reference_key({"model": "m.gguf", "n_ctx": 4096}, turns)
    assert key == reference_key({"n_ctx": 4096, "model": "m.gguf"}, turns)  # order-free
    assert key != reference_key({"model": "m.gguf", "n_ctx": 8192}, turns)
    assert key != reference_key({"model": "m.gguf", "n_ctx": 4096}, [turns[0], ([1, 2], [7])])
    assert key != reference_key(
        {"model": "m.gguf", "n_ctx": 4096}, [([1, 2], [3, 4, 5])] + turns[1:]
    )
    logits = [np.arange(10, dtype=np.float32).reshape(2, 5), np.ones((1, 5), dtype=np.float32)]
    assert load_reference(str(tmp_path), key, 2) is None
    assert load_reference(None, key, 2) is None
    save_reference(str(tmp_path), key, logits)
    assert [p.name for p in tmp_path.iterdir()] == [f"fidelity-ref-{key}.npz"]
    got = load_reference(str(tmp_path), key, 2)
    assert got is not None and len(got) == 2
    assert all(
        np.array_equal(a, b) and a.dtype == np.float32 for a, b in zip(got, logits, strict=True)
    )
