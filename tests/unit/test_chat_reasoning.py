"""Splitting <think>...</think> from the answer while streaming."""

from __future__ import annotations

from kvmem.chat.reasoning import (
    MISTRAL_THINK_TAGS,
    THINK_TAGS,
    Channel,
    ReasoningSplitter,
    markers_for_template,
    prompt_opens_reasoning,
)

R, C = Channel.REASONING, Channel.CONTENT


def run(splitter: ReasoningSplitter, deltas: list[str]) -> list[tuple[Channel, str]]:
    pieces = []
    for delta in deltas:
        pieces += splitter.push(delta)
    pieces += splitter.flush()
    merged: list[tuple[Channel, str]] = []
    for p in pieces:
        if merged and merged[-1][0] is p.channel:
            merged[-1] = (p.channel, merged[-1][1] + p.text)
        else:
            merged.append((p.channel, p.text))
    return merged


def test_prompt_opened_block_streams_reasoning_then_content() -> None:
    splitter = ReasoningSplitter(THINK_TAGS, starts_in_reasoning=True)
    deltas = ["Let me", " think.\n</th", "ink>\n\n", "The answer", " is 4."]
    assert run(splitter, deltas) == [(R, "Let me think.\n"), (C, "The answer is 4.")]


def test_block_opened_by_the_model_at_the_start() -> None:
    splitter = ReasoningSplitter(THINK_TAGS, starts_in_reasoning=False)
    deltas = ["\n<th", "ink>\nhmm", "</think>", "\n\nDone"]
    assert run(splitter, deltas) == [(R, "hmm"), (C, "Done")]


def test_think_tag_after_content_started_is_content() -> None:
    splitter = ReasoningSplitter(THINK_TAGS, starts_in_reasoning=False)
    assert run(splitter, ["Sure. <think>no</think>"]) == [(C, "Sure. <think>no</think>")]


def test_partial_close_tag_is_held_then_released_as_reasoning() -> None:
    splitter = ReasoningSplitter(THINK_TAGS, starts_in_reasoning=True)
    first = splitter.push("a </thi")
    assert [(p.channel, p.text) for p in first] == [(R, "a ")]
    second = splitter.push("s is not a tag")
    assert [(p.channel, p.text) for p in second] == [(R, "</this is not a tag")]
    assert splitter.in_reasoning


def test_unclosed_thinking_at_the_end_is_reasoning() -> None:
    splitter = ReasoningSplitter(THINK_TAGS, starts_in_reasoning=True)
    assert run(splitter, ["still thinking </thin"]) == [(R, "still thinking </thin")]


def test_without_markers_everything_is_content() -> None:
    splitter = ReasoningSplitter(None, starts_in_reasoning=True)
    assert run(splitter, ["<think>x</think>y"]) == [(C, "<think>x</think>y")]


def test_mistral_think_tags() -> None:
    splitter = ReasoningSplitter(MISTRAL_THINK_TAGS, starts_in_reasoning=False)
    assert run(splitter, ["[THINK]plan[/THINK]answer"]) == [(R, "plan"), (C, "answer")]


def test_markers_and_open_block_detection_from_templates() -> None:
    assert markers_for_template("{{ '<think>\\n' }}") == THINK_TAGS
    assert markers_for_template("[THINK]") == MISTRAL_THINK_TAGS
    assert markers_for_template("<|im_start|>") is None
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", THINK_TAGS)
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK_TAGS)
    assert not prompt_opens_reasoning("<think>x</think> <|im_start|>assistant\n", THINK_TAGS)
    assert not prompt_opens_reasoning("<think>", None)
