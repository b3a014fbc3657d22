"""A chat prompt whose spans the chat layer could not find says so in the KVMem trace."""

from __future__ import annotations

import io

from kvmem.chat.prompt import build_prompt_tokens
from kvmem.chat.template import ChatTemplate
from kvmem.config import KVMemConfig

from .helpers import GREEDY, make_engine

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour.\n"},
]


def test_unlocated_spans_are_traced_and_found_ones_are_not(smollm2_path):
    trace = io.StringIO()
    engine = make_engine(
        smollm2_path, kvmem=KVMemConfig(budget=1024, gen_reserve=256, trace=True), trace=trace
    )
    try:
        own = ChatTemplate.from_engine_info(engine.info)
        prompt = build_prompt_tokens(engine, own, MESSAGES)
        assert prompt.spans is not None and prompt.spans.unlocated == ()
        assert prompt.query is not None
        assert engine.detokenize(prompt.tokens[prompt.query.start : prompt.query.end]) == (
            "Name a colour.\n"
        )
        list(engine.generate(prompt.tokens, query=prompt.spans, sampling=GREEDY, max_tokens=2))
        assert "KVMEM_SPANS_UNLOCATED" not in trace.getvalue()

        shouting = ChatTemplate.from_engine_info(
            engine.info,
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}"
            "<|im_end|>\n{% endfor %}<|im_start|>assistant\n",
        )
        lost = build_prompt_tokens(engine, shouting, MESSAGES)
        assert lost.query is None and lost.spans is not None
        assert lost.spans.unlocated == ("query", "control", "live")
        out = list(engine.generate(lost.tokens, query=lost.spans, sampling=GREEDY, max_tokens=2))
        assert len(out) == 2
        records = [r for r in engine.tracer.records if r.startswith("KVMEM_SPANS_UNLOCATED")]
        assert records == [
            f"KVMEM_SPANS_UNLOCATED spans=query,control,live tokens={len(lost.tokens)}"
        ]
    finally:
        engine.close()
