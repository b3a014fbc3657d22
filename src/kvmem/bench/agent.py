"""`kvmem-bench agent`: LongMemEval-style memory questions over a long conversation.

Each episode's history is processed once per method; its questions are then asked one
after another as the final user turn (the session reuses the history and drops the
previous question). Methods: full context, KVMem retrieval and recency at the budget,
the "last N tokens only" baseline and `compact-rag` (BM25-ranked history chunks in the
budget, `compact_prompts`).

`--final tool` asks each question the way an agent loop meets it: after the history the
user gives a task (fill in a profile form) and the question comes back as a tool result,
the final message (`agent_final_tool`). `--final user` (the default) asks it as the final
user turn.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from kvmem.bench import agent_final_tool
from kvmem.bench.agent_data import Episode, Question, QuestionType, build_episode, is_correct
from kvmem.bench.compact_prompts import CompactBudget, chat_prompt
from kvmem.bench.conversation import (
    Message,
    PromptRenderer,
    Role,
    last_tokens_only,
    make_renderer,
)
from kvmem.bench.engines import (
    BenchEngine,
    EngineFactory,
    LlamaEngineFactory,
    Method,
    add_engine_arguments,
    ask,
    parse_methods,
    settings_from_args,
)
from kvmem.bench.report import format_table, fraction, machine_description, write_json
from kvmem.cli.kvmem_flags import strict_int
from kvmem.cli.progress_bar import stderr_bar
from kvmem.errors import ConfigError

logger = logging.getLogger(__name__)

DEFAULT_METHODS = (Method.FULL, Method.RETRIEVAL, Method.RECENCY, Method.LAST_N)


@dataclass(slots=True)
class AgentResult:
    method: Method
    episode: int
    qtype: QuestionType
    question: str
    expected: tuple[str, ...]
    answer: str
    correct: bool
    prompt_tokens: int
    cached_tokens: int
    prefill_ms: float
    stage_in_blocks: int
    profile: dict[str, float] = field(default_factory=dict)


def build_episodes(engine: BenchEngine, seeds: Sequence[int], target_tokens: int) -> list[Episode]:
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = cache[text] = len(engine.tokenize(text, parse_special=False))
        return n

    return [build_episode(seed, target_tokens, count) for seed in seeds]


def run_agent(
    factory: EngineFactory,
    methods: Sequence[Method],
    seeds: Sequence[int],
    target_tokens: int,
    last_n: int,
    max_tokens: int,
    final: str = "user",
    bar: tqdm | None = None,  # a tqdm bar of the questions asked (kvmem-bench --progress-bar)
    limits: CompactBudget | None = None,
) -> list[AgentResult]:
    results: list[AgentResult] = []
    episodes: list[Episode] | None = None
    for method in methods:
        engine = factory.open(method.engine_method)
        try:
            if episodes is None:
                episodes = build_episodes(engine, seeds, target_tokens)
                if bar is not None:
                    bar.reset(total=len(methods) * sum(len(e.questions) for e in episodes))
            renderer = make_renderer(engine)
            for episode in episodes:
                engine.reset()
                for question in episode.questions:
                    results.append(
                        _ask(
                            engine,
                            renderer,
                            method,
                            episode,
                            question,
                            last_n,
                            max_tokens,
                            final,
                            limits,
                        )
                    )
                    if bar is not None:
                        bar.update()
        finally:
            engine.close()
    return results


def _ask(
    engine: BenchEngine,
    renderer: PromptRenderer,
    method: Method,
    episode: Episode,
    question: Question,
    last_n: int,
    max_tokens: int,
    final: str = "user",
    limits: CompactBudget | None = None,
) -> AgentResult:
    if final == "tool":
        loop, prefix = agent_final_tool.final_tool_messages(question)
        messages, tools = episode.history + loop, agent_final_tool.TOOLS
    else:
        messages = episode.history + [Message(Role.USER, question.text)]
        prefix, tools = question.answer_prefix, None
    prompt = renderer.render(messages, answer_prefix=prefix, tools=tools)
    if method is Method.LAST_N:
        prompt = last_tokens_only(prompt, last_n)
    elif method is Method.COMPACT_RAG:
        if limits is None:
            raise ConfigError("--methods", "compact-rag needs the KVMem budget it compacts into")
        prompt = chat_prompt(
            engine, renderer, messages, prompt, limits, tools=tools, answer_prefix=prefix
        ).prompt
    answer = ask(engine, prompt, max_tokens)
    result = AgentResult(
        method=method,
        episode=episode.seed,
        qtype=question.qtype,
        question=question.text,
        expected=question.expected,
        answer=answer.text,
        correct=is_correct(answer.text, question),
        prompt_tokens=answer.prompt_tokens,
        cached_tokens=answer.cached_tokens,
        prefill_ms=answer.prefill_ms,
        stage_in_blocks=answer.stage_in_blocks,
        profile=answer.profile,
    )
    logger.info(
        "%s episode %d %s: %s %r",
        method.value,
        episode.seed,
        question.text,
        result.correct,
        answer.text,
    )
    return result


def accuracy(results: Sequence[AgentResult]) -> dict[str, dict[str, float | int | None]]:
    """Per method: accuracy per question type and overall, with counts."""
    out: dict[str, dict[str, float | int | None]] = {}
    for method in dict.fromkeys(r.method for r in results):
        mine = [r for r in results if r.method is method]
        row: dict[str, float | int | None] = {}
        for qtype in QuestionType:
            typed = [r for r in mine if r.qtype is qtype]
            row[qtype.value] = fraction(sum(r.correct for r in typed), len(typed))
        row["all"] = fraction(sum(r.correct for r in mine), len(mine))
        row["correct"] = sum(r.correct for r in mine)
        row["total"] = len(mine)
        out[method.value] = row
    return out


def table(results: Sequence[AgentResult]) -> str:
    acc = accuracy(results)
    rows = [
        [m] + [v[q.value] for q in QuestionType] + [v["all"], f"{v['correct']}/{v['total']}"]
        for m, v in acc.items()
    ]
    return format_table(
        ["method"] + [q.value for q in QuestionType] + ["all", "correct"],
        rows,
        "agent memory accuracy by question type",
    )


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("agent", help="LongMemEval-style synthetic memory accuracy")
    add_engine_arguments(p, DEFAULT_METHODS)
    p.add_argument("--episodes", type=strict_int, default=3, help="episodes (seeds 0..N-1)")
    p.add_argument(
        "--target-tokens",
        type=strict_int,
        default=None,
        help="history length per episode (default: -c minus 512)",
    )
    p.add_argument("--max-tokens", type=strict_int, default=16)
    p.add_argument(
        "--final",
        choices=("user", "tool"),
        default="user",
        help="how a question arrives: as the final user turn, or as a tool result after a "
        "task (an agent loop) (default: user)",
    )
    p.add_argument(
        "--last-n",
        type=strict_int,
        default=None,
        help="tokens the lastn baseline sees (default: --kvmem-budget)",
    )
    p.set_defaults(handler=run)


def run(ns: argparse.Namespace) -> int:
    settings = settings_from_args(ns)
    methods = parse_methods(ns.methods)
    target = ns.target_tokens or settings.n_ctx - 512
    if target + 128 >= settings.n_ctx:
        raise ConfigError(
            "--target-tokens", f"{target} leaves no room for questions in -c {settings.n_ctx}"
        )
    if ns.episodes <= 0:
        raise ConfigError("--episodes", "must be positive")
    last_n = ns.last_n or settings.kvmem.budget
    t0 = time.perf_counter()
    with stderr_bar(ns.progress_bar, desc="agent", unit="question") as bar:
        results = run_agent(
            LlamaEngineFactory(settings),
            methods,
            list(range(ns.episodes)),
            target,
            last_n,
            ns.max_tokens,
            ns.final,
            limits=CompactBudget(settings.kvmem.budget, settings.kvmem.query_max_tokens),
            bar=bar,
        )
    print(table(results))
    payload = {
        "command": "agent",
        "settings": settings.describe()
        | {
            "target_tokens": target,
            "last_n": last_n,
            "episodes": ns.episodes,
            "max_tokens": ns.max_tokens,
            "final": ns.final,
        },
        "machine": machine_description(),
        "accuracy": accuracy(results),
        "results": results,
        "seconds": time.perf_counter() - t0,
    }
    path = write_json(ns.out, "agent.json", payload)
    if path is not None:
        print(f"\nwrote {path}")
    return 0
