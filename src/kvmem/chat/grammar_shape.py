"""First characters and trailing repetitions of GBNF items (for `grammar_check`).

`first_chars` over-approximates the characters an item's text can start with (a token or
`.` is every character); `tail_repeats` lists the variable repetitions (`x*`, `x+`, `x?`,
`x{m,n}` with m < n) a text of the item can end in. A repetition of S is ambiguous when S
can end in such a repetition of characters S can start with: `("a"+)*` reads `aaaa` in
2**3 ways, and llama.cpp tries every way for each candidate token.
"""

from __future__ import annotations

from kvmem.chat.grammar_parse import (
    MAX_CODE_POINT,
    AnyChar,
    CharClass,
    Group,
    Item,
    Literal,
    Repeat,
    RuleRef,
    TokenRef,
)

Chars = list[tuple[int, int]]  # inclusive code point ranges
Rules = dict[str, list[list[Item]]]
EVERY: Chars = [(0, MAX_CODE_POINT)]


def _complement(ranges: Chars) -> Chars:
    out: Chars = []
    nxt = 0
    for lo, hi in sorted(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return out


def first_chars(item: Item, rules: Rules, nullable: dict[str, bool]) -> Chars:
    out: Chars = []
    _first(item, rules, nullable, out, set())
    return out


def _first(item: Item, rules: Rules, nullable: dict[str, bool], out: Chars, seen: set) -> None:
    if isinstance(item, Literal):
        if item.chars:
            out.append((item.chars[0], item.chars[0]))
    elif isinstance(item, CharClass):
        ranges = [(lo, hi) for lo, hi in item.ranges if lo <= hi]
        out.extend(_complement(ranges) if item.negated else ranges)
    elif isinstance(item, (AnyChar, TokenRef)):
        out.extend(EVERY)
    elif isinstance(item, Repeat):
        _first(item.item, rules, nullable, out, seen)
    elif isinstance(item, RuleRef):
        if item.name not in seen:
            seen.add(item.name)
            _first_alternatives(rules[item.name], rules, nullable, out, seen)
    elif isinstance(item, Group):
        _first_alternatives(item.alternatives, rules, nullable, out, seen)


def _first_alternatives(
    alternatives: list[list[Item]], rules: Rules, nullable: dict[str, bool], out: Chars, seen: set
) -> None:
    for seq in alternatives:
        for item in seq:
            _first(item, rules, nullable, out, seen)
            if not _nullable(item, nullable):
                break


def _nullable(item: Item, nullable: dict[str, bool]) -> bool:
    if isinstance(item, Literal):
        return not item.chars
    if isinstance(item, RuleRef):
        return nullable.get(item.name, False)
    if isinstance(item, Group):
        return any(all(_nullable(i, nullable) for i in s) for s in item.alternatives)
    if isinstance(item, Repeat):
        return item.min == 0 or _nullable(item.item, nullable)
    return False


def tail_repeats(item: Item, rules: Rules, nullable: dict[str, bool]) -> list[Repeat]:
    out: list[Repeat] = []
    _tails(item, rules, nullable, out, set())
    return out


def _tails(item: Item, rules: Rules, nullable: dict[str, bool], out: list, seen: set) -> None:
    if isinstance(item, Repeat):
        if item.max is None or item.max > item.min:
            out.append(item)
        _tails(item.item, rules, nullable, out, seen)
    elif isinstance(item, Group):
        _tails_alternatives(item.alternatives, rules, nullable, out, seen)
    elif isinstance(item, RuleRef) and item.name not in seen:
        seen.add(item.name)
        _tails_alternatives(rules[item.name], rules, nullable, out, seen)


def _tails_alternatives(
    alternatives: list[list[Item]], rules: Rules, nullable: dict[str, bool], out: list, seen: set
) -> None:
    for seq in alternatives:
        for item in reversed(seq):
            _tails(item, rules, nullable, out, seen)
            if not _nullable(item, nullable):
                break


def overlaps(a: Chars, b: Chars) -> bool:
    """Whether two range lists share a code point (sorted sweep)."""
    xs, ys = sorted(a), sorted(b)
    i = j = 0
    while i < len(xs) and j < len(ys):
        (alo, ahi), (blo, bhi) = xs[i], ys[j]
        if alo <= bhi and blo <= ahi:
            return True
        if ahi < bhi:
            i += 1
        else:
            j += 1
    return False
