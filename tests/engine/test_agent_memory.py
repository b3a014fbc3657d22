"""Agent loops and raw prompts retrieve: an early tool result or a fact in the middle of a
document comes back into the window (stage-in), which a recency window never holds."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest

from kvmem.chat.prompt import build_prompt_tokens
from kvmem.chat.template import ChatTemplate
from kvmem.config import KVMemConfig, QueryAheadMode, QuerySource
from kvmem.engine.query.query_ahead import QueryAhead
from kvmem.errors import TurnCancelledError
from kvmem.memory.planner import RetrievalMethod, Tier
from kvmem.memory.spans import PromptSpans, TokenSpan

from .helpers import FILLER, GREEDY, make_engine

pytestmark = pytest.mark.slow

FACT = "The deploy key of the billing service is KX-4817-ZULU."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _call(i: int, path: str) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "{path}"}}'},
            }
        ],
    }


def agent_messages(n_rounds: int) -> list[dict]:
    """A task, then tool rounds: the second tool result holds the fact, later ones are
    filler logs, and the last tool result asks for the key again."""
    messages: list[dict] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Find the deploy key of the billing service."},
        _call(0, "README.md"),
        {"role": "tool", "tool_call_id": "call_0", "content": FILLER * 4},
        _call(1, "config/billing.env"),
        {"role": "tool", "tool_call_id": "call_1", "content": FILLER * 2 + FACT + " " + FILLER * 2},
    ]
    for i in range(2, n_rounds):
        messages += [
            _call(i, f"logs/run{i}.log"),
            {"role": "tool", "tool_call_id": f"call_{i}", "content": FILLER * 6},
        ]
    messages += [
        _call(n_rounds, "NOTES.md"),
        {
            "role": "tool",
            "tool_call_id": f"call_{n_rounds}",
            "content": "NOTES: the deploy key of the billing service is in config/billing.env.",
        },
    ]
    return messages


@pytest.fixture(scope="module")
def engines(smollm2_path):
    """recency, and retrieval with the query vectors from the main context (`main`) or
    from the scoring context (`scoring`: the main context has no eval callback)."""

    def engine(
        method: RetrievalMethod,
        source: QuerySource = QuerySource.MAIN,
        ahead: QueryAheadMode = QueryAheadMode.ON,
    ):
        kv = KVMemConfig(
            budget=1024,
            gen_reserve=256,
            method=method,
            trace=True,
            query_source=source,
            query_ahead=ahead,
        )
        return make_engine(smollm2_path, n_ctx=8192, kvmem=kv, trace=io.StringIO())

    made = {
        "recency": engine(RetrievalMethod.RECENCY),
        "main": engine(RetrievalMethod.RETRIEVAL),
        "scoring": engine(RetrievalMethod.RETRIEVAL, QuerySource.SCORING),
        "scoring-after": engine(RetrievalMethod.RETRIEVAL, QuerySource.SCORING, QueryAheadMode.OFF),
    }
    yield made
    for e in made.values():
        e.close()


def _fact_blocks(engine, tokens: list[int], text: str, bt: int = 128) -> set[int]:
    """The blocks holding the fact's key, located by tokenizing up to it."""
    rendered = engine.detokenize(tokens)
    at = rendered.index("KX-4817")
    start = len(engine.tokenize(rendered[:at], add_special=False, parse_special=True))
    return set(TokenSpan(start, start + 6).blocks(bt))


