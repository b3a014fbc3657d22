"""Which control-token texts in a rendered prompt are the template's own markup.

Control tokens (`<|im_start|>`, `<|im_end|>`, ...) typed in a message, a tool result, a
tool definition or tool-call arguments must stay text: otherwise anyone who can put text
in the conversation can forge role boundaries. The rendered prompt is one string, so the
occurrences are told apart by rendering a second time with every control-token text in
the request's strings replaced by private-use characters of the same length: an
occurrence that survives that render at the same offset was written by the template.

When no request string holds a control-token text (the common case) the second render
is skipped and every occurrence is markup. A template that changes the length of the
text around the replaced strings (so offsets no longer line up) makes the request a 400:
its control tokens cannot be kept apart safely.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kvmem.errors import InvalidRequestError

NEUTRAL = "\ue000"  # a private-use character: never template markup

_NEUTRAL_RUN = re.compile(NEUTRAL + "+")

Span = tuple[int, int]


def special_pattern(texts: tuple[str, ...]) -> re.Pattern[str] | None:
    """An alternation of the texts, longest first (llama.cpp also prefers the longest)."""
    if not texts:
        return None
    ordered = sorted(set(texts), key=lambda t: (-len(t), t))
    return re.compile("|".join(re.escape(t) for t in ordered))


def _holds(value: Any, pattern: re.Pattern[str]) -> bool:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if pattern.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return False


def neutralize(value: Any, pattern: re.Pattern[str]) -> Any:
    """`value` with every control-token text in its strings replaced by NEUTRAL runs."""
    if isinstance(value, str):
        return pattern.sub(lambda m: NEUTRAL * len(m.group(0)), value)
    if isinstance(value, dict):
        return {k: neutralize(v, pattern) for k, v in value.items()}
    if isinstance(value, list):
        return [neutralize(v, pattern) for v in value]
    if isinstance(value, tuple):
        return tuple(neutralize(v, pattern) for v in value)
    return value


def markup_spans(
    text: str,
    pattern: re.Pattern[str] | None,
    inputs: Any,
    render_neutral: Callable[[Callable[[Any], Any]], str],
) -> tuple[Span, ...]:
    """The [start, end) spans of `text` that are the template's control tokens.

    `inputs` are the request's values the template rendered (messages, tools, kwargs);
    `render_neutral(transform)` renders them again with `transform` applied to each.
    """
    if pattern is None:
        return ()
    found = [m.span() for m in pattern.finditer(text)]
    if not found or not _holds(inputs, pattern):
        return tuple(found)
    neutral = render_neutral(lambda value: neutralize(value, pattern))
    if len(neutral) != len(text) or not _aligned(text, neutral):
        raise InvalidRequestError(
            "a message holds the text of a control token of this model's chat template "
            "(such as " + repr(pattern.search(text).group(0)) + "), and this template "  # type: ignore[union-attr]
            "rewrites messages in a way that cannot keep it apart from the template's own",
            "messages",
        )
    return tuple((a, b) for a, b in found if neutral[a:b] == text[a:b])


def _aligned(text: str, neutral: str) -> bool:
    """The two renders differ only where the neutral one has NEUTRAL characters."""
    pos = 0
    for run in _NEUTRAL_RUN.finditer(neutral):
        if neutral[pos : run.start()] != text[pos : run.start()]:
            return False
        pos = run.end()
    return neutral[pos:] == text[pos:]
