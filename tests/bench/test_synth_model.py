"""The random-weight GGUF writer: metadata, tensors, determinism, and loading in llama.cpp."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from kvmem.bench.gguf_tokenizer import default_tokenizer_gguf, read_tokenizer
from kvmem.bench.synth_model import ModelShape, WeightType, tensor_specs, write_synthetic_model
from kvmem.errors import ConfigError

TINY = ModelShape(
    n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_ctx_train=4096, rope_base=10000.0
)


@pytest.fixture(scope="module")
def tokenizer_path() -> Path:
    return default_tokenizer_gguf()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    path = tmp_path_factory.mktemp("synth") / "tiny.gguf"
    result = write_synthetic_model(
        path, TINY, WeightType.Q8_0, seed=0, tokenizer_gguf=tokenizer_path, threads=2
    )
    assert result.n_vocab == 49152
    assert result.n_tensors == 1 + 9 * 2 + 2
    return path


def test_tensor_specs_llama_names_and_shapes() -> None:
    specs = {s.name: (s.rows, s.cols, s.is_norm) for s in tensor_specs(TINY, n_vocab=100)}
    assert len(specs) == 21
    assert specs["token_embd.weight"] == (100, 64, False)
    assert specs["blk.1.attn_q.weight"] == (64, 64, False)
    assert specs["blk.1.attn_k.weight"] == (32, 64, False)  # 2 KV heads x head_dim 16
    assert specs["blk.0.attn_output.weight"] == (64, 64, False)
    assert specs["blk.0.ffn_down.weight"] == (64, 128, False)
    assert specs["blk.0.ffn_gate.weight"] == (128, 64, False)
    assert specs["output_norm.weight"] == (1, 64, True)
    assert specs["output.weight"] == (100, 64, False)


def test_shape_validation_names_the_flag() -> None:
    with pytest.raises(ConfigError) as err:
        ModelShape(n_embd=64, n_head=5).validate()
    assert err.value.flag == "--n-head"
    with pytest.raises(ConfigError) as err:
        ModelShape(n_embd=64, n_head=4, n_head_kv=3).validate()
    assert err.value.flag == "--n-head-kv"
    with pytest.raises(ConfigError) as err:
        ModelShape(n_layer=0).validate()
    assert err.value.flag == "--n-layer"


def test_metadata_and_tensors(tiny_model: Path, tokenizer_path: Path) -> None:
    reader = GGUFReader(tiny_model)
    fields = reader.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.block_count"].contents() == 2
    assert fields["llama.embedding_length"].contents() == 64
    assert fields["llama.attention.head_count"].contents() == 4
    assert fields["llama.attention.head_count_kv"].contents() == 2
    assert fields["llama.feed_forward_length"].contents() == 128
    assert fields["llama.context_length"].contents() == 4096
    assert fields["llama.rope.dimension_count"].contents() == 16
    assert fields["llama.rope.freq_base"].contents() == 10000.0
    source = read_tokenizer(tokenizer_path)
    assert len(fields["tokenizer.ggml.tokens"].contents()) == source.n_vocab
    assert fields["tokenizer.chat_template"].contents() == source.chat_template
    assert (
        fields["tokenizer.ggml.tokens"].contents()[:5]
        == GGUFReader(tokenizer_path).fields["tokenizer.ggml.tokens"].contents()[:5]
    )
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.0.attn_q.weight"].tensor_type == GGMLQuantizationType.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == GGMLQuantizationType.F32
    np.testing.assert_array_equal(
        np.asarray(tensors["blk.1.ffn_norm.weight"].data), np.ones(64, np.float32)
    )
    # Q8_0 rows: 64 values = 2 blocks of (f16 scale + 32 int8) = 68 bytes
    assert tensors["blk.0.attn_k.weight"].n_bytes == 32 * 68


def test_weights_are_deterministic_and_small(tmp_path: Path, tokenizer_path: Path) -> None:
    a = write_synthetic_model(
        tmp_path / "a.gguf", TINY, WeightType.F32, 7, tokenizer_path, threads=1
    )
    b = write_synthetic_model(
        tmp_path / "b.gguf", TINY, WeightType.F32, 7, tokenizer_path, threads=2
    )
    c = write_synthetic_model(
        tmp_path / "c.gguf", TINY, WeightType.F32, 8, tokenizer_path, threads=2
    )
    assert a.path.read_bytes() == b.path.read_bytes()  # independent of the thread count
    assert a.path.read_bytes() != c.path.read_bytes()
    w = np.asarray({t.name: t for t in GGUFReader(a.path).tensors}["blk.0.ffn_up.weight"].data)
    assert w.shape == (128, 64)
    assert abs(float(w.std()) - 1 / 8) < 0.01  # std = 1/sqrt(n_in) = 1/sqrt(64)


def test_llama_cpp_loads_it_and_decodes_finite_logits(tiny_model: Path) -> None:
    llm = llama_cpp.Llama(str(tiny_model), n_ctx=256, verbose=False)
    try:
        assert llm.n_vocab() == 49152
        assert llama_cpp.llama_model_n_layer(llm.model) == 2
        assert llama_cpp.llama_model_n_head_kv(llm.model) == 2
        tokens = llm.tokenize(b"Hello world, this is a test.")
        llm.eval(tokens)
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(49152,)
        ).copy()  # [n_vocab]
        assert np.isfinite(logits).all()
        assert 0.1 < float(logits.std()) < 10.0
    finally:
        llm.close()


def test_distinct_chunks_repeats_chunks_across_tensors(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    result = write_synthetic_model(
        tmp_path / "fast.gguf", TINY, WeightType.Q8_0, 3, tokenizer_path, 2, distinct_chunks=1
    )
    tensors = {t.name: np.asarray(t.data) for t in GGUFReader(result.path).tensors}
    # one chunk per tiny tensor, keyed by shape: same-shape tensors share their bytes
    assert np.array_equal(tensors["blk.0.attn_q.weight"], tensors["blk.1.attn_q.weight"])
    assert np.array_equal(tensors["blk.0.ffn_up.weight"], tensors["blk.1.ffn_gate.weight"])
    full = write_synthetic_model(
        tmp_path / "full.gguf", TINY, WeightType.Q8_0, 3, tokenizer_path, 2
    )
    assert full.n_bytes == result.n_bytes
    distinct = {t.name: np.asarray(t.data) for t in GGUFReader(full.path).tensors}
    assert not np.array_equal(distinct["blk.0.attn_q.weight"], distinct["blk.1.attn_q.weight"])
    llm = llama_cpp.Llama(str(result.path), n_ctx=64, verbose=False)
    assert llm.n_vocab() == 49152
