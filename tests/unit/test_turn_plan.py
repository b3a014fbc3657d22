"""TurnPlan: the turn's decisions from the request and the history alone (no llama_cpp)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvmem.config import CellOrder, KVMemConfig, QueryPolicy, QueryReplay
from kvmem.engine.query.source_kind import SourceKind
from kvmem.engine.session.turn_plan import ChunkGrid, TurnInputs, plan_turn
from kvmem.engine.session.window_plans import StreamAt, stream_keep
from kvmem.memory.spans import PromptSpans, TokenSpan

CONFIG = KVMemConfig(block_tokens=32, budget=256, query_max_tokens=64)
SPANS = PromptSpans(
    control=TokenSpan(0, 40),
    query=TokenSpan(300, 380),
    trajectory=TokenSpan(380, 500),
    live=TokenSpan(380, 500),
)


def _inputs(**changes) -> TurnInputs:
    base = dict(
        n=500,
        given=SPANS,
        common=0,
        frontier=None,
        config=CONFIG,
        source=SourceKind.MAIN,
        hybrid=False,
    )
    base.update(changes)
    return TurnInputs(**base)


def _ranks(answer: bool, asked: list[int] | None = None):
    def ranks(spans: PromptSpans, end: int) -> bool:
        if asked is not None:
            asked.append(end)
        return answer

    return ranks


def _no_lack(span: TokenSpan, reused: int) -> int | None:
    return None


def test_main_source_agent_policy_wants_the_task_and_the_trajectory_tail() -> None:
    plan = plan_turn(_inputs(common=200), _ranks(True), _no_lack)
    assert plan.spans == SPANS
    assert plan.wanted == (TokenSpan(316, 380), TokenSpan(436, 500))
    assert (plan.common, plan.reused, plan.tail, plan.end) == (200, 200, None, 500)


def test_the_lexical_query_is_the_task_and_the_last_message_not_the_trajectory() -> None:
    given = PromptSpans(SPANS.control, SPANS.query, SPANS.trajectory, live=TokenSpan(470, 500))
    plan = plan_turn(_inputs(given=given), _ranks(True), _no_lack)
    assert plan.wanted == (TokenSpan(316, 380), TokenSpan(436, 500))
    assert plan.lexical == (TokenSpan(316, 380), TokenSpan(470, 500))
    user_last = PromptSpans(SPANS.control, TokenSpan(300, 500), live=TokenSpan(300, 500))
    assert plan_turn(_inputs(given=user_last), _ranks(True), _no_lack).lexical == (
        TokenSpan(436, 500),  # the task is the last message: one span
    )


def test_the_cut_is_below_the_last_token_and_at_the_frontier() -> None:
    whole = plan_turn(_inputs(common=500), _ranks(False), _no_lack)
    assert (whole.common, whole.reused) == (499, 499)
    cut = plan_turn(_inputs(common=450, frontier=320), _ranks(False), _no_lack)
    assert (cut.common, cut.reused) == (450, 320)


def test_tail_policy_and_a_prompt_without_a_task_score_the_prompts_tail() -> None:
    tail = TokenSpan(436, 500)
    config = KVMemConfig(
        block_tokens=32, budget=256, query_max_tokens=64, query_policy=QueryPolicy.TAIL
    )
    plan = plan_turn(_inputs(config=config), _ranks(True), _no_lack)
    assert plan.spans == PromptSpans(SPANS.control, tail, SPANS.trajectory, SPANS.live)
    assert plan.wanted == (tail,)
    bare = plan_turn(_inputs(given=PromptSpans()), _ranks(True), _no_lack)
    assert bare.spans == PromptSpans(None, tail, None, tail)
    assert bare.wanted == (tail,)
    assert (plan.lexical, bare.lexical) == ((tail,), (tail,))


def test_main_source_restarts_where_a_wanted_spans_rows_are_missing() -> None:
    lacking = {TokenSpan(316, 380): 340, TokenSpan(436, 500): None}
    plan = plan_turn(_inputs(common=390), _ranks(True), lambda s, r: lacking[s])
    assert plan.reused == 340
    too_far = {TokenSpan(316, 380): 100, TokenSpan(436, 500): None}
    kept = plan_turn(_inputs(common=390), _ranks(True), lambda s, r: too_far[s])
    assert kept.reused == 390  # more than --kvmem-query-max-tokens back: goes without
    unranked = plan_turn(_inputs(common=390), _ranks(False), lambda s, r: lacking[s])
    assert unranked.reused == 390


def test_scoring_source_defers_the_block_aligned_tail_and_wants_nothing_unranked() -> None:
    asked: list[int] = []
    plan = plan_turn(_inputs(source=SourceKind.SCORING, common=450), _ranks(True, asked), _no_lack)
    # max(live start 380, n - pinned query 64, 1) = 436, down to a block: 416
    assert CONFIG.query_pin_tokens == 64
    assert (plan.tail, plan.end, plan.reused) == (416, 416, 416)
    assert plan.wanted == (TokenSpan(316, 380), TokenSpan(436, 500))
    assert asked == [416]
    unranked = plan_turn(_inputs(source=SourceKind.SCORING), _ranks(False), _no_lack)
    assert unranked.wanted == ()


def test_no_deferred_tail_within_budget_on_a_hybrid_with_images_or_replay_off() -> None:
    scoring = dict(source=SourceKind.SCORING)
    cases = [
        _inputs(n=200, given=PromptSpans(query=TokenSpan(100, 150)), **scoring),
        _inputs(hybrid=True, **scoring),
        _inputs(given=PromptSpans(SPANS.control, SPANS.query, groups=(TokenSpan(50, 90),))),
        _inputs(
            config=KVMemConfig(
                block_tokens=32, budget=256, query_max_tokens=64, query_replay=QueryReplay.OFF
            ),
            **scoring,
        ),
        _inputs(),  # the main source keeps the tail: its rows come from the prefill
    ]
    assert [plan_turn(i, _ranks(True), _no_lack).tail for i in cases] == [None] * 5


def test_no_source_wants_nothing() -> None:
    plan = plan_turn(_inputs(source=SourceKind.NONE, common=100), _ranks(True), _no_lack)
    assert (plan.wanted, plan.lexical, plan.reused, plan.tail) == ((), (), 100, None)


def test_chunk_grid_is_block_aligned_and_leaves_room_for_the_window() -> None:
    assert ChunkGrid.of(CONFIG, n_batch=512, capacity=320) == ChunkGrid(192, 192)
    assert ChunkGrid.of(CONFIG, n_batch=100, capacity=1000) == ChunkGrid(96, 96)
    # a batch smaller than a block: the largest divisor of the block that fits
    assert ChunkGrid.of(CONFIG, n_batch=12, capacity=1000) == ChunkGrid(8, 32)
    off = KVMemConfig(enabled=False, block_tokens=32)
    assert ChunkGrid.of(off, n_batch=512, capacity=300) == ChunkGrid(300, 300)


def test_the_chunk_is_capped_by_kvmem_chunk_tokens_so_the_stream_gets_the_rest() -> None:
    """The server's -b 2048 prefills in chunks of --kvmem-chunk-tokens (512) with KVMem on,
    so at -c 32768 --kvmem-budget 4096 --kvmem-gen-reserve 512 a chunk over the budget
    leaves 4,096 cells for its stream window; without KVMem -b rules alone."""
    protocol = KVMemConfig(budget=4096, gen_reserve=512)
    assert ChunkGrid.of(protocol, n_batch=2048, capacity=4608) == ChunkGrid(512, 512)
    assert ChunkGrid.of(protocol, 2048, 4608, n_ctx=32768) == ChunkGrid(512, 512)
    # a context that never exceeds the budget never streams: -b rules
    assert ChunkGrid.of(protocol, 2048, 4608, n_ctx=4096) == ChunkGrid(2048, 2048)
    assert ChunkGrid.of(protocol, n_batch=256, capacity=4608) == ChunkGrid(256, 256)
    wide = KVMemConfig(budget=4096, gen_reserve=512, chunk_tokens=2048)
    assert ChunkGrid.of(wide, n_batch=2048, capacity=4608) == ChunkGrid(2048, 2048)
    assert ChunkGrid.of(KVMemConfig(chunk_tokens=200), 2048, 4608) == ChunkGrid(128, 128)
    off = KVMemConfig(enabled=False)
    assert ChunkGrid.of(off, n_batch=2048, capacity=4608) == ChunkGrid(2048, 2048)


def test_the_default_stream_is_all_the_room_a_chunk_leaves() -> None:
    """-1: the stream bound is the window's whole capacity, so the stream window takes
    every cell the chunk leaves (the sink, the control tier and the newest blocks)."""
    config = KVMemConfig(budget=4096, gen_reserve=512)
    assert config.tier_tokens()["stream"] == 4608
    assert KVMemConfig(budget=4096, stream_tokens=1024).tier_tokens()["stream"] == 1024


def test_a_canonical_cell_order_resumes_a_prefill_at_a_fresh_prefills_chunk() -> None:
    """With --kvmem-cell-order canonical the reused prefix ends where a fresh prefill's
    chunk starts, so a resumed prefill decodes the chunks and ubatches a fresh one did, on
    the cells it had; free reuses every token."""
    grid = ChunkGrid(896, 896, ubatch=512)
    assert [grid.chunk_start(p) for p in (0, 511, 512, 895, 896, 1407, 1408, 1900)] == [
        *(0, 0, 0, 0, 896, 896, 896, 1792)
    ]
    canonical = KVMemConfig(
        block_tokens=32, budget=256, query_max_tokens=64, cell_order=CellOrder.CANONICAL
    )
    grid = ChunkGrid(192, 192, ubatch=64)
    inputs = _inputs(common=300, config=canonical, source=SourceKind.NONE, grid=grid)
    assert plan_turn(inputs, _ranks(True), _no_lack).reused == 192
    free = _inputs(common=300, source=SourceKind.NONE, grid=grid)
    assert plan_turn(free, _ranks(True), _no_lack).reused == 300


def test_a_context_within_the_budget_prefills_in_whole_chunks_below_the_protected_tiers() -> None:
    # -c 256 with 128-token blocks: sink + recent + 1 = 512 tokens exceed the capacity,
    # which used to leave chunks of one token (71 progress events for 70 tokens)
    default = KVMemConfig()
    assert ChunkGrid.of(default, n_batch=64, capacity=256) == ChunkGrid(1, 128)
    assert ChunkGrid.of(default, n_batch=64, capacity=256, n_ctx=256) == ChunkGrid(64, 128)
    assert ChunkGrid.of(default, n_batch=2048, capacity=256, n_ctx=256) == ChunkGrid(256, 256)
    # 300 cells: a 256-token chunk at 256 would leave no room for the first two blocks
    assert ChunkGrid.of(default, n_batch=512, capacity=300, n_ctx=300) == ChunkGrid(32, 128)
    # over the budget the protected tiers rule as before
    small = KVMemConfig(block_tokens=32, budget=96, gen_reserve=32, sink_blocks=1, recent_blocks=1)
    assert ChunkGrid.of(small, n_batch=64, capacity=128, n_ctx=4096) == ChunkGrid(32, 32)
    # and a chunk that already fits a block is unchanged
    assert ChunkGrid.of(default, n_batch=512, capacity=4096, n_ctx=4096) == ChunkGrid(512, 512)


@settings(max_examples=300, deadline=None)
@given(
    bt=st.sampled_from([16, 32, 64, 128]),
    n_batch=st.integers(1, 1024),
    n_ctx=st.integers(1, 700),
)
def test_whole_context_chunks_keep_every_block_in_every_stream_window(
    bt: int, n_batch: int, n_ctx: int
) -> None:
    """Reference: try every aligned chunk; the chosen one is the largest whose every
    chunk start's stream window (the real planner) holds the whole history."""
    config = KVMemConfig(  # no --kvmem-chunk-tokens cap below any batch drawn here
        block_tokens=bt,
        budget=max(n_ctx, 3 * bt),
        sink_blocks=1,
        recent_blocks=1,
        chunk_tokens=1024,
    )
    capacity = n_ctx
    grid = ChunkGrid.of(config, n_batch, capacity, n_ctx)

    def keeps_all(chunk: int) -> bool:
        step = max(chunk, bt)
        return all(
            stream_keep(config, StreamAt(s, PromptSpans(), capacity - chunk, step))
            == set(range(s // bt))
            for s in range(0, n_ctx, step)
        )

    aligned = [c for c in range(1, min(n_batch, capacity) + 1) if c % bt == 0 or bt % c == 0]
    fitting = [c for c in aligned if keeps_all(c)]
    protected = 3 * bt
    old = ChunkGrid.of(config, n_batch, capacity).chunk_tokens
    expected = max([old, *fitting]) if old < bt else old
    assert grid.chunk_tokens == expected, (grid, fitting, old)
    assert keeps_all(grid.chunk_tokens) or grid.chunk_tokens == old
    assert capacity - protected < bt or grid.chunk_tokens == old
