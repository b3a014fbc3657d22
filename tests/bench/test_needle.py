"""Needle cases, scoring, tables, heatmaps and the command, with fake engines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from kvmem.bench import needle
from kvmem.bench.conversation import ChatMLRenderer, Role
from kvmem.bench.engines import Method
from kvmem.bench.heatmap import accuracy_grid
from kvmem.bench.main import main
from kvmem.bench.needle import (
    NeedleResult,
    accuracy_cells,
    even_depths,
    run_needle,
    summary,
    tables,
)
from kvmem.bench.needle_data import (
    Layout,
    NeedleCase,
    NeedleKind,
    NeedleSpec,
    build_case,
    needle_sentence,
)
from kvmem.errors import ConfigError
from tests.fakes.bench import CharTokenizer, FakeFactory


def count(text: str) -> int:
    return len(text)


def spec(
    depth: float,
    kind: NeedleKind = NeedleKind.PASSKEY,
    layout: Layout = Layout.DOCUMENT,
    length: int = 3000,
    seed: int = 0,
) -> NeedleSpec:
    return NeedleSpec(kind, layout, length, depth, seed)


def test_even_depths() -> None:
    assert even_depths(1) == (0.5,)
    assert even_depths(3) == (0.0, 0.5, 1.0)
    assert even_depths(10)[1] == 0.1111 and len(even_depths(10)) == 10


def test_document_case_places_the_needle_at_its_depth() -> None:
    first = build_case(spec(0.0), count)
    last = build_case(spec(1.0), count)
    assert first == build_case(spec(0.0), count)  # deterministic
    assert [m.role for m in first.messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.USER]
    sentence = needle_sentence(first.expected, None)
    doc = first.messages[1].content
    assert doc.startswith("Read this document carefully.\n\n" + sentence + " ")
    assert last.messages[1].content.endswith(" " + needle_sentence(last.expected, None))
    assert first.messages[3].content == "What is the pass key? Answer with the number only."
    assert first.answer_prefix == "The pass key is"

    # same haystack for every depth: removing the needle gives the same document
    def strip(case: NeedleCase) -> str:
        sentence = needle_sentence(case.expected, None)
        return case.messages[1].content.replace(" " + sentence, "").replace(sentence + " ", "")

    assert strip(first) == strip(last)
    prompt = ChatMLRenderer(CharTokenizer()).render(
        first.messages, answer_prefix=first.answer_prefix
    )
    assert 2990 <= len(prompt.tokens) <= 3100


def test_multikey_case_has_four_vaults_and_asks_for_one() -> None:
    case = build_case(spec(0.5, kind=NeedleKind.MULTIKEY), count)
    doc = case.messages[1].content
    assert doc.count("Remember it.") == 4
    vault = case.answer_prefix.split("the ")[1].split(" vault")[0]
    assert (
        case.messages[3].content
        == f"What is the pass key for the {vault} vault? Answer with the number only."
    )
    assert needle_sentence(case.expected, vault) in doc


def test_tools_case_hides_the_needle_in_a_tool_result() -> None:
    case = build_case(spec(0.5, layout=Layout.TOOLS, length=4000), count)
    holders = [m for m in case.messages if needle_sentence(case.expected, None) in m.content]
    assert len(holders) == 1 and holders[0].role is Role.TOOL
    roles = [m.role for m in case.messages]
    assert roles[:2] == [Role.SYSTEM, Role.USER] and roles[-1] is Role.USER
    assert roles[2:-2] == [Role.ASSISTANT, Role.TOOL] * ((len(roles) - 4) // 2)
    prompt = ChatMLRenderer(CharTokenizer()).render(case.messages, answer_prefix=case.answer_prefix)
    assert 4000 <= len(prompt.tokens) <= 4500


def test_run_needle_scores_what_each_method_sees() -> None:
    specs = [spec(d) for d in (0.0, 0.5, 1.0)]
    factory = FakeFactory({Method.FULL: None, Method.RECENCY: 800}, sink=200)
    results = run_needle(
        factory, [Method.FULL, Method.RECENCY, Method.LAST_N], specs, last_n=600, max_tokens=12
    )
    got = [(r.method, r.depth, r.correct) for r in results]
    assert got == [
        (Method.FULL, 0.0, True),
        (Method.FULL, 0.5, True),
        (Method.FULL, 1.0, True),
        (Method.RECENCY, 0.0, True),
        (Method.RECENCY, 0.5, False),
        (Method.RECENCY, 1.0, True),
        (Method.LAST_N, 0.0, False),
        (Method.LAST_N, 0.5, False),
        (Method.LAST_N, 1.0, True),
    ]
    assert all(e.closed for e in factory.opened)
    assert [e.resets for e in factory.opened] == [1, 1, 1]
    # consecutive cases share the haystack up to the earlier needle: its prefix is reused
    assert results[0].cached_tokens == 0
    assert 40 < results[1].cached_tokens < 150  # the needle at depth 0 sits near the start
    assert 1200 < results[2].cached_tokens < 1800  # the previous needle sat in the middle
    assert [e.method for e in factory.opened] == [Method.FULL, Method.RECENCY, Method.FULL]
    lastn = factory.opened[2].prompts
    assert all(len(p) == 600 for p in lastn)
    assert results[0].answer == f" {results[0].expected}."
    assert results[4].answer == " I do not know."[:12]


def _result(method: Method, depth: float, length: int, correct: bool) -> NeedleResult:
    return NeedleResult(
        method=method,
        kind=NeedleKind.PASSKEY,
        layout=Layout.DOCUMENT,
        length=length,
        depth=depth,
        seed=0,
        prompt_tokens=length,
        cached_tokens=0,
        expected="1",
        answer="1" if correct else "",
        correct=correct,
        prefill_ms=1.0,
        decode_ms=1.0,
        stage_in_blocks=0,
        replayed_tokens=0,
    )


RESULTS = [
    _result(Method.FULL, 0.0, 100, True),
    _result(Method.FULL, 1.0, 100, True),
    _result(Method.FULL, 0.0, 200, True),
    _result(Method.FULL, 1.0, 200, False),
    _result(Method.RECENCY, 0.0, 100, False),
    _result(Method.RECENCY, 1.0, 100, True),
    _result(Method.RECENCY, 0.0, 200, False),
    _result(Method.RECENCY, 1.0, 200, True),
]


def test_summary_and_cells() -> None:
    cells = accuracy_cells(RESULTS)
    assert cells[(Method.FULL, (NeedleKind.PASSKEY, Layout.DOCUMENT, 200), 1.0)] == (0, 1)
    assert summary(RESULTS) == {
        "full": {"correct": 3, "total": 4, "accuracy": 0.75, "by_depth": {"0": 1.0, "1": 0.5}},
        "recency": {"correct": 2, "total": 4, "accuracy": 0.5, "by_depth": {"0": 0.0, "1": 1.0}},
    }


def test_tables_text() -> None:
    text = tables(RESULTS[:2] + RESULTS[4:6])
    assert text == (
        "needle passkey, document layout, ~100 tokens: correct/total by depth\n"
        "depth  full  recency\n"
        "-----  ----  -------\n"
        "0       1/1      0/1\n"
        "1       1/1      1/1\n"
        "all     2/2      1/2"
    )


def test_accuracy_grid_matches_a_plain_loop() -> None:
    depths, lengths = [0.0, 1.0], [100, 200, 300]
    grid = accuracy_grid([r for r in RESULTS if r.method is Method.FULL], depths, lengths)
    expected = np.full((2, 3), np.nan)
    for i, d in enumerate(depths):
        for j, n in enumerate(lengths):
            cell = [
                r.correct
                for r in RESULTS
                if r.method is Method.FULL and r.depth == d and r.length == n
            ]
            if cell:
                expected[i, j] = sum(cell) / len(cell)
    np.testing.assert_array_equal(grid, expected)


def test_command_writes_json_and_heatmaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = FakeFactory(
        {Method.FULL: None, Method.RETRIEVAL: None, Method.RECENCY: 500}, sink=200
    )
    monkeypatch.setattr(needle, "LlamaEngineFactory", lambda settings: factory)
    rc = main(
        [
            "needle",
            "--lengths",
            "1500,2500",
            "--depths",
            "3",
            "--seeds",
            "1",
            "--kinds",
            "passkey,multikey",
            "--layouts",
            "document,tools",
            "--out",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "needle multikey, tools layout, ~2500 tokens" in out
    doc = json.loads((tmp_path / "needle.json").read_text())
    assert doc["command"] == "needle" and doc["complete"] is True
    assert set(doc) >= {"settings", "machine", "grid", "summary", "cases", "plots", "seconds"}
    assert doc["settings"]["budget"] == 1024 and doc["settings"]["last_n"] == 1024
    assert len(doc["cases"]) == 3 * 2 * 2 * 2 * 3
    assert doc["summary"]["full"]["accuracy"] == 1.0
    assert doc["summary"]["retrieval"]["accuracy"] == 1.0
    assert 0.0 < doc["summary"]["recency"]["accuracy"] < 1.0
    case = doc["cases"][0]
    assert set(case) == {
        "method",
        "kind",
        "layout",
        "length",
        "depth",
        "seed",
        "prompt_tokens",
        "cached_tokens",
        "expected",
        "answer",
        "correct",
        "prefill_ms",
        "decode_ms",
        "stage_in_blocks",
        "replayed_tokens",
        "profile",
        "needle_span",
        "oracle",
    }
    assert case["oracle"] is False and case["needle_span"][1] > case["needle_span"][0]
    for method in ("full", "retrieval", "recency"):
        assert (tmp_path / f"needle_{method}.png").stat().st_size > 1000


def test_command_draws_a_case_bar_only_when_forced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    factory = FakeFactory({Method.FULL: None, Method.RECENCY: 500}, sink=200)
    monkeypatch.setattr(needle, "LlamaEngineFactory", lambda settings: factory)
    args = ["needle", "--methods", "full,recency", "--lengths", "1500", "--depths", "3"]
    args += ["--seeds", "1", "--kinds", "passkey", "--layouts", "document", "--no-plots"]
    assert main(["--progress-bar", *args]) == 0
    err = capsys.readouterr().err
    done = [int(n) for n in re.findall(r"needle:\s+\d+%\|[^|]*\| (\d+)/6 ", err)]
    assert sorted(set(done)) == list(range(7)) and done == sorted(done)  # one step a case
    assert main(args) == 0  # stderr is captured, not a terminal: no bar
    assert "needle:" not in capsys.readouterr().err
    assert main(["--no-progress-bar", *args]) == 0
    assert "needle:" not in capsys.readouterr().err


def test_command_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["needle", "--methods", "full,bogus"]) == 2
    assert "--methods" in capsys.readouterr().err
    assert main(["needle", "--lengths", "9000"]) == 2
    assert "do not fit -c 8192" in capsys.readouterr().err


def test_first_seed_splits_a_grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--first-seed 1 --seeds 2 runs seeds 1 and 2: the cases of seed 1 and 2 of a 3-seed run."""
    factory = FakeFactory({Method.FULL: None}, sink=200)
    monkeypatch.setattr(needle, "LlamaEngineFactory", lambda settings: factory)
    args = ["needle", "--lengths", "1500", "--depths", "2", "--methods", "full", "--no-plots"]
    assert main([*args, "--seeds", "3", "--out", str(tmp_path / "all")]) == 0
    assert main([*args, "--seeds", "2", "--first-seed", "1", "--out", str(tmp_path / "part")]) == 0
    whole = json.loads((tmp_path / "all" / "needle.json").read_text())
    part = json.loads((tmp_path / "part" / "needle.json").read_text())
    assert whole["grid"]["seeds"] == [0, 1, 2] and part["grid"]["seeds"] == [1, 2]
    assert part["plots"] == [] and not list((tmp_path / "part").glob("*.png"))

    def keyed(doc: dict) -> list[tuple[int, float, str]]:
        return [(c["seed"], c["depth"], c["expected"]) for c in doc["cases"]]

    assert keyed(part) == keyed(whole)[2:]
    assert [c["seed"] for c in part["cases"]] == [1, 1, 2, 2]


def test_a_rendered_case_over_the_context_is_refused_before_any_case_runs() -> None:
    specs = [spec(d) for d in (0.0, 0.5)]
    factory = FakeFactory({Method.FULL: None})
    with pytest.raises(
        ConfigError, match=r"renders to \d+ tokens; with --max-tokens 12 it does not fit -c 1000"
    ):
        run_needle(factory, [Method.FULL], specs, last_n=600, max_tokens=12, n_ctx=1000)
    assert factory.opened[0].prompts == []  # nothing was asked
    assert len(run_needle(factory, [Method.FULL], specs, 600, 12, n_ctx=8192)) == 2
