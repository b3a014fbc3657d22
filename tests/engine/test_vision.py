"""Images through mtmd with the random-weight projector: the stand-in rows decode to the
same logits as plain llama.cpp + mtmd, and the image's KV is reused across turns."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import numpy as np
import pytest

from kvmem.bench.synth_mmproj import MmprojShape, write_mmproj
from kvmem.config import KVMemConfig, QuerySource
from kvmem.engine.engine import Engine
from kvmem.engine.media.media import is_standin
from kvmem.engine_settings import VisionSettings
from kvmem.memory.spans import PromptSpans, TokenSpan

from .helpers import GREEDY, make_engine
from .mtmd_reference import MtmdReference

pytestmark = pytest.mark.slow

SHAPE = MmprojShape()  # 16 rows per image, 576 wide (SmolLM2-135M)


def _image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (40, 52, 3), dtype=np.uint8)


def _items(engine: Engine, rgb: np.ndarray) -> list[int]:
    h, w, _ = rgb.shape
    digest = hashlib.sha256(rgb.tobytes()).hexdigest()
    return engine.image_items(digest, w, h, rgb.tobytes())


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory) -> str:
    return str(write_mmproj(tmp_path_factory.mktemp("mmproj") / "synth.gguf", SHAPE))


def _vision_engine(path: str, mmproj: str, **kw) -> Engine:
    engine = make_engine(path, **kw)
    settings = replace(engine.settings, vision=VisionSettings(mmproj, offload=False, n_threads=2))
    engine.close()
    return Engine(settings)


@pytest.fixture(scope="module")
def engine(smollm2_path, mmproj):
    e = _vision_engine(smollm2_path, mmproj, kvmem=KVMemConfig(budget=4096, gen_reserve=512))
    yield e
    e.close()


def test_image_logits_bit_identical_to_plain_mtmd(engine, smollm2_path, mmproj):
    ref = MtmdReference(smollm2_path, mmproj)
    try:
        rgb = _image(1)
        chunks = ref.chunks(f"Look: {ref.marker} What is it?", rgb)
        layout = ref.layout(chunks)
        assert [kind for kind, _ in layout] == ["text", "image", "text"]
        assert layout[1][1] == SHAPE.n_patches
        prompt: list[int] = []
        for kind, value in layout:
            prompt += _items(engine, rgb) if kind == "image" else list(value)
        assert sum(is_standin(t) for t in prompt) == SHAPE.n_patches
        out_ref, logits_ref = ref.greedy(chunks, 12)
    finally:
        ref.close()
    rows: list[np.ndarray] = []
    out = list(engine.generate(prompt, sampling=GREEDY, max_tokens=12, logits_out=rows))
    assert out == out_ref
    assert len(rows) == len(logits_ref) > 0
    for a, b in zip(rows, logits_ref, strict=True):
        assert np.array_equal(a, b)


def test_same_image_reuses_embeddings_and_kv(engine):
    rgb = _image(2)
    head = engine.tokenize("Picture:", add_special=True)
    before = engine.vision.encoded
    first = head + _items(engine, rgb) + engine.tokenize(" Describe it.")
    out = list(engine.generate(first, sampling=GREEDY, max_tokens=4))
    assert engine.vision.encoded == before + 1
    second = first + out + engine.tokenize(" And again?")
    assert _items(engine, rgb) == first[len(head) : len(head) + SHAPE.n_patches]
    assert engine.vision.encoded == before + 1  # the cache answered
    list(engine.generate(second, sampling=GREEDY, max_tokens=4))
    assert engine.last_turn.cached_tokens >= len(first)  # the image's rows too
    assert engine.last_turn.prompt_tokens == len(second)


def test_different_images_get_different_rows(engine):
    a, b = _items(engine, _image(3)), _items(engine, _image(4))
    assert len(a) == len(b) == SHAPE.n_patches
    assert not set(a) & set(b)


# --- an image early in a conversation over budget -----------------------------------------

BIG = MmprojShape(image_size=96, patch_size=8)  # 144 rows: blocks of 32 split it in 5-6


def _records(trace, kind: str) -> list[dict[str, set[int] | str]]:
    out = []
    for line in trace.getvalue().splitlines():
        if line.startswith(f"KVMEM_{kind} "):
            fields = dict(p.split("=", 1) for p in line.split()[1:])
            out.append(fields)
    return out


def _ids(value: str) -> set[int]:
    return set() if value == "-" else {int(v) for v in value.split(",")}


def test_image_group_is_evicted_and_restored_whole(smollm2_path, tmp_path):
    import io

    mm = str(write_mmproj(tmp_path / "big.gguf", BIG))
    trace = io.StringIO()
    kv = KVMemConfig(budget=384, gen_reserve=64, block_tokens=32, trace=True)
    engine = make_engine(smollm2_path, kvmem=kv, trace=trace)
    settings = replace(engine.settings, vision=VisionSettings(mm, offload=False, n_threads=2))
    engine.close()
    engine = Engine(settings, trace_stream=trace)
    try:
        head = engine.tokenize("Here is a note. " * 12 + "An early picture:", add_special=True)
        image = _items(engine, _image(5))
        assert len(image) == BIG.n_patches == 144
        group = TokenSpan(len(head), len(head) + len(image))
        blocks = set(group.blocks(32))
        filler = engine.tokenize(" The grass is green and the sky is blue." * 50)
        question = engine.tokenize(" What was in the picture?")
        prompt = head + image + filler + question
        query = TokenSpan(len(prompt) - len(question), len(prompt))
        spans = PromptSpans(query=query, live=query, groups=(group,))
        list(engine.generate(prompt, query=spans, sampling=GREEDY, max_tokens=4))
        streams = _records(trace, "STREAM")
        evicted = [_ids(r["evict"]) & blocks for r in streams]
        assert blocks in evicted  # the prefill stream dropped the image, all of it at once
        assert all(e in (set(), blocks) for e in evicted)
        assert all(_ids(r["stage_in"]) & blocks in (set(), blocks) for r in streams)
        reselect = _records(trace, "RESELECT")[-1]
        assert _ids(reselect["image"]) == blocks  # the latest image is back, whole
        plan = engine.session.last_plan
        assert blocks <= set(plan.selected) and blocks <= set(plan.stage_in)
        # the next turn reuses the image's KV like text
        out = engine.session.tokens[len(prompt) :]
        nxt = prompt + out + engine.tokenize(" Tell me more.")
        q2 = TokenSpan(len(nxt) - 4, len(nxt))
        spans2 = PromptSpans(query=q2, live=q2, groups=(group,))
        list(engine.generate(nxt, query=spans2, sampling=GREEDY, max_tokens=2))
        assert engine.last_turn.cached_tokens >= group.end
    finally:
        engine.close()


def test_scoring_context_decodes_a_query_with_an_image(engine, smollm2_path, mmproj):
    """With --kvmem-query-source scoring a query span holding image rows is decoded by the
    scoring context through the same projector: for a prompt that is all query the rows
    equal the main context's. The prompt fits the budget, so the scoring source computes
    no rows for it during the turn (nothing is ranked); they are asked for here."""
    kv = KVMemConfig(budget=4096, gen_reserve=512, query_source=QuerySource.SCORING)
    scoring = _vision_engine(smollm2_path, mmproj, kvmem=kv)
    try:
        prompts = {}
        for name, e in (("main", engine), ("scoring", scoring)):
            e.reset()
            prompts[name] = (
                e.tokenize("Look:", add_special=True)
                + _items(e, _image(7))
                + e.tokenize(" What is it?")
            )
            list(e.generate(prompts[name], query=None, sampling=GREEDY, max_tokens=2))
        prompt = prompts["scoring"]
        query = engine.session.last_query
        assert query.positions.tolist() == list(range(len(prompt)))
        assert scoring.session.last_query is None
        span = TokenSpan(0, len(prompt))
        rows = {
            "main": query.by_layer,
            "scoring": scoring.scoring.query_rows(prompt, [span])[span],
        }
        assert scoring.ctx._callback is None
        assert sorted(rows["scoring"]) == sorted(rows["main"])
        for layer, want in rows["main"].items():
            np.testing.assert_array_equal(rows["scoring"][layer], want)
    finally:
        scoring.close()
