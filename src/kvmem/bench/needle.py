"""`kvmem-bench needle`: pass-key recall at several depths and lengths, per method.

Every method answers the same prompts (greedy, at most `--max-tokens` tokens after an
answer prefix such as "The pass key is"); an answer is correct when the expected digits
appear in it.

`--oracle` separates ranking from context effects: before each KVMem case the needle's
token span (located in the rendered prompt) is set as the session's `force_spans`, so
every reselection of that turn keeps the needle's block(s) in the window; it is reset to
() after the case. If the model then answers, a miss without the oracle is a ranking miss.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvmem.bench.compact_prompts import (
    CompactBudget,
    chat_prompt,
    raw_prompt,
    raw_render,
    raw_span_of,
)
from kvmem.bench.conversation import (
    PromptRenderer,
    RenderedPrompt,
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
from kvmem.bench.needle_data import Layout, NeedleCase, NeedleKind, NeedleSpec, build_case
from kvmem.bench.oracle import check_oracle_hook, forced_spans
from kvmem.bench.report import format_table, fraction, machine_description, write_json
from kvmem.cli.kvmem_flags import strict_int
from kvmem.cli.progress_bar import stderr_bar
from kvmem.errors import ConfigError
from kvmem.memory.spans import TokenSpan

logger = logging.getLogger(__name__)

DEFAULT_METHODS = (Method.FULL, Method.RETRIEVAL, Method.RECENCY)


@dataclass(frozen=True, slots=True)
class NeedleGrid:
    kinds: tuple[NeedleKind, ...]
    layouts: tuple[Layout, ...]
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    seeds: tuple[int, ...]

    def specs(self) -> list[NeedleSpec]:
        return [
            NeedleSpec(kind, layout, length, depth, seed)
            for kind in self.kinds
            for layout in self.layouts
            for length in self.lengths
            for seed in self.seeds
            for depth in self.depths
        ]


@dataclass(slots=True)
class NeedleResult:
    method: Method
    kind: NeedleKind
    layout: Layout
    length: int
    depth: float
    seed: int
    prompt_tokens: int
    cached_tokens: int  # reused from the previous case's history
    expected: str
    answer: str
    correct: bool
    prefill_ms: float
    decode_ms: float
    stage_in_blocks: int
    replayed_tokens: int
    profile: dict[str, float] = field(default_factory=dict)
    needle_span: tuple[int, int] | None = None  # the needle's tokens [start, end) in the prompt
    oracle: bool = False  # the needle's span was forced into the window


def is_correct(answer: str, expected: str) -> bool:
    return expected in answer


def even_depths(n: int) -> tuple[float, ...]:
    """n depths spread evenly over [0, 1] (both ends included)."""
    if n <= 0:
        raise ConfigError("--depths", f"must be positive, got {n}")
    if n == 1:
        return (0.5,)
    return tuple(round(i / (n - 1), 4) for i in range(n))


def build_prompts(
    specs: Sequence[NeedleSpec], engine: BenchEngine
) -> list[tuple[NeedleCase, RenderedPrompt, TokenSpan | None]]:
    """Each case rendered, with its needle's token span (None: not found in the prompt)."""
    renderer = make_renderer(engine)
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = cache[text] = len(engine.tokenize(text, parse_special=False))
        return n

    out = []
    for spec in specs:
        case = build_case(spec, count)
        if spec.layout is Layout.RAW:
            raw = raw_render(engine, [m.content for m in case.messages], case.answer_prefix)
            out.append((case, raw, raw_span_of(engine, raw, case.needle)))
            continue
        prompt = renderer.render(case.messages, answer_prefix=case.answer_prefix, tools=case.tools)
        span = renderer.span_of(case.messages, prompt, case.needle, case.tools)
        out.append((case, prompt, span))
    return out


