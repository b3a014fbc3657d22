"""kvmem-server's flags: defaults, aliases, and every flag's validation error."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from kvmem.cli.server_args import SERVER_FLAGS, build_server_parser
from kvmem.cli.server_config import load_server_settings
from kvmem.config import (
    CellOrder,
    KVMemConfig,
    QueryAheadMode,
    QuerySource,
    RecomputeMode,
    RestoreAheadMode,
)
from kvmem.engine_settings import EngineSettings, GpuPlacement
from kvmem.errors import ConfigError
from kvmem.memory.exact_scorer import RankMode
from kvmem.memory.ggml_types import GgmlType
from kvmem.memory.layout import PositionMode
from kvmem.memory.scorer import ScoreMode
from kvmem.sampling import SamplingParams
from kvmem.server.settings import ServerSettings, Source
from tests.unit.gguf_headers import header_gguf


def load(*argv: str, env: dict[str, str] | None = None) -> ServerSettings:
    return load_server_settings(list(argv), env or {})[0]


@pytest.fixture()
def gguf(tmp_path: Path) -> str:
    # a K head of 64: the quantized K cache some tests ask for can shift (k_shift_meta)
    shape = {"block_count": 2, "embedding_length": 256, "attention.head_count": 4}
    return header_gguf(tmp_path / "tiny-model.gguf", "llama", {**shape, "attention.key_length": 64})


def test_defaults() -> None:
    s = load()
    assert s.engine == EngineSettings(warmup=True)  # kvmem-server warms up, as llama-server
    assert (s.host, s.port, s.alias, s.n_predict, s.queue_size, s.verbosity) == (
        "127.0.0.1",
        8080,
        None,
        -1,
        16,
        3,
    )
    assert (s.ui, s.ui_dir, s.metrics, s.trace, s.api_keys.enabled) == (
        True,
        None,
        False,
        False,
        False,
    )
    assert s.sampling == SamplingParams()
    assert s.chat_template is None and s.chat_template_origin == "gguf"
    assert set(s.sources.values()) == {Source.DEFAULT}


def test_llama_server_flags_and_aliases(gguf: str, tmp_path: Path) -> None:
    ui = tmp_path / "ui"
    ui.mkdir()
    (ui / "index.html").write_text("<html></html>")
    s = load(
        "-m",
        gguf,
        "-c",
        "8192",
        "--predict",
        "256",
        "-s",
        "7",
        "-t",
        "4",
        "-tb",
        "8",
        "-b",
        "512",
        "-ub",
        "128",
        "-fa",
        "on",
        "-ngl",
        "all",
        "--host",
        "0.0.0.0",
        "--port",
        "18200",
        "--parallel",
        "1",
        "--alias",
        "kvmem-27b",
        "-ctk",
        "q8_0",
        "-ctv",
        "q4_0",
        "--no-webui",
        "--path",
        str(ui),
        "--metrics",
        "-lv",
        "4",
        "--kvmem-budget",
        "1024",
        "--kvmem-gen-reserve",
        "512",
        "--temp",
        "0",
        "--device",
        "CUDA0",
        "--split-mode",
        "none",
        "--main-gpu",
        "1",
        "-ts",
        "1",
    )
    assert s.engine == EngineSettings(
        model_path=gguf,
        n_ctx=8192,
        n_batch=512,
        n_ubatch=128,
        n_threads=4,
        n_threads_batch=8,
        n_gpu_layers=-1,
        flash_attn=True,
        kvmem=KVMemConfig(budget=1024, gen_reserve=512),
        seed=7,
        cache_types=s.engine.cache_types,
        placement=GpuPlacement(split_mode="none", main_gpu=1, tensor_split=(1.0,)),
        warmup=True,
    )
    assert (s.engine.cache_types.k, s.engine.cache_types.v) == (GgmlType.Q8_0, GgmlType.Q4_0)
    assert (s.host, s.port, s.alias, s.n_predict, s.ui, s.ui_dir, s.metrics, s.verbosity) == (
        "0.0.0.0",
        18200,
        "kvmem-27b",
        256,
        False,
        str(ui),
        True,
        4,
    )
    placement = s.engine.placement
    assert (placement.split_mode, placement.main_gpu, placement.tensor_split) == ("none", 1, (1.0,))
    assert s.sampling.temperature == 0.0 and s.sampling.seed == 7
    assert s.sources["ctx_size"] is Source.CLI and s.sources["port"] is Source.CLI


def test_help_and_usage_list_every_flag_with_its_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for flag in ("--help", "--usage", "-h"):
        with pytest.raises(SystemExit) as exit_info:
            build_server_parser().parse_args([flag])
        assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for spec in SERVER_FLAGS:
        for name in spec.flags + spec.negative:
            assert name in text
    assert text.count("(default:") >= len(SERVER_FLAGS)
    for flag in ("--kvmem-budget", "-ctk", "--kv-dtype", "--kvmem-trace"):
        assert flag in text


@pytest.mark.parametrize(("k", "v"), list(itertools.product(["q8_0", "q5_0", "q4_0"], repeat=2)))
def test_nine_quantized_kv_pairs_are_accepted(k: str, v: str) -> None:
    s = load("-ctk", k, "-ctv", v)
    assert (s.engine.cache_types.k.label, s.engine.cache_types.v.label) == (k, v)


def test_kv_dtype_sets_both_and_explicit_components_win() -> None:
    s = load("--kv-dtype", "q8_0", "-ctv", "q5_0")
    assert (s.engine.cache_types.k.label, s.engine.cache_types.v.label) == ("q8_0", "q5_0")
    s = load("-ctk", "f32")
    assert (s.engine.cache_types.k.label, s.engine.cache_types.v.label) == ("f32", "f16")


def test_gpu_layers_and_flash_attn_values() -> None:
    assert load("-ngl", "auto").engine.n_gpu_layers == -1
    assert load("-ngl", "0").engine.n_gpu_layers == 0
    assert load("--device", "none").engine.n_gpu_layers == 0
    assert load("-fa", "on").engine.flash_attn is True
    assert load("-fa", "auto").engine.flash_attn is True
    assert load("-fa", "off").engine.flash_attn is False
    assert load("-n", "-1").n_predict == -1
    assert (load("--warmup").engine.warmup, load("--no-warmup").engine.warmup) == (True, False)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["-c", "0"], "--ctx-size"),
        (["-c", "-5"], "--ctx-size"),
        (["-c", "4k"], "--ctx-size"),
        (["-c", "2147483648"], "--ctx-size"),
        (["-n", "0"], "--n-predict"),
        (["-n", "-2"], "--n-predict"),
        (["-n", "1.5"], "--n-predict"),
        (["-s", "-2"], "--seed"),
        (["-s", "1.5"], "--seed"),
        (["-t", "0"], "--threads"),
        (["-tb", "-5"], "--threads-batch"),
        (["-b", "0"], "--batch-size"),
        (["-ub", "x"], "--ubatch-size"),
        (["-fa", "maybe"], "--flash-attn"),
        (["-ngl", "-3"], "--gpu-layers"),
        (["-ngl", "lots"], "--gpu-layers"),
        (["--port", "0"], "--port"),
        (["--port", "70000"], "--port"),
        (["--port", ""], "--port"),
        (["--parallel", "0"], "--parallel"),
        (["--queue-size", "-1"], "--queue-size"),
        (["--image-max-tokens", "0"], "--image-max-tokens"),
        (["-lv", "6"], "--verbosity"),
        (["-lv", "-1"], "--verbosity"),
        (["--reasoning-budget", "-2"], "--reasoning-budget"),
        (["--reasoning-effort", "extreme"], "--reasoning-effort"),
        (["--reasoning", "sometimes"], "--reasoning"),
        (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs"),
        (["--chat-template-kwargs", "{bad"], "--chat-template-kwargs"),
        (["--chat-template-kwargs", '{"enable_thinking": "yes"}'], "--chat-template-kwargs"),
        (["--chat-template", "no-such-template"], "--chat-template"),
        (["--chat-template", "{% if %}"], "--chat-template"),
        (["-ctk", "q8_0"], "-ctk/-ctv"),
        (["-ctk", "q9_0"], "-ctk"),
        (["--kv-dtype", "bf16"], "--kv-dtype"),
        (["-ctk", "f16", "-ctv", "q8_0"], "-ctk/-ctv"),
        (["--kv-dtype", "q8_0", "-fa", "off"], "-ctv"),
        (["--kvmem-budget", "0"], "--kvmem-budget"),
        (["--kvmem-block-tokens", "100"], "--kvmem-block-tokens"),
        (["--kvmem-gen-reserve", "abc"], "--kvmem-gen-reserve"),
        (["--device", "CUDA0,CUDA1"], "--device"),
        (["--split-mode", "row"], "--split-mode"),
        (["--split-mode", "tensor"], "--split-mode"),
        (["--split-mode", "diagonal"], "--split-mode"),
        (["--tensor-split", "3,1"], "--tensor-split"),
        (["--tensor-split", "a,b"], "--tensor-split"),
        (["--main-gpu", "-1"], "--main-gpu"),
        (["-m", "/nonexistent/model.gguf"], "--model"),
        (["--mmproj", "/nonexistent/mm.gguf"], "--mmproj"),
        (["--chat-template-file", "/nonexistent/t.jinja"], "--chat-template-file"),
        (["--ui-dir", "/nonexistent"], "--ui-dir"),
        (["--api-key", ""], "--api-key"),
        (["--api-key", '"unterminated'], "--api-key"),
        (["--api-key", "has space"], "--api-key"),
        (["--api-key", "a,,b"], "--api-key"),
        (["--api-key-file", "/nonexistent/keys.txt"], "--api-key-file"),
        (["--temp", "-1"], "--temp"),
        (["--top-p", "1.5"], "--top-p"),
        (["--min-p", "nan"], "--min-p"),
        (["--top-k", "-1"], "--top-k"),
        (["--presence-penalty", "3"], "--presence-penalty"),
        (["--frequency-penalty", "-2.5"], "--frequency-penalty"),
        (["--repeat-penalty", "-1"], "--repeat-penalty"),
        (["--repeat-last-n", "-2"], "--repeat-last-n"),
        (["-s", "x"], "--seed"),
        (["--queue-size", "x"], "--queue-size"),
        (["--host", ""], "--host"),
        (["--alias", ""], "--alias"),
        (["-ctv", "q9_0"], "-ctv"),
        (["--kvmem-gen-reserve", "64"], "--kvmem-gen-reserve"),
        (["--kvmem-sink-blocks", "-1"], "--kvmem-sink-blocks"),
        (["--kvmem-recent-blocks", "x"], "--kvmem-recent-blocks"),
        (["--kvmem-neighbor-blocks", "-1"], "--kvmem-neighbor-blocks"),
        (["--kvmem-method", "bogus"], "--kvmem-method"),
        (["--kvmem-query-replay", "maybe"], "--kvmem-query-replay"),
        (["--kvmem-score-mode", "max"], "--kvmem-score-mode"),
        (["--kvmem-positions", "packed"], "--kvmem-positions"),
        (["--kvmem-cell-order", "sorted"], "--kvmem-cell-order"),
        (["--kvmem-rank", "oracle"], "--kvmem-rank"),
        (["--kvmem-stream-cap", "-1"], "--kvmem-stream-cap"),
        (["--kvmem-harvest-tokens", "-1"], "--kvmem-harvest-tokens"),
        (["--kvmem-chunk-tokens", "0"], "--kvmem-chunk-tokens"),
        (["--kvmem-lexical-max-df", "1.5"], "--kvmem-lexical-max-df"),
        (["--kvmem-lexical-max-df", "nan"], "--kvmem-lexical-max-df"),
        (["--kvmem-lexical", "off", "--kvmem-lexical-max-df", "0.1"], "--kvmem-lexical-max-df"),
        (["--kvmem-query-policy", "x"], "--kvmem-query-policy"),
        (["--kvmem-query-source", "gpu"], "--kvmem-query-source"),
        (["--kvmem-query-ahead", "later"], "--kvmem-query-ahead"),
        (["--kvmem-query-ahead", "off"], "--kvmem-query-ahead"),  # the main source's query
        (["--kvmem-query-max-tokens", "0"], "--kvmem-query-max-tokens"),
        (["--kvmem-score-layers", "a,b"], "--kvmem-score-layers"),
        (["--kvmem-score-layers", "-1"], "--kvmem-score-layers"),
        (["--bogus-flag"], "--bogus-flag"),
        (["-c"], "--ctx-size"),
    ],
)
def test_every_flag_rejects_invalid_values(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(*argv)
    assert flag in str(info.value)


@pytest.mark.model
def test_file_checks(tmp_path: Path, gguf: str) -> None:
    text_file = tmp_path / "model.gguf"
    text_file.write_text("not a model")
    with pytest.raises(ConfigError, match="--model: .* is not a GGUF file"):
        load("-m", str(text_file))
    bad_template = tmp_path / "bad.jinja"
    bad_template.write_text("{% for %}")
    with pytest.raises(ConfigError, match="--chat-template-file: invalid chat template"):
        load("--chat-template-file", str(bad_template))
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    s = load("--chat-template-file", str(good))
    assert (s.chat_template, s.chat_template_origin) == (good.read_text(), str(good))
    with pytest.raises(ConfigError, match="either --chat-template or --chat-template-file"):
        load("--chat-template", "chatml", "--chat-template-file", str(good))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ConfigError, match="--mmproj: .* is not a readable GGUF file"):
        load("--mmproj", str(truncated))  # the projector itself: tests/unit/test_vision_flags.py
    with pytest.raises(ConfigError, match="--mmproj: .* is not a multimodal projector"):
        load("--mmproj", gguf)


def test_thinking_flags_become_template_defaults() -> None:
    s = load(
        "--enable-thinking",
        "--reasoning-effort",
        "low",
        "--reasoning-budget",
        "4096",
        "--chat-template-kwargs",
        '{"custom": 1}',
    )
    assert (
        dict(s.thinking.template_kwargs),
        s.thinking.reasoning_effort,
        s.thinking.enable_thinking,
        s.thinking.reasoning_budget,
    ) == ({"custom": 1}, "low", True, 4096)
    s = load("--enable-thinking", "--reasoning", "off", "--reasoning-effort", "default")
    assert (s.thinking.enable_thinking, s.thinking.reasoning_effort) == (False, None)


def test_ubatch_larger_than_batch_is_clamped_with_a_warning() -> None:
    settings, warnings = load_server_settings(["-b", "256", "-ub", "512"], {})
    assert (settings.engine.n_batch, settings.engine.n_ubatch) == (256, 256)
    assert warnings == ["--ubatch-size 512 is larger than --batch-size 256: using 256"]


def test_retrieval_flags_reach_the_kvmem_config() -> None:
    assert load().engine.kvmem.positions is PositionMode.COMPACT
    s = load("--kvmem-positions", "original", "--kvmem-score-mode", "mean")
    assert s.engine.kvmem.positions is PositionMode.ORIGINAL
    assert load("--kvmem-positions", "compact").engine.kvmem.positions is PositionMode.COMPACT
    assert s.engine.kvmem.score_mode is ScoreMode.MEAN_KEY
    assert load().engine.kvmem.rank is RankMode.SUMMARY and load().engine.kvmem.stream_cap == 0
    s = load("--kvmem-rank", "rerank", "--kvmem-stream-cap", "640")
    assert s.engine.kvmem.rank is RankMode.RERANK and s.engine.kvmem.stream_cap == 640
    assert load().engine.kvmem.harvest_tokens == 8192
    assert load().engine.kvmem.lexical_max_df == 0.05
    assert load("--kvmem-lexical-max-df", "0.1").engine.kvmem.lexical_max_df == 0.1
    assert load().engine.kvmem.cell_order is CellOrder.FREE
    assert load().engine.kvmem.neighbor_blocks == 0
    assert load("--kvmem-neighbor-blocks", "1").engine.kvmem.neighbor_blocks == 1
    assert load("--kvmem-cell-order", "canonical").engine.kvmem.cell_order is CellOrder.CANONICAL
    assert load("--kvmem-harvest-tokens", "8192").engine.kvmem.harvest_tokens == 8192
    assert load().engine.kvmem.chunk_tokens == 512 and load().engine.kvmem.stream_tokens == -1
    assert load("--kvmem-chunk-tokens", "2048").engine.kvmem.chunk_tokens == 2048
    assert load().engine.kvmem.query_source is QuerySource.MAIN
    s = load("--kvmem-query-source", "scoring")
    assert s.engine.kvmem.query_source is QuerySource.SCORING
    assert s.engine.kvmem.query_ahead is QueryAheadMode.ON
    s = load("--kvmem-query-source", "scoring", "--kvmem-query-ahead", "off")
    assert s.engine.kvmem.query_ahead is QueryAheadMode.OFF


def test_recompute_is_off_unless_asked_for_and_refused_where_it_cannot_run() -> None:
    assert load().engine.kvmem.recompute is RecomputeMode.OFF
    s = load("--kvmem-recompute", "retrieved")
    assert s.engine.kvmem.recompute is RecomputeMode.RETRIEVED
    with pytest.raises(ConfigError, match="--kvmem-recompute.*compact"):
        load("--kvmem-recompute", "retrieved", "--kvmem-positions", "original")
    with pytest.raises(ConfigError, match="--kvmem-recompute.*canonical"):
        load("--kvmem-recompute", "retrieved", "--kvmem-cell-order", "canonical")
    with pytest.raises(ConfigError, match="invalid choice: 'all'"):
        load("--kvmem-recompute", "all")


def test_recompute_above_is_three_windows_and_applies_to_retrieved_only() -> None:
    assert load("--kvmem-recompute", "retrieved").engine.kvmem.recompute_above == 3.0
    s = load("--kvmem-recompute", "retrieved", "--kvmem-recompute-above", "0")
    assert s.engine.kvmem.recompute_above == 0.0
    with pytest.raises(ConfigError) as info:
        load("--kvmem-recompute-above", "2")
    assert info.value.flag == "--kvmem-recompute-above"
    assert "applies to --kvmem-recompute retrieved only" in str(info.value)
    with pytest.raises(ConfigError, match="out of range"):
        load("--kvmem-recompute", "retrieved", "--kvmem-recompute-above", "-1")


def test_restore_ahead_is_generation_unless_turn_end_is_asked_for() -> None:
    assert load().engine.kvmem.restore_ahead is RestoreAheadMode.GENERATION
    s = load("--kvmem-restore-ahead", "turn-end")
    assert s.engine.kvmem.restore_ahead is RestoreAheadMode.TURN_END
    with pytest.raises(ConfigError, match="invalid choice: 'later'"):
        load("--kvmem-restore-ahead", "later")
