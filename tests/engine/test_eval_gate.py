"""The native eval-callback gate: C answers "not needed" while disarmed, forwards while armed,
and a capture behind it reads the same query rows as the plain Python callback."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.host_staging import StagingBuffer
from kvmem.engine.llama.llama_lib import ggml_base
from kvmem.engine.llama.model import LlamaModel
from kvmem.engine.query.eval_gate import EvalGate, load_gate_library
from kvmem.engine.query.query_capture import QueryCapture


def test_gate_forwards_only_while_armed():
    lib = load_gate_library()
    assert lib is not None, "the C compiler is part of the setup (llama-cpp-python's build)"
    seen: list[tuple[int, bool]] = []

    def inner(tensor: int, ask: bool, _user: int) -> bool:
        seen.append((tensor, ask))
        return ask

    py_cb = llama_cpp.ggml_backend_sched_eval_callback(inner)
    gate = EvalGate(lib, py_cb)
    call = llama_cpp.ggml_backend_sched_eval_callback(gate.pointer)
    user = ctypes.c_void_p(gate.user_data)
    assert [call(7, True, user), call(8, False, user)] == [False, False]
    assert seen == [] and (gate.calls, gate.forwarded) == (2, 0)
    gate.arm()
    assert [call(9, True, user), call(10, False, user)] == [True, False]
    assert seen == [(9, True), (10, False)] and (gate.calls, gate.forwarded) == (4, 2)
    gate.disarm()
    assert call(11, True, user) is False and (gate.calls, gate.forwarded) == (5, 2)


def _captured_context(model: LlamaModel, capture: QueryCapture, n_ubatch: int) -> LlamaContext:
    settings = ContextSettings(n_cells=256, n_batch=64, n_ubatch=n_ubatch, n_threads=2)
    return LlamaContext(model, settings, capture.callback, capture.user_data)


@pytest.mark.slow
def test_gated_capture_equals_python_capture(smollm2_path):
    model = LlamaModel(smollm2_path)
    tokens = model.tokenize("The gate must not change what the query capture reads.")
    results = {}
    try:
        for gated in (True, False):
            capture = QueryCapture(ggml_base(), [2, 5], gate=gated)
            assert (capture.gate is not None) is gated
            ctx = _captured_context(model, capture, n_ubatch=64)
            try:
                ctx.decode(tokens[:4], 0, [False] * 4)  # disarmed: nothing reaches Python
                python_calls = capture.n_calls
                capture.arm()
                ctx.decode(tokens[4:], 4, [True] * (len(tokens) - 4))
                rows = capture.disarm()
                results[gated] = (rows, python_calls, capture.node_calls, capture.n_calls)
            finally:
                ctx.close()
    finally:
        model.close()
    (gated_rows, gated_idle, node_calls, gated_py), (plain_rows, plain_idle, _, plain_py) = (
        results[True],
        results[False],
    )
    assert gated_idle == 0 and plain_idle == 0
    assert node_calls - gated_py > 500  # the disarmed decode: every node answered in C
    assert gated_py == plain_py  # Python sees exactly the armed pass's nodes either way
    assert sorted(gated_rows) == [2, 5]
    for layer in (2, 5):
        assert gated_rows[layer].shape[0] == len(tokens) - 4
        assert np.array_equal(gated_rows[layer], plain_rows[layer])


@pytest.mark.slow
def test_capture_through_the_arena_reads_the_same_rows(smollm2_path):
    """Rows read into the (here pageable) arena equal rows read into fresh memory, on the
    pass that learns the row size (fresh memory) and on the next (all in the arena), and
    what disarm returns never points into the arena."""
    model = LlamaModel(smollm2_path)
    tokens = model.tokenize("The arena must not change what the query capture reads, ever.")
    passes: dict[bool, list[dict[int, np.ndarray]]] = {}
    arena_bytes: list[int] = []
    try:
        for staged in (False, True):
            staging = StagingBuffer(None, limit_bytes=1 << 30) if staged else None
            capture = QueryCapture(ggml_base(), [2, 5], staging=staging)
            ctx = _captured_context(model, capture, n_ubatch=8)
            try:
                got = []
                for _ in range(2):
                    ctx.seq_rm(0, 0, -1)
                    capture.arm(len(tokens))
                    ctx.decode(tokens, 0, [False] * len(tokens))
                    got.append(capture.disarm())
                    arena_bytes.append(capture.arena_bytes)
                passes[staged] = got
                if staging is not None:
                    base = staging.view(1).ctypes.data
                    assert staging.capacity > 0
                    for rows in got[1].values():  # copies, not views of the arena
                        assert not (base <= rows.ctypes.data < base + staging.capacity)
                    staging.close()
            finally:
                ctx.close()
    finally:
        model.close()
    # the first staged pass learns the row size (all fresh), the second is all in the arena
    row_bytes = sum(passes[True][1][layer].nbytes for layer in (2, 5))
    assert arena_bytes == [0, 0, 0, row_bytes]
    for fresh, staged in zip(passes[False], passes[True], strict=True):
        assert sorted(staged) == [2, 5]
        for layer in (2, 5):
            assert staged[layer].shape[0] == len(tokens)
            assert np.array_equal(staged[layer], fresh[layer])