def shown_prompt(
    engine: BenchEngine,
    renderer: PromptRenderer,
    method: Method,
    case: NeedleCase,
    prompt: RenderedPrompt,
    last_n: int,
    limits: CompactBudget | None,
) -> RenderedPrompt:
    """What `method` is shown of a case: lastn's tail, compact-rag's compacted prompt
    (within `limits`), else the whole prompt."""
    if method is Method.LAST_N:
        return last_tokens_only(prompt, last_n)
    if method is not Method.COMPACT_RAG:
        return prompt
    if limits is None:
        raise ConfigError("--methods", "compact-rag needs the KVMem budget it compacts into")
    if case.spec.layout is Layout.RAW:
        parts = [m.content for m in case.messages]
        return raw_prompt(engine, parts, prompt, limits, answer_prefix=case.answer_prefix).prompt
    return chat_prompt(
        engine,
        renderer,
        case.messages,
        prompt,
        limits,
        tools=case.tools,
        answer_prefix=case.answer_prefix,
    ).prompt


def run_needle(
    factory: EngineFactory,
    methods: Sequence[Method],
    specs: Sequence[NeedleSpec],
    last_n: int,
    max_tokens: int,
    progress: Callable[[NeedleResult], None] | None = None,
    reset_each_case: bool = False,
    n_ctx: int | None = None,
    oracle: bool = False,
    limits: CompactBudget | None = None,
) -> list[NeedleResult]:
    """Ask every case of `specs` with every method, in the order of `specs`.

    Unless `reset_each_case`, the session keeps its history between cases and reuses the
    common prefix, as a server would (compact-rag's prompts, which differ from the first
    kept chunk on, are mostly processed anew): cases of one haystack (same layout, length and
    seed) differ only from the first needle on, so order them by depth (`NeedleGrid.specs`
    does) to reprocess as little as possible.

    With `oracle`, each KVMem method's session is told to keep the needle's span in the
    window for its case (`force_spans`); full context and lastn run as without it.
    """
    results: list[NeedleResult] = []
    prompts: list[tuple[NeedleCase, RenderedPrompt, TokenSpan | None]] | None = None
    for method in methods:
        engine = factory.open(method.engine_method)
        try:
            renderer = make_renderer(engine)
            if prompts is None:
                prompts = build_prompts(specs, engine)
                if n_ctx is not None:
                    check_fit(prompts, n_ctx, max_tokens)
                if oracle:
                    check_spans(prompts)
            forcing = oracle and method.uses_kvmem
            if forcing:
                check_oracle_hook(engine)
            engine.reset()
            for case, prompt, span in prompts:
                if reset_each_case:
                    engine.reset()
                shown = shown_prompt(engine, renderer, method, case, prompt, last_n, limits)
                with forced_spans(engine, (span,) if forcing and span is not None else ()):
                    answer = ask(engine, shown, max_tokens)
                spec = case.spec
                result = NeedleResult(
                    method=method,
                    kind=spec.kind,
                    layout=spec.layout,
                    length=spec.length,
                    depth=spec.depth,
                    seed=spec.seed,
                    prompt_tokens=len(prompt.tokens),
                    cached_tokens=answer.cached_tokens,
                    expected=case.expected,
                    answer=answer.text,
                    correct=is_correct(answer.text, case.expected),
                    prefill_ms=answer.prefill_ms,
                    decode_ms=answer.decode_ms,
                    stage_in_blocks=answer.stage_in_blocks,
                    replayed_tokens=answer.replayed_tokens,
                    profile=answer.profile,
                    needle_span=(span.start, span.end) if span is not None else None,
                    oracle=forcing,
                )
                results.append(result)
                if progress is not None:
                    progress(result)
        finally:
            engine.close()
    return results


def check_spans(prompts: Sequence[tuple[NeedleCase, RenderedPrompt, TokenSpan | None]]) -> None:
    """The oracle needs every needle's span: refuse the grid before the first case if one
    was not found in its rendered prompt."""
    for case, _, span in prompts:
        if span is None:
            s = case.spec
            raise ConfigError(
                "--oracle",
                f"the needle of the {s.kind.value}/{s.layout.value} case of length {s.length} "
                f"(depth {s.depth:.2f}, seed {s.seed}) is not in its rendered prompt",
            )


