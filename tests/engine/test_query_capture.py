"""Query capture and the RoPE / Hadamard conventions checked against llama.cpp's own tensors."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from kvmem.config import KVMemConfig, QueryPolicy
from kvmem.engine.llama.context import ContextSettings, LlamaContext
from kvmem.engine.llama.llama_lib import ggml_base
from kvmem.engine.llama.model import LlamaModel
from kvmem.memory.ggml_types import GgmlType, dequantize_rows
from kvmem.memory.retrieval_index import default_score_layers
from kvmem.memory.rope import k_rotation_size, remove_rope, undo_hadamard

from .helpers import filler_tokens, make_engine

LAYER = 3


class NodeRecorder:
    """Records every `Qcur-3` / `Kcur-3` node (any op) of each decode."""

    def __init__(self) -> None:
        self.ggml = ggml_base()
        self.nodes: list[tuple[str, str, np.ndarray]] = []
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._on_node)

    def _on_node(self, tensor: int, ask: bool, _user: int) -> bool:
        name = self.ggml.name(tensor).decode()
        if name not in (f"Qcur-{LAYER}", f"Kcur-{LAYER}"):
            return False
        view = self.ggml.view(tensor)
        if view.ggml_type != 0 or view.ne[2] < 2:  # F32 3-d [head_dim, n_head, n_tokens]
            return False
        if not ask:
            data = self.ggml.read_f32(tensor)
            self.nodes.append((name, view.op, data.reshape(data.shape[-3:]).copy()))
        return True

    def get(self, name: str, rope: bool) -> np.ndarray:
        hits = [d for n, op, d in self.nodes if n == name and (op == "ROPE") == rope]
        assert hits, f"no {name} node with rope={rope}: {[(n, op) for n, op, _ in self.nodes]}"
        return hits[0]


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_rope_and_hadamard_conventions_match_llama_cpp(smollm2_path, cache):
    model = LlamaModel(smollm2_path)
    info = model.describe(512)
    k_type = GgmlType[cache.upper()]
    recorder = NodeRecorder()
    ctx = LlamaContext(
        model,
        ContextSettings(
            n_cells=512, n_batch=64, n_ubatch=64, n_threads=2, type_k=k_type, type_v=k_type
        ),
        recorder.callback,
    )
    try:
        tokens = list(range(1000, 1040))
        ctx.decode(tokens, 0, [False] * 39 + [True])
        positions = np.arange(40)
        q_pre, q_post = recorder.get(f"Qcur-{LAYER}", False), recorder.get(f"Qcur-{LAYER}", True)
        assert q_post.shape == (40, info.n_head, info.head_dim)
        np.testing.assert_allclose(
            remove_rope(q_post, positions, info.rope), q_pre, atol=2e-4, rtol=1e-4
        )
        k_post = recorder.get(f"Kcur-{LAYER}", True)  # [40, n_head_kv, head_dim]

        # the K cache holds k_post (Hadamard-rotated for a quantized cache), in its own type
        from kvmem.engine.transfer.state_codec import parse_state

        ctx.seq_cp(0, 1, 0, 40)
        state = parse_state(ctx.get_state(1))
        order = np.argsort(state.positions)
        row_elems = info.n_head_kv * info.head_dim
        cached = dequantize_rows(state.k[LAYER][order], k_type, row_elems)
        cached = cached.reshape(40, info.n_head_kv, info.head_dim)
        nrot = k_rotation_size(info.head_dim) if k_type.is_quantized else 0
        if nrot:
            cached = undo_hadamard(cached, nrot)
        if k_type.is_quantized:  # q8_0: one int8 step of each 32-value block's scale
            np.testing.assert_allclose(cached, k_post, atol=2e-2 * float(np.abs(k_post).max()))
        else:  # f16 rounding
            np.testing.assert_allclose(cached, k_post, atol=2e-3, rtol=1e-3)
    finally:
        ctx.close()
        model.close()


def test_session_captures_exactly_the_query_span(smollm2_path):
    engine = make_engine(smollm2_path, n_ctx=4096, kvmem=KVMemConfig(budget=1024, gen_reserve=256))
    try:
        from kvmem.memory.spans import TokenSpan

        prompt = filler_tokens(engine, 1500, seed=11)
        span = TokenSpan(1400, 1480)
        engine.teacher_force(prompt, prompt[-1:], query=span)
        q = engine.session.last_query
        info = engine.info
        assert sorted(q.by_layer) == list(default_score_layers(30))  # 23 spread of 30 layers
        assert len(q.by_layer) == 23
        assert q.positions.tolist() == list(range(1400, 1480))
        for rows in q.by_layer.values():
            assert rows.shape == (80, info.n_head, info.head_dim) and rows.dtype == np.float32
        # the history was long enough to need retrieval, and a window was chosen for the query
        plan = engine.session.last_plan
        assert plan is not None and plan.sink == (0,)
        assert len(plan.selected) * 128 + (1500 - 1408) <= 1024
    finally:
        engine.close()


def test_tail_policy_queries_the_prompt_end_without_a_span(smollm2_path):
    kvmem = KVMemConfig(
        budget=1024, gen_reserve=256, query_policy=QueryPolicy.TAIL, query_max_tokens=100
    )
    engine = make_engine(smollm2_path, n_ctx=4096, kvmem=kvmem)
    try:
        prompt = filler_tokens(engine, 1500, seed=11)
        engine.teacher_force(prompt, prompt[-1:])  # no span given: the policy makes one
        q = engine.session.last_query
        assert q.positions.tolist() == list(range(1400, 1500))
        # the query's complete block (1400 // 128 = 10) is a recent one; the rest by score
        plan = engine.session.last_plan
        assert plan.sink == (0,) and plan.recent == (9, 10)
        assert plan.retrieved and max(plan.retrieved) < 9
    finally:
        engine.close()
