"""The haystack's filling, shared by the needle layouts: needles inserted among units at
their depths, and rounds of tool calls whose result lines hide them."""

from __future__ import annotations

import random
from collections.abc import Callable

from kvmem.bench import content

MARKUP_TOKENS = 6  # chat markup per message: <|im_start|>role\n ... <|im_end|>\n


def insert_needles(units: list[str], needles: list[tuple[float, str]]) -> list[str]:
    """Insert each needle before the unit at round(depth * len(units)); stable for ties."""
    out = list(units)
    placed = sorted(
        ((round(d * len(units)), i, text) for i, (d, text) in enumerate(needles)), reverse=True
    )
    for index, _, text in placed:
        out.insert(index, text)
    return out


def tool_rounds(
    rng: random.Random,
    budget: int,
    needles: list[tuple[float, str]],
    count_tokens: Callable[[str], int],
    render_call: Callable[[str, str, str], str],
    round_markup: int = 2 * MARKUP_TOKENS,
    trim: bool = False,
) -> list[tuple[str, str, str, list[str]]]:
    """Rounds of (tool name, argument name, argument, result lines) filling `budget` tokens, with the
    needles inserted as lines of the results at their depths. `render_call(name, key,
    input)` is the call's text as the prompt shows it (for counting). With `trim`, lines
    are dropped from the end of the last result while the rounds still fill the budget
    (results are up to ~1K tokens, so without it a prompt can overshoot by that much)."""
    actions: list[tuple[str, str, str]] = []
    results: list[list[str]] = []
    used = sum(count_tokens(text + "\n") for _, text in needles)
    kind = 0
    while used < budget:
        kind += 1
        action = tool_action(rng, kind)
        lines = content.tool_output(rng, kind, rng.randrange(8, 20)).split("\n")
        used += (
            count_tokens(render_call(*action))
            + sum(count_tokens(line + "\n") for line in lines)
            + round_markup
        )
        actions.append(action)
        results.append(lines)
    while trim and results and len(results[-1]) > 1:
        cost = count_tokens(results[-1][-1] + "\n")
        if used - cost < budget:
            break
        used -= cost
        results[-1].pop()
    flat = [(r, line) for r, lines in enumerate(results) for line in lines]
    marked = insert_needles([f"{r}\x00{line}" for r, line in flat], needles)
    regrouped: list[list[str]] = [[] for _ in results]
    last_round = 0
    for unit in marked:
        round_text, sep, line = unit.partition("\x00")
        if sep:
            last_round = int(round_text)
            regrouped[last_round].append(line)
        else:  # a needle: joins the round of the line before it (or the first round)
            regrouped[last_round].append(unit)
    return [(*action, lines) for action, lines in zip(actions, regrouped, strict=True)]


def tool_action(rng: random.Random, kind: int) -> tuple[str, str, str]:
    """(tool name, argument name, argument) of the round's call."""
    kind %= 4
    if kind == 0:
        return "run_command", "command", f"tail -n 20 logs/{rng.choice(content.SERVICES)}.log"
    if kind == 1:
        return "query_db", "sql", f"SELECT * FROM orders LIMIT {rng.randrange(5, 30)}"
    if kind == 2:
        return "read_file", "path", f"src/{rng.choice(content.NOUNS)}_service.py"
    return "read_file", "path", f"docs/{rng.choice(content.NOUNS)}.txt"