@pytest.mark.parametrize("source", ["main", "scoring"])
def test_agent_loop_restores_the_early_tool_result(engines, source):
    engine = engines[source]
    engine.reset()
    template = ChatTemplate.from_engine_info(engine.info, None)
    prompt = build_prompt_tokens(engine, template, agent_messages(8), tools=TOOLS)
    spans = prompt.spans
    assert spans.query is not None and spans.trajectory is not None
    assert spans.control is not None and spans.control.start == 0
    assert spans.trajectory.start == spans.query.end and spans.trajectory.end == len(prompt.tokens)
    assert 1500 < len(prompt.tokens) < 4000
    fact = _fact_blocks(engine, prompt.tokens, FACT)
    list(engine.generate(prompt.tokens, query=spans, sampling=GREEDY, max_tokens=4))
    plan = engine.session.last_plan
    control = set(spans.control.blocks(128))
    assert control <= set(plan.selected)  # the system prompt and tool definitions stay
    assert set(plan.tier(Tier.QUERY)) <= set(spans.query.blocks(128))
    assert fact & set(plan.retrieved), (fact, plan.tiers)
    assert engine.last_turn.stage_in_blocks > 0
    recency = engines["recency"]
    recency.reset()
    list(recency.generate(prompt.tokens, query=spans, sampling=GREEDY, max_tokens=4))
    assert not fact & set(recency.session.last_plan.selected)


@pytest.mark.parametrize("source", ["main", "scoring"])
def test_raw_prompt_with_no_user_message_retrieves_with_its_question(engines, source):
    """A raw prompt's query is its question (memory.raw_query: the last lines), not the
    document text of its tail; the tail stays pinned."""
    engine = engines[source]
    engine.reset()
    doc = (
        FILLER * 60
        + FACT
        + " "
        + FILLER * 60
        + "\nQuestion: what is the deploy key of the billing service?\nAnswer: The deploy key is"
    )
    tokens = engine.tokenize(doc, add_special=True)
    assert 2500 < len(tokens) < 4000
    fact = _fact_blocks(engine, tokens, FACT)
    list(engine.generate(tokens, query=None, sampling=GREEDY, max_tokens=8))
    plan = engine.session.last_plan
    question = next(i for i in range(len(tokens)) if engine.detokenize(tokens[i:]).startswith("Q"))
    assert engine.detokenize(tokens[question - 1 : question]) == "\n"
    assert len(tokens) - question == 19  # "Question: ...?\nAnswer: The deploy key is"
    assert engine.session.last_query.positions.tolist() == list(range(question, len(tokens)))
    assert fact & set(plan.retrieved) and engine.last_turn.stage_in_blocks > 0
    recency = engines["recency"]
    recency.reset()
    list(recency.generate(tokens, query=PromptSpans(), sampling=GREEDY, max_tokens=8))
    assert not fact & set(recency.session.last_plan.selected)


def _reselect_records(engine) -> list[dict[str, str]]:
    lines = engine.tracer.stream.getvalue().splitlines()
    return [
        dict(kv.split("=", 1) for kv in ln.split()[1:])
        for ln in lines
        if ln.startswith("KVMEM_RESELECT")
    ]


def _scores_at_once(monkeypatch) -> None:
    """Make every poll that starts the scores wait for them, so that the restore blobs
    are built ahead at the same chunk on every machine."""
    poll = QueryAhead.poll

    def waiting_poll(self: QueryAhead) -> None:
        poll(self)
        if self._scores is not None:
            self._scores.result()
            poll(self)

    monkeypatch.setattr(QueryAhead, "poll", waiting_poll)


