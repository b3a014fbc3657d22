"""`--kvmem-harvest-tokens`: complete blocks wait on the GPU and go to the host together.
A harvest is a copy, so when it happens changes nothing a turn computes: the same greedy
tokens, plans and stored bytes as harvesting every decode's blocks at once, with fewer
state reads. Blocks still waiting are harvested before an eviction and at a plan."""

from __future__ import annotations

import io

import pytest

from kvmem.config import KVMemConfig, QuerySource
from kvmem.engine.transfer.transfer_profile import TransferPath

from .helpers import FILLER, GREEDY, make_engine

pytestmark = pytest.mark.slow

FACT = "The vault code of the north wing is 4471-KESTREL."
# state reads per turn, harvesting at once and batched; with the scoring source the first
# turn's scores start inside the prompt's last chunk (recorded ubatch by ubatch), whose
# completed candidate blocks are read then, and the rest of the chunk at its end
READS = {QuerySource.MAIN: ([5, 3], [4, 2]), QuerySource.SCORING: ([5, 1], [4, 1])}
QUESTION = "\nQuestion: what is the vault code of the north wing?\nAnswer: The vault code is"


def _engine(path: str, harvest_tokens: int, source: QuerySource):
    kv = KVMemConfig(
        budget=1024,
        gen_reserve=256,
        harvest_tokens=harvest_tokens,
        query_source=source,
        trace=True,
    )
    return make_engine(path, n_ctx=8192, kvmem=kv, trace=io.StringIO())


def _stored(engine) -> dict[int, bytes]:
    store = engine.session.store
    return {
        b: b"".join(a.tobytes() for a in [*store.get(b).k, *store.get(b).v])
        for b in store.block_ids()
    }


def _turns(engine) -> list[tuple]:
    """Two turns over a document past the budget (the second reuses the first's prefix):
    per turn the tokens, the plan, the blocks staged in, the state reads and the stored
    blocks' bytes."""
    engine.reset()
    doc = FILLER * 24 + FACT + " " + FILLER * 24
    first = engine.tokenize(doc + QUESTION, add_special=True)
    out = []
    for prompt in (first, first + engine.tokenize(" 4471. And the south wing?" + QUESTION)):
        engine.session.transfer.profile.clear()
        tokens = list(engine.generate(prompt, query=None, sampling=GREEDY, max_tokens=6))
        session = engine.session
        gets = session.transfer.profile.paths[TransferPath.STATE_GET].calls
        assert session.window.waiting == []  # the turn's end harvests every block waiting
        assert sorted(session.store.block_ids()) == list(range(session.table.n_complete_blocks))
        out.append(
            (
                tokens,
                session.last_plan.tiers,
                engine.last_turn.stage_in_blocks,
                gets,
                _stored(engine),
            )
        )
    return out


@pytest.mark.parametrize("source", [QuerySource.MAIN, QuerySource.SCORING])
def test_batched_harvests_give_the_turns_of_harvests_at_once(smollm2_path, source):
    """1,024 tokens of blocks wait (two prefill chunks, past the 512-token stream window: a
    chunk's eviction harvests the blocks still waiting first)."""
    got = {}
    for harvest_tokens in (0, 1024):
        engine = _engine(smollm2_path, harvest_tokens, source)
        try:
            got[harvest_tokens] = _turns(engine)
        finally:
            engine.close()
    for at_once, batched in zip(got[0], got[1024], strict=True):
        tokens, tiers, stage_in, _, stored = at_once
        assert (batched[0], batched[1], batched[2]) == (tokens, tiers, stage_in)
        assert batched[4] == stored
    if source is QuerySource.MAIN:  # the plan at the prompt's end brings evicted blocks back
        assert got[0][0][2] > 0
    # every chunk's blocks at once, against one read per two chunks (or an eviction's, a
    # plan's); the scoring source decodes its deferred tail after the plan
    assert ([t[3] for t in got[0]], [t[3] for t in got[1024]]) == READS[source]


def test_under_budget_blocks_wait_for_the_end_of_the_turn(smollm2_path):
    """A prompt that fits: with a bound past it no block is read during the prefill or the
    generation; the turn's end reads them all, the engine's first block alone (its blob
    gives the layout that sizes the pieces), then the rest in one call."""
    prompt_text = FILLER * 27 + QUESTION
    got = {}
    for harvest_tokens in (0, 1 << 20):
        engine = _engine(smollm2_path, harvest_tokens, QuerySource.MAIN)
        try:
            prompt = engine.tokenize(prompt_text, add_special=True)
            assert 640 < len(prompt) < 1024 - 256
            tokens = list(engine.generate(prompt, query=None, sampling=GREEDY, max_tokens=6))
            gets = engine.session.transfer.profile.paths[TransferPath.STATE_GET].calls
            got[harvest_tokens] = (tokens, gets, _stored(engine), engine.last_turn)
        finally:
            engine.close()
    tokens, gets, stored, turn = got[0]
    assert got[1 << 20][0] == tokens and got[1 << 20][2] == stored
    assert (gets, got[1 << 20][1]) == (3, 2)
    assert got[1 << 20][3].harvested_blocks == turn.harvested_blocks == len(stored)