def check_fit(
    prompts: Sequence[tuple[NeedleCase, RenderedPrompt, TokenSpan | None]],
    n_ctx: int,
    max_tokens: int,
) -> None:
    """Refuse the grid before the first case if a rendered case cannot fit -c."""
    for case, prompt, _ in prompts:
        if len(prompt.tokens) + max_tokens > n_ctx:
            s = case.spec
            raise ConfigError(
                "--lengths",
                f"the {s.kind.value}/{s.layout.value} case of length {s.length} (depth "
                f"{s.depth:.2f}, seed {s.seed}) renders to {len(prompt.tokens)} tokens; "
                f"with --max-tokens {max_tokens} it does not fit -c {n_ctx}",
            )


Group = tuple[NeedleKind, Layout, int]


def accuracy_cells(
    results: Sequence[NeedleResult],
) -> dict[tuple[Method, Group, float], tuple[int, int]]:
    """(method, (kind, layout, length), depth) -> (correct, total)."""
    cells: dict[tuple[Method, Group, float], list[int]] = defaultdict(lambda: [0, 0])
    for r in results:
        cell = cells[(r.method, (r.kind, r.layout, r.length), r.depth)]
        cell[0] += int(r.correct)
        cell[1] += 1
    return {k: (v[0], v[1]) for k, v in cells.items()}


def summary(results: Sequence[NeedleResult]) -> dict[str, dict[str, object]]:
    """Per method: overall accuracy and accuracy by depth."""
    out: dict[str, dict[str, object]] = {}
    for method in dict.fromkeys(r.method for r in results):
        mine = [r for r in results if r.method is method]
        by_depth: dict[float, list[int]] = defaultdict(lambda: [0, 0])
        for r in mine:
            by_depth[r.depth][0] += int(r.correct)
            by_depth[r.depth][1] += 1
        out[method.value] = {
            "correct": sum(r.correct for r in mine),
            "total": len(mine),
            "accuracy": fraction(sum(r.correct for r in mine), len(mine)),
            "by_depth": {f"{d:g}": fraction(c, n) for d, (c, n) in sorted(by_depth.items())},
        }
    return out


def tables(results: Sequence[NeedleResult]) -> str:
    cells = accuracy_cells(results)
    methods = list(dict.fromkeys(r.method for r in results))
    groups = list(dict.fromkeys((r.kind, r.layout, r.length) for r in results))
    depths = sorted({r.depth for r in results})
    parts = []
    for kind, layout, length in groups:
        rows = []
        for depth in depths:
            row: list[object] = [f"{depth:g}"]
            for m in methods:
                c, n = cells.get((m, (kind, layout, length), depth), (0, 0))
                row.append(f"{c}/{n}" if n else None)
            rows.append(row)
        totals: list[object] = ["all"]
        for m in methods:
            c = sum(v[0] for k, v in cells.items() if k[0] is m and k[1] == (kind, layout, length))
            n = sum(v[1] for k, v in cells.items() if k[0] is m and k[1] == (kind, layout, length))
            totals.append(f"{c}/{n}")
        rows.append(totals)
        title = (
            f"needle {kind.value}, {layout.value} layout, ~{length} tokens: correct/total by depth"
        )
        parts.append(format_table(["depth"] + [m.value for m in methods], rows, title))
    return "\n\n".join(parts)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("needle", help="pass-key recall by depth and length, per method")
    add_engine_arguments(p, DEFAULT_METHODS)
    p.add_argument("--kinds", default="passkey", help="passkey,multikey")
    p.add_argument(
        "--layouts",
        default="document",
        help="document,tools,agent,raw (agent: the final message is a tool result; raw: a "
        "completion prompt without the chat template)",
    )
    p.add_argument("--lengths", default="6144", help="comma-separated target prompt tokens")
    p.add_argument("--depths", type=strict_int, default=10, help="number of depths in [0, 1]")
    p.add_argument("--seeds", type=strict_int, default=3, help="seeds per cell")
    p.add_argument(
        "--first-seed",
        type=strict_int,
        default=0,
        help="seeds are FIRST..FIRST+N-1 (to split a grid over processes)",
    )
    p.add_argument("--max-tokens", type=strict_int, default=12)
    p.add_argument(
        "--last-n",
        type=strict_int,
        default=None,
        help="tokens the lastn baseline sees (default: --kvmem-budget)",
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--reset-each-case",
        action="store_true",
        help="process every case from scratch (default: reuse the common prefix of consecutive cases)",
    )
    p.add_argument(
        "--oracle",
        action="store_true",
        help="force each needle's block(s) into the KVMem window (ranking vs context diagnosis)",
    )
    p.set_defaults(handler=run)