def test_scores_computed_ahead_of_the_prefill_give_the_window_computed_after_it(
    engines, monkeypatch
):
    """With the scoring source the query rows and the candidates' scores are computed on
    the scoring context's worker while the main context prefills (`--kvmem-query-ahead`,
    on by default): the first turn starts scoring once its last candidate block is
    harvested; the next turn's candidates are all old, so it scores from the prefill's
    start. Once scored, the plan's stage-ins have their restore blob built beside the
    prefill (`built_ahead`: every one, since the scores here are waited for at once).
    Both turns choose the window and the greedy tokens that scoring after the prefill
    (`off`) chooses, and the trace says where the scores came from."""
    _scores_at_once(monkeypatch)
    out: dict[str, list] = {}
    for name in ("scoring", "scoring-after"):
        engine = engines[name]
        engine.reset()
        engine.tracer.stream.seek(0)
        engine.tracer.stream.truncate()
        template = ChatTemplate.from_engine_info(engine.info, None)
        turns, sizes = [], []
        for rounds in (8, 9):
            prompt = build_prompt_tokens(engine, template, agent_messages(rounds), tools=TOOLS)
            got = list(
                engine.generate(prompt.tokens, query=prompt.spans, sampling=GREEDY, max_tokens=6)
            )
            plan = engine.session.last_plan
            turns.append((plan.tiers, got, engine.last_turn.stage_in_blocks))
            sizes.append((len(prompt.tokens), engine.last_turn.cached_tokens))
        out[name] = turns
        records = _reselect_records(engine)
        assert len(records) == 2
        if name == "scoring-after":
            assert [r["ahead"] for r in records] == ["-", "-"]
            assert [r["built_ahead"] for r in records] == ["0", "0"]
        else:  # once the last candidate is complete, then from the reused prefix
            first, second = (int(r["ahead"]) for r in records)
            assert 0 < first < sizes[0][0] and first % 128 == 0
            assert second == sizes[1][1] > 0
            assert [r["built_ahead"] for r in records] == [r["stage_in"] for r in records]
    assert out["scoring"] == out["scoring-after"]
    assert all(stage_in > 0 for _, _, stage_in in out["scoring"])


