"""Which control-token texts in a rendered prompt are the template's own markup.

Control tokens (`<|im_start|>`, `<|im_end|>`, ...) typed in a message, a tool result, a
tool definition or tool-call arguments must stay text: otherwise anyone who can put text
in the conversation can forge role boundaries. The prompt is rendered once, and the
occurrences are told apart in that one render: before it, every control-token text in the
request's strings is replaced by a run of one private-use character of the same length
(one character per control-token text, chosen so that it occurs nowhere in the request
or the template). An occurrence in the render was written by the template; each run of a
stand-in character is written back as the text it stands for and stays plain text.

When no request string holds a control-token text (the common case) nothing is replaced
and every occurrence is markup.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Span = tuple[int, int]

_STAND_IN_BASE = 0xF0000  # Supplementary Private Use Area-A: never template markup


def special_pattern(texts: tuple[str, ...]) -> re.Pattern[str] | None:
    """An alternation of the texts, longest first (llama.cpp also prefers the longest)."""
    if not texts:
        return None
    ordered = sorted(set(texts), key=lambda t: (-len(t), t))
    return re.compile("|".join(re.escape(t) for t in ordered))


def _strings(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack.extend(node.values())
            stack.extend(k for k in node if isinstance(k, str))
        elif isinstance(node, (list, tuple)):
            stack.extend(node)


@dataclass(slots=True)
class Unmasked:
    """A render written back: the text, and the ranges that were typed control tokens."""

    text: str
    typed: tuple[Span, ...]


class Mask:
    """Stand-ins for the control-token texts a request holds (`mask_for`)."""

    def __init__(self, pattern: re.Pattern[str], stand_ins: dict[str, str]) -> None:
        self.pattern = pattern
        self.stand_ins = stand_ins  # control-token text -> its stand-in character
        self.texts = {ch: text for text, ch in stand_ins.items()}
        self._runs = re.compile("|".join(f"{re.escape(ch)}+" for ch in self.texts))

    def apply(self, value: Any) -> Any:
        """`value` with every control-token text in its strings (dict keys too: argument
        and parameter names) replaced by its stand-ins."""
        if isinstance(value, str):
            return self.pattern.sub(lambda m: self.stand_ins[m.group(0)] * len(m.group(0)), value)
        if isinstance(value, dict):
            return {self.apply(k): self.apply(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.apply(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.apply(v) for v in value)
        return value

    def restore(self, rendered: str) -> Unmasked:
        """Each stand-in run written back as the control-token text(s) it replaced (a run a
        template cut short keeps the text's first characters: offsets never move)."""
        parts: list[str] = []
        typed: list[Span] = []
        pos = 0
        for run in self._runs.finditer(rendered):
            text = self.texts[run.group(0)[0]]
            n = run.end() - run.start()
            parts += [rendered[pos : run.start()], (text * (n // len(text) + 1))[:n]]
            typed.append(run.span())
            pos = run.end()
        parts.append(rendered[pos:])
        return Unmasked("".join(parts), tuple(typed))


def mask_for(pattern: re.Pattern[str] | None, inputs: Any, avoid: str = "") -> Mask | None:
    """A mask for the control-token texts that `inputs` hold (None: they hold none).

    The stand-in characters occur nowhere in `inputs` or `avoid` (the template source)."""
    if pattern is None:
        return None
    found: set[str] = set()
    for s in _strings(inputs):
        found.update(m.group(0) for m in pattern.finditer(s))
    if not found:
        return None
    used = set(avoid).union(*_strings(inputs))
    stand_ins: dict[str, str] = {}
    code = _STAND_IN_BASE
    for text in sorted(found):
        while chr(code) in used:
            code += 1
        stand_ins[text] = chr(code)
        code += 1
    return Mask(pattern, stand_ins)


def markup_spans(
    text: str, pattern: re.Pattern[str] | None, typed: tuple[Span, ...] = ()
) -> tuple[Span, ...]:
    """The [start, end) spans of `text` that are the template's control tokens: every
    occurrence of a control-token text that overlaps none of the `typed` ranges."""
    if pattern is None:
        return ()
    found = [m.span() for m in pattern.finditer(text)]
    kept: list[Span] = []
    j = 0  # both lists ascend: one merge pass
    for a, b in found:
        while j < len(typed) and typed[j][1] <= a:
            j += 1
        if j < len(typed) and typed[j][0] < b:
            continue
        kept.append((a, b))
    return tuple(kept)
