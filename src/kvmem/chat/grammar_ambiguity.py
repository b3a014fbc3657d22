"""How many parses of one text a grammar keeps alive at once, found by a greedy adversary.

llama.cpp keeps one pushdown stack per way the text so far can be parsed, and checks every
candidate token against every stack; `anyOf` of 8 arrays nested 5 levels deep has 8**5
stacks after `[[[[[` and the engine thread never returns. `max_live_parses` runs the same
stack machine over the parsed grammar (`kvmem.chat.grammar_parse`), feeding at each step
the character that keeps the most stacks alive, for up to `steps` characters, and stops as
soon as `cap` stacks are alive. The checks before it guarantee the machine terminates (no
left recursion, no repetition of an item that can match the empty text).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvmem.chat.grammar_parse import (
    AnyChar,
    CharClass,
    Grammar,
    Group,
    Item,
    Literal,
    Repeat,
    RuleRef,
    TokenRef,
)

Seq = tuple[Item, ...]
Frame = tuple[int, int, int]  # (sequence id, item index, literal offset or repeat count)
Stack = tuple[Frame, ...]
MAX_PROBES = 16  # characters tried at each step


@dataclass(slots=True, frozen=True)
class LiveParses:
    count: int  # the most stacks alive at once (at least `cap` when it stopped there)
    text: str  # the text that made them


class _Machine:
    def __init__(self, grammar: Grammar, cap: int) -> None:
        self.cap = cap
        self.seqs: list[Seq] = []
        self.ids: dict[int, int] = {}  # id(list or item) -> sequence id
        self.rules = {name: [self.seq_id(s) for s in alts] for name, alts in grammar.rules.items()}
        self.groups: dict[int, list[int]] = {}

    def seq_id(self, items: list[Item] | Seq, key: object = None) -> int:
        k = id(key if key is not None else items)
        if k not in self.ids:
            self.ids[k] = len(self.seqs)
            self.seqs.append(tuple(items))
        return self.ids[k]

    def alternatives(self, item: Item) -> list[int]:
        if isinstance(item, RuleRef):
            return self.rules[item.name]
        assert isinstance(item, Group)
        if id(item) not in self.groups:
            self.groups[id(item)] = [self.seq_id(s) for s in item.alternatives]
        return self.groups[id(item)]

    def advance(self, stack: Stack, out: set[Stack]) -> None:
        """Every stack `stack` expands to whose top is a terminal (or the empty stack)."""
        todo = [stack]
        seen: set[Stack] = set()
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            if len(seen) > 64 * self.cap:
                raise _TooMany
            if not cur:
                out.add(cur)
                continue
            sid, i, k = cur[-1]
            seq = self.seqs[sid]
            if i >= len(seq):
                todo.append(cur[:-1])
                continue
            item = seq[i]
            below = cur[:-1]
            after = (*below, (sid, i + 1, 0)) if i + 1 < len(seq) else below
            if isinstance(item, Literal) and k >= len(item.chars):
                todo.append(after)
            elif isinstance(item, (Literal, CharClass, AnyChar, TokenRef)):
                out.add(cur)  # a terminal (a literal with characters left)
            elif isinstance(item, (RuleRef, Group)):
                todo.extend((*after, (alt, 0, 0)) for alt in self.alternatives(item))
            elif isinstance(item, Repeat):
                if k >= item.min:
                    todo.append(after)
                if item.max is None or k < item.max:
                    inner = self.seq_id((item.item,), key=item)
                    todo.append((*below, (sid, i, k + 1), (inner, 0, 0)))
            if len(out) > 16 * self.cap:
                raise _TooMany

    def feed(self, stacks: set[Stack], ch: int) -> set[Stack]:
        out: set[Stack] = set()
        for stack in stacks:
            if not stack:
                continue
            sid, i, k = stack[-1]
            item = self.seqs[sid][i]
            if isinstance(item, Literal):
                if item.chars[k] == ch:
                    self.advance((*stack[:-1], (sid, i, k + 1)), out)
            elif isinstance(item, AnyChar) or (isinstance(item, CharClass) and _matches(item, ch)):
                self.advance((*stack[:-1], (sid, i + 1, 0)), out)
        return out

    def probes(self, stacks: set[Stack]) -> list[int]:
        chars: set[int] = set()
        for stack in stacks:
            if not stack:
                continue
            sid, i, k = stack[-1]
            item = self.seqs[sid][i]
            if isinstance(item, Literal):
                chars.add(item.chars[k])
            elif isinstance(item, CharClass) and not item.negated:
                chars.update(lo for lo, _ in item.ranges)
            else:
                chars.update((ord("a"), ord("0"), ord(" ")))
        return sorted(chars)[:MAX_PROBES]


class _TooMany(Exception):
    pass


def _matches(item: CharClass, ch: int) -> bool:
    inside = any(lo <= ch <= hi for lo, hi in item.ranges)
    return inside != item.negated


def max_live_parses(grammar: Grammar, cap: int, steps: int = 24) -> LiveParses:
    """The most stacks alive along the adversary's text (stops at `cap`)."""
    machine = _Machine(grammar, cap)
    stacks: set[Stack] = set()
    try:
        for alt in machine.rules["root"]:
            machine.advance(((alt, 0, 0),), stacks)
    except _TooMany:
        return LiveParses(cap, "")
    best = LiveParses(len(stacks), "")
    text = ""
    for _ in range(steps):
        if best.count >= cap:
            break
        options = []
        for ch in machine.probes(stacks):
            try:
                options.append((len(nxt := machine.feed(stacks, ch)), ch, nxt))
            except _TooMany:
                return LiveParses(cap, text + chr(ch))
        if not options:
            break
        count, ch, stacks = max(options, key=lambda o: o[0])
        text += chr(ch)
        if count > best.count:
            best = LiveParses(count, text)
    return best