def _enum_list(enum: type, text: str, flag: str) -> tuple:
    try:
        return tuple(enum(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(flag, f"invalid value in {text!r}") from None


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(flag, f"invalid number list {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(flag, f"needs positive numbers, got {text!r}")
    return values


def run(ns: argparse.Namespace) -> int:
    settings = settings_from_args(ns)
    methods = parse_methods(ns.methods)
    grid = NeedleGrid(
        kinds=_enum_list(NeedleKind, ns.kinds, "--kinds"),
        layouts=_enum_list(Layout, ns.layouts, "--layouts"),
        lengths=_int_list(ns.lengths, "--lengths"),
        depths=even_depths(ns.depths),
        seeds=tuple(range(ns.first_seed, ns.first_seed + ns.seeds)),
    )
    if max(grid.lengths) + ns.max_tokens + 64 > settings.n_ctx:
        raise ConfigError("--lengths", f"{max(grid.lengths)} tokens do not fit -c {settings.n_ctx}")
    last_n = ns.last_n or settings.kvmem.budget
    t0 = time.perf_counter()
    done: list[NeedleResult] = []

    def payload(results: list[NeedleResult], plots: list[str], complete: bool) -> dict:
        return {
            "command": "needle",
            "complete": complete,  # False: a checkpoint of a run still going (or stopped)
            "settings": settings.describe()
            | {
                "last_n": last_n,
                "max_tokens": ns.max_tokens,
                "reset_each_case": ns.reset_each_case,
                "oracle": ns.oracle,
            },
            "machine": machine_description(),
            "grid": grid,
            "summary": summary(results),
            "cases": results,
            "plots": plots,
            "seconds": time.perf_counter() - t0,
        }

    total = len(methods) * len(grid.specs())
    bar = stderr_bar(ns.progress_bar, total=total, desc="needle", unit="case")

    def progress(r: NeedleResult) -> None:
        bar.update()
        logger.info(
            "[%d/%d] %s %s/%s %d d=%.2f seed=%d%s: %s %r (%d tokens, %d cached, stage-in %d)",
            len(done) + 1,
            total,
            r.method.value,
            r.kind.value,
            r.layout.value,
            r.length,
            r.depth,
            r.seed,
            " oracle" if r.oracle else "",
            "ok" if r.correct else "MISS",
            r.answer,
            r.prompt_tokens,
            r.cached_tokens,
            r.stage_in_blocks,
        )
        done.append(r)
        write_json(ns.out, "needle.json", payload(done, [], complete=False))

    with bar:
        results = run_needle(
            LlamaEngineFactory(settings),
            methods,
            grid.specs(),
            last_n,
            ns.max_tokens,
            progress=progress,
            reset_each_case=ns.reset_each_case,
            n_ctx=settings.n_ctx,
            oracle=ns.oracle,
            limits=CompactBudget(settings.kvmem.budget, settings.kvmem.query_max_tokens),
        )
    print(tables(results))
    plots: list[str] = []
    if ns.out and not ns.no_plots:
        from kvmem.bench.heatmap import plot_needle_heatmaps

        plots = [str(p) for p in plot_needle_heatmaps(results, ns.out)]
    path = write_json(ns.out, "needle.json", payload(results, plots, complete=True))
    if path is not None:
        print(f"\nwrote {path}" + (f" and {len(plots)} heatmaps" if plots else ""))
    return 0
