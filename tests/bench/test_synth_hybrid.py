"""The qwen35 hybrid writer: tensor names, hparams, CLI flags, and llama.cpp loading it,
decoding with it (trunk and MTP head), deterministically."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import llama_cpp_ext

from kvmem.bench.main import build_parser
from kvmem.bench.synth_cli import shape_from_args
from kvmem.bench.synth_hybrid import QWEN35_27B, QWEN35_TINY, Qwen35Shape
from kvmem.bench.synth_model import WeightType, iter_shapes_summary, tensor_specs
from kvmem.engine.llama.llama_lib import init_backend
from kvmem.engine.llama.model import LlamaModel
from kvmem.errors import ConfigError
from tests.engine.hybrid_models import write_tiny_hybrid

TOKENS = [1, 50, 60, 70, 80, 90, 100, 110]


def specs_of(shape: Qwen35Shape) -> dict[str, tuple[int, int, bool]]:
    return {s.name: (s.rows, s.cols, s.is_norm) for s in tensor_specs(shape, n_vocab=100)}


def test_tensor_names_and_shapes_follow_llama_cpp_qwen35() -> None:
    specs = specs_of(QWEN35_TINY)  # layers 0, 2 recurrent; 1, 3 full attention
    assert len(specs) == 1 + 2 * (5 + 9) + 2 * (5 + 6) + 2
    # recurrent layer: key_dim = 32 x 2 groups, value_dim = 32 x 4 heads, conv_dim 256
    assert specs["blk.0.attn_qkv.weight"] == (2 * 64 + 128, 64, False)
    assert specs["blk.0.attn_gate.weight"] == (128, 64, False)
    assert specs["blk.0.ssm_conv1d.weight"] == (256, 4, False)
    assert specs["blk.0.ssm_dt.bias"] == (1, 4, True)
    assert specs["blk.0.ssm_a"] == (1, 4, True)
    assert specs["blk.0.ssm_beta.weight"] == (4, 64, False)
    assert specs["blk.0.ssm_alpha.weight"] == (4, 64, False)
    assert specs["blk.0.ssm_norm.weight"] == (1, 32, True)
    assert specs["blk.0.ssm_out.weight"] == (64, 128, False)
    assert "blk.0.attn_q.weight" not in specs
    # full-attention layer: q carries the output gate (2 x 4 heads x 32)
    assert specs["blk.1.attn_q.weight"] == (256, 64, False)
    assert specs["blk.1.attn_k.weight"] == (64, 64, False)
    assert specs["blk.1.attn_output.weight"] == (64, 128, False)
    assert specs["blk.1.attn_k_norm.weight"] == (1, 32, True)
    assert specs["blk.3.post_attention_norm.weight"] == (1, 64, True)
    assert "blk.1.ssm_a" not in specs and "blk.4.attn_q.weight" not in specs
    mtp = specs_of(dataclasses.replace(QWEN35_TINY, nextn_layers=1))
    assert len(mtp) == len(specs) + 14
    assert mtp["blk.4.nextn.eh_proj.weight"] == (64, 128, False)
    assert mtp["blk.4.attn_q.weight"] == (256, 64, False)
    assert mtp["blk.4.nextn.hnorm.weight"] == (1, 64, True)


def test_near_27b_shape_and_size() -> None:
    lines = list(iter_shapes_summary(QWEN35_27B, 49152, WeightType.Q8_0))
    assert lines[0].startswith("qwen35: 64 layers (16 full attention, every 4; 48 gated delta net)")
    assert lines[1] == "851 tensors, 24.86 B parameters, 26.42 GB as q8_0"


def test_validation_names_the_flag() -> None:
    cases = [
        (dict(nextn_layers=2), "--nextn-layers"),
        (dict(ssm_n_group=3), "--ssm-n-group"),
        (dict(n_head_kv=5), "--n-head-kv"),
        (dict(rope_sections=(3, 3, 3, 0)), "--rope-sections"),
        (dict(full_attn_interval=8, n_layer=4), "--full-attn-interval"),
        (dict(head_dim=48), "--head-dim"),
    ]
    for change, flag in cases:
        with pytest.raises(ConfigError) as err:
            dataclasses.replace(QWEN35_TINY, **change).validate()
        assert err.value.flag == flag


def test_cli_presets_and_flags() -> None:
    parser = build_parser()

    def shape(*args: str):
        return shape_from_args(parser.parse_args(["synth-model", "out.gguf", *args]))

    assert shape("--arch", "qwen35") == QWEN35_27B
    tiny = shape("--arch", "qwen35", "--preset", "tiny", "--nextn-layers", "1", "--n-layer", "8")
    assert tiny == dataclasses.replace(QWEN35_TINY, nextn_layers=1, n_layer=8)
    assert shape("--arch", "qwen35", "--preset", "tiny", "--rope-sections", "4,2,2,0") == (
        dataclasses.replace(QWEN35_TINY, rope_sections=(4, 2, 2, 0))
    )
    with pytest.raises(ConfigError, match="applies to --arch qwen35 only"):
        shape("--ssm-d-state", "64")
    with pytest.raises(ConfigError, match="'tiny' is not a llama preset"):
        shape("--preset", "tiny")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("qwen35")
    return {"plain": write_tiny_hybrid(out, 0), "mtp": write_tiny_hybrid(out, 1)}


@pytest.mark.slow
def test_metadata_as_llama_cpp_reads_it(models: dict[str, Path]) -> None:
    model = LlamaModel(str(models["mtp"]))
    try:
        expected = {
            "general.architecture": "qwen35",
            "qwen35.block_count": "5",
            "qwen35.nextn_predict_layers": "1",
            "qwen35.full_attention_interval": "2",
            "qwen35.attention.key_length": "32",
            "qwen35.attention.value_length": "32",
            "qwen35.rope.dimension_count": "16",
            "qwen35.ssm.conv_kernel": "4",
            "qwen35.ssm.inner_size": "128",
            "qwen35.ssm.state_size": "32",
            "qwen35.ssm.group_count": "2",
            "qwen35.ssm.time_step_rank": "4",
        }
        assert {key: model.meta(key) for key in expected} == expected
        assert model.is_hybrid and model.kv_cell_ext
        assert llama_cpp.llama_model_n_layer_nextn(model.ptr) == 1
    finally:
        model.close()


def test_tensor_fill_values() -> None:
    specs = {s.name: s for s in tensor_specs(QWEN35_TINY, n_vocab=100)}
    assert specs["blk.0.ssm_a"].value == -0.5  # a decay: -exp(A_log) < 0
    assert specs["blk.0.ssm_dt.bias"].value == 0.0
    assert specs["blk.0.ssm_norm.weight"].value == 1.0
    assert specs["blk.0.ssm_conv1d.weight"].stored(WeightType.Q8_0) is WeightType.F32
    assert specs["blk.0.attn_qkv.weight"].stored(WeightType.Q8_0) is WeightType.Q8_0


def _decode_logits(path: Path, load_mtp: bool = False) -> tuple[np.ndarray, object, object]:
    init_backend()
    mp = llama_cpp.llama_model_default_params()
    mp.load_mtp = load_mtp
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    assert model
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 64, 1, 1
    ctx = llama_cpp.llama_init_from_model(model, cp)
    assert ctx
    if load_mtp:
        llama_cpp_ext.llama_set_embeddings_nextn(ctx, True, False)
    tokens = (llama_cpp.llama_token * len(TOKENS))(*TOKENS)
    assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, len(TOKENS))) == 0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy(), model, ctx  # [n_vocab]


@pytest.mark.slow
def test_llama_cpp_loads_and_decodes_deterministically(models: dict[str, Path]) -> None:
    results = {}
    for name in ("plain", "plain", "mtp"):
        logits, model, ctx = _decode_logits(models[name])
        assert llama_cpp.llama_model_is_hybrid(model)
        assert llama_cpp.llama_model_n_layer(model) == 4
        assert llama_cpp.llama_model_rope_type(model) == 40  # IMROPE
        assert np.isfinite(logits).all() and 0.1 < float(logits.std()) < 10.0
        if name in results:
            np.testing.assert_array_equal(logits, results[name])  # bit-identical rerun
        results[name] = logits
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    assert not np.array_equal(results["plain"], results["mtp"])  # other weights, other logits


@pytest.mark.slow
def test_mtp_head_loads_and_decodes(models: dict[str, Path]) -> None:
    logits, model, ctx = _decode_logits(models["mtp"], load_mtp=True)
    assert llama_cpp.llama_model_n_layer_nextn(model) == 1
    n_embd = llama_cpp.llama_model_n_embd(model)
    # the trunk's h_nextn rows (output-normed hidden states) feed the MTP block
    h = np.stack(
        [
            np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn_ith(ctx, i), (n_embd,))
            for i in range(len(TOKENS))
        ]
    ).astype(np.float32)  # [n_tokens, n_embd]
    assert np.isfinite(h).all() and np.isfinite(logits).all()
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 64, 1, 1
    cp.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
    mtp = llama_cpp.llama_init_from_model(model, cp)
    assert mtp
    llama_cpp_ext.llama_set_embeddings_nextn(mtp, True, True)
    n = len(TOKENS)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    h_buf = np.ascontiguousarray(h)
    batch.embd = h_buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    batch.n_tokens = n
    for i, tok in enumerate([*TOKENS[1:], 120]):  # token i+1 with the hidden state of i
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, 1
    try:
        assert llama_cpp.llama_decode(mtp, batch) == 0
        n_vocab = len(logits)
        draft = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(mtp, -1), (n_vocab,)).copy()
    finally:
        batch.embd = None  # owned by numpy, not by llama_batch_free
        llama_cpp.llama_batch_free(batch)
    assert np.isfinite(draft).all() and 0.1 < float(draft.std()) < 10.0
    assert not np.array_equal(draft, logits)
    llama_cpp.llama_free(mtp)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