class _CancelAfter(threading.Event):
    """A cancel event that reads as set from its (n + 1)-th check on (one per chunk)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.checks, self.n = 0, n

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.n


def test_a_turn_cancelled_while_its_query_work_runs_ahead_leaves_the_session_usable(engines):
    """Cancelling a prefill while the scoring context's worker decodes its query waits for
    that work before the error reaches the caller; the same request then answers as one
    that was never cancelled (with the query work after the prefill)."""
    got: dict[str, tuple] = {}
    for name in ("scoring", "scoring-after"):
        engine = engines[name]
        engine.reset()
        template = ChatTemplate.from_engine_info(engine.info, None)
        first, second = (
            build_prompt_tokens(engine, template, agent_messages(r), tools=TOOLS) for r in (4, 9)
        )
        list(engine.generate(first.tokens, query=first.spans, sampling=GREEDY, max_tokens=2))
        if name == "scoring":
            with pytest.raises(TurnCancelledError):
                list(
                    engine.generate(
                        second.tokens, query=second.spans, sampling=GREEDY, cancel=_CancelAfter(1)
                    )
                )
            assert engine.scoring.worker.submit(lambda: 7).result(timeout=1) == 7  # idle
        out = list(
            engine.generate(second.tokens, query=second.spans, sampling=GREEDY, max_tokens=6)
        )
        got[name] = (engine.session.last_plan.tiers, out)
    assert got["scoring"] == got["scoring-after"]


def test_scoring_context_reads_the_main_contexts_rows_for_a_prompt_that_is_all_query(engines):
    """A prompt shorter than the query bound is its own query from position 0: the scoring
    context decodes exactly what the main context decoded, so the rows are the same; and
    with that source the main context carries no eval callback at all. The prompt fits
    the budget, so the scoring source computes no rows for it (nothing is ranked)."""
    tokens = engines["main"].tokenize(FILLER * 8 + FACT, add_special=True)
    assert 128 < len(tokens) < 512
    for source in ("main", "scoring"):
        engine = engines[source]
        engine.reset()
        list(engine.generate(tokens, query=None, sampling=GREEDY, max_tokens=2))
    query = engines["main"].session.last_query
    assert query.positions.tolist() == list(range(len(tokens)))
    assert engines["scoring"].session.last_query is None
    span = TokenSpan(0, len(tokens))
    rows = {
        "main": query.by_layer,
        "scoring": engines["scoring"].scoring.query_rows(tokens, [span])[span],
    }
    assert engines["main"].ctx._callback is not None and engines["main"].scoring is None
    scoring = engines["scoring"]
    assert scoring.ctx._callback is None and scoring.scoring.ctx._callback is not None
    assert sorted(rows["scoring"]) == sorted(rows["main"])
    for layer, main_rows in rows["main"].items():
        assert rows["scoring"][layer].shape == main_rows.shape
        np.testing.assert_array_equal(rows["scoring"][layer], main_rows)


def _records(engine, kind: str) -> list[dict[str, str]]:
    lines = engine.tracer.stream.getvalue().splitlines()
    return [
        dict(kv.split("=", 1) for kv in ln.split()[1:])
        for ln in lines
        if ln.startswith(f"KVMEM_{kind} ")
    ]


def growing_loop(n_requests: int) -> list[list[dict]]:
    """An agent loop's requests: each appends one tool call and a short tool result
    (under 200 tokens) to the one before."""
    messages = agent_messages(3)
    out = []
    for i in range(n_requests):
        messages = [
            *messages,
            _call(10 + i, f"src/mod{i}.py"),
            {"role": "tool", "tool_call_id": f"call_{10 + i}", "content": FILLER * 2},
        ]
        out.append(messages)
    return out


@pytest.mark.parametrize("source", ["main", "scoring"])
def test_a_loop_grown_by_short_tool_results_scores_on_every_request(engines, source):
    """Each request appends a short tool result to a prefix the session holds: the task
    and most of the trajectory's tail were decoded in earlier requests. Every request over
    the budget still scores with the vectors of all its query spans (the QUERY trace lists
    none missing; the plan ranks and retrieves), and answers as the same request on a
    fresh session does."""
    engine = engines[source]
    engine.reset()
    template = ChatTemplate.from_engine_info(engine.info, None)
    prompts = [build_prompt_tokens(engine, template, m, tools=TOOLS) for m in growing_loop(10)]
    over = [p for p in prompts if len(p.tokens) > 1024]
    assert len(over) == 8 and len(prompts[0].tokens) < 1024
    growth = [len(b.tokens) - len(a.tokens) for a, b in zip(prompts, prompts[1:], strict=False)]
    assert all(0 < g < 200 for g in growth)
    engine.tracer.stream = io.StringIO()
    grown = [
        list(engine.generate(p.tokens, query=p.spans, sampling=GREEDY, max_tokens=4))
        for p in prompts
    ]
    queries = {int(q["at"]): q for q in _records(engine, "QUERY")}
    reselects = _records(engine, "RESELECT")
    assert len(reselects) == len(prompts)  # one a turn
    pairs = zip(over, reselects[-len(over) :], strict=True)
    ranked = [(p, r) for p, r in pairs if float(r["score_ms"]) > 0]
    # the scoring source plans at the deferred tail's start, where on some requests the
    # pinned tiers leave no room to retrieve (nothing ranked, nothing scored)
    assert len(ranked) == (8 if source == "main" else 4)
    for p, r in ranked:
        q = queries[len(p.tokens)]
        wanted = [p.spans.query.last(512), p.spans.trajectory.last(512)]
        assert q["spans"] == ",".join(f"{s.start}-{s.end}" for s in wanted)
        assert q["missing"] == "-"
        assert int(q["tokens"]) == sum(s.length for s in wanted)
        assert float(r["score_ms"]) > 0 and r["retrieved"] != "-"
        pinned = {int(b) for t in ("control", "query") if r[t] != "-" for b in r[t].split(",")}
        assert set(p.spans.query.blocks(128)) <= pinned  # the task: in block 1, with the tools
    for p, tokens in zip(prompts, grown, strict=True):
        if len(p.tokens) > 1024:
            engine.reset()
            got = list(engine.generate(p.tokens, query=p.spans, sampling=GREEDY, max_tokens=4))
            assert got == tokens
