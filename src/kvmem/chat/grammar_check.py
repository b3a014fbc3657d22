"""Every GBNF grammar passes `check_grammar` before llama.cpp sees it.

llama.cpp aborts the whole process on a grammar that can match nothing (`root ::= [z-a]`:
every token is rejected, then accepting one throws), spins for ever on an ambiguous
repetition (`("a"?){0,1000}`: a token of many `a` is tried along every way to split it),
and expands `x{m,n}` into copies of x (a 250 KB literal repeated 1000 times is 4 GB). The
grammar is parsed here (`kvmem.chat.grammar_parse`, llama.cpp's syntax) and refused, as an
InvalidRequestError naming the problem or the limit, when it:

- is not valid GBNF, has no `root` rule, uses an undefined rule, holds a NUL character;
- has an empty or inverted character class (`[z-a]`), a literal or class no text can
  match, or a rule reachable from `root` that can never match (satisfiability fixpoint);
- is left-recursive (llama.cpp refuses that, or loops on it when the recursion passes
  through a rule that is only transitively empty);
- repeats an item that can match the empty text (`("a"?){0,1000}`), or repeats an item
  that can end in a variable repetition of the characters it starts with (`("a"+)*`):
  both split one text in exponentially many ways;
- keeps more than MAX_GRAMMAR_PARSES parses of one text alive at once
  (`kvmem.chat.grammar_ambiguity`: `anyOf` of arrays nested in arrays);
- passes one of the size limits below (text, rules, literal, repetition count, product of
  nested repetition counts, alternatives, group nesting, elements after expansion).
"""

from __future__ import annotations

from collections.abc import Callable

from kvmem.chat.grammar_ambiguity import max_live_parses
from kvmem.chat.grammar_parse import (
    MAX_CODE_POINT,
    AnyChar,
    CharClass,
    Grammar,
    GrammarSyntaxError,
    Group,
    Item,
    Literal,
    Repeat,
    RuleRef,
    TokenRef,
    parse_grammar,
)
from kvmem.chat.grammar_shape import first_chars, overlaps, tail_repeats
from kvmem.errors import InvalidRequestError

# The limits (docs/server.md, "Grammar limits"), one place
MAX_GRAMMAR_CHARS = 256 * 1024  # grammar text
MAX_GRAMMAR_RULES = 65_536  # rules after llama.cpp's rewriting (groups, repetitions)
MAX_GRAMMAR_LITERAL = 65_536  # characters in one string literal
MAX_GRAMMAR_REPEAT = 1000  # m and n of x{m,n}
MAX_GRAMMAR_REPEAT_PRODUCT = 4096  # counts of repetitions nested inside each other
MAX_GRAMMAR_ALTERNATIVES = 1024  # alternatives of one rule or group
MAX_GRAMMAR_NESTING = 64  # groups inside groups
MAX_GRAMMAR_ELEMENTS = 1_000_000  # llama.cpp grammar elements after expanding x{m,n}
MAX_GRAMMAR_PARSES = 128  # parses of one text alive at once (llama.cpp checks each token
# against every one: anyOf of 8 arrays nested 2 deep keeps 256 and took 10 s a token)


def _fail(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"invalid grammar: {message}", param)


def check_grammar(text: str, param: str = "grammar") -> None:
    """InvalidRequestError(param) unless llama.cpp can use `text` safely."""
    if len(text) > MAX_GRAMMAR_CHARS:
        raise _fail(param, f"{len(text)} characters, more than {MAX_GRAMMAR_CHARS}")
    if "\x00" in text:
        raise _fail(param, "it holds a NUL character")
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        raise _fail(param, "it holds a lone UTF-16 surrogate")
    try:
        grammar = parse_grammar(text, MAX_GRAMMAR_NESTING)
    except GrammarSyntaxError as exc:
        raise _fail(param, str(exc)) from None
    if "root" not in grammar.rules:
        raise _fail(param, "there is no 'root' rule")
    _Checker(grammar, param).run()


class _Checker:
    def __init__(self, grammar: Grammar, param: str) -> None:
        self.g = grammar
        self.param = param
        self.elements = 0
        self.rules = len(grammar.rules)
        self.nullable: dict[str, bool] = {}
        self.satisfiable: dict[str, bool] = {}

    def fail(self, message: str) -> InvalidRequestError:
        return _fail(self.param, message)

    def run(self) -> None:
        for name, alternatives in self.g.rules.items():
            self.walk_alternatives(alternatives, name, 1)
        if self.rules > MAX_GRAMMAR_RULES:
            raise self.fail(f"{self.rules} rules after expansion, more than {MAX_GRAMMAR_RULES}")
        if self.elements > MAX_GRAMMAR_ELEMENTS:
            raise self.fail(
                f"about {self.elements} elements after expanding its repetitions, "
                f"more than the limit of {MAX_GRAMMAR_ELEMENTS}"
            )
        self.nullable = self.fixpoint(self.is_nullable)
        self.satisfiable = self.fixpoint(self.is_satisfiable)
        for name, alternatives in self.g.rules.items():
            for seq in alternatives:
                for item in seq:
                    self.check_repeats(item, name)
        self.check_reachable_satisfiable()
        self.check_left_recursion()
        live = max_live_parses(self.g, MAX_GRAMMAR_PARSES + 1)
        if live.count > MAX_GRAMMAR_PARSES:
            where = f"after {live.text[:40]!r}" if live.text else "at the start"
            raise self.fail(
                f"more than {MAX_GRAMMAR_PARSES} ways to parse the same text are alive at once "
                f"({where}); make the alternatives start differently"
            )

    # pass 1: syntax-level checks and sizes ------------------------------------------------
    def walk_alternatives(self, alternatives: list[list[Item]], rule: str, factor: int) -> None:
        if len(alternatives) > MAX_GRAMMAR_ALTERNATIVES:
            raise self.fail(
                f"rule '{rule}' has {len(alternatives)} alternatives, "
                f"more than {MAX_GRAMMAR_ALTERNATIVES}"
            )
        for seq in alternatives:
            self.elements += 1 + sum(self.walk(item, rule, factor) for item in seq)

    def walk(self, item: Item, rule: str, factor: int) -> int:
        """The elements `item` takes in its rule (its own rules are added to the totals)."""
        if isinstance(item, Literal):
            if len(item.chars) > MAX_GRAMMAR_LITERAL:
                raise self.fail(
                    f"a literal in rule '{rule}' has {len(item.chars)} characters, "
                    f"more than {MAX_GRAMMAR_LITERAL}"
                )
            return len(item.chars)
        if isinstance(item, CharClass):
            if not item.ranges:
                raise self.fail(f"rule '{rule}' has an empty character class")
            for lo, hi in item.ranges:
                if lo > hi:
                    raise self.fail(
                        f"the character range {_show(lo)}-{_show(hi)} in rule '{rule}' is "
                        "empty (its start is after its end)"
                    )
            return 2 * len(item.ranges)
        if isinstance(item, TokenRef):
            spec = item.spec
            if spec.startswith("[") and int(spec[1:-1]) > 0xFFFFFFFF:
                raise self.fail(f"the token id {spec[1:-1]} in rule '{rule}' is too big")
            return 1
        if isinstance(item, RuleRef):
            if item.name not in self.g.rules:
                raise self.fail(f"rule '{rule}' uses the undefined rule '{item.name}'")
            return 1
        if isinstance(item, Group):
            self.rules += 1
            self.walk_alternatives(item.alternatives, rule, factor)
            return 1
        if isinstance(item, Repeat):
            return self.walk_repeat(item, rule, factor)
        return 1  # AnyChar

    def walk_repeat(self, item: Repeat, rule: str, factor: int) -> int:
        low, high = item.min, item.max
        for count in (low, high):
            if count is not None and count > MAX_GRAMMAR_REPEAT:
                raise self.fail(
                    f"rule '{rule}' repeats an item {count} times: repetition counts are "
                    f"limited to {MAX_GRAMMAR_REPEAT}"
                )
        if high is not None and high < low:
            raise self.fail(
                f"rule '{rule}' repeats an item {{{low},{high}}}: the minimum is above the maximum"
            )
        factor *= max(1, high if high is not None else low)
        if factor > MAX_GRAMMAR_REPEAT_PRODUCT:
            raise self.fail(
                f"rule '{rule}' nests repetitions whose counts multiply to {factor}, "
                f"more than the limit of {MAX_GRAMMAR_REPEAT_PRODUCT}"
            )
        size = self.walk(item.item, rule, factor)
        n_opt = 1 if high is None else high - low
        self.rules += n_opt
        self.elements += n_opt * (size + 3)
        return size * low + (1 if n_opt else 0)

    # pass 2: emptiness and satisfiability ---------------------------------------------------
    def fixpoint(self, test) -> dict[str, bool]:
        values = dict.fromkeys(self.g.rules, False)
        changed = True
        while changed:
            changed = False
            for name, alternatives in self.g.rules.items():
                if not values[name] and any(
                    all(test(i, values) for i in seq) for seq in alternatives
                ):
                    values[name] = True
                    changed = True
        return values

    def is_nullable(self, item: Item, rules: dict[str, bool]) -> bool:
        if isinstance(item, Literal):
            return not item.chars
        if isinstance(item, RuleRef):
            return rules[item.name]
        if isinstance(item, Group):
            return any(all(self.is_nullable(i, rules) for i in s) for s in item.alternatives)
        if isinstance(item, Repeat):
            return item.min == 0 or self.is_nullable(item.item, rules)
        return False

    def is_satisfiable(self, item: Item, rules: dict[str, bool]) -> bool:
        if isinstance(item, Literal):
            return all(0 < c <= MAX_CODE_POINT for c in item.chars)
        if isinstance(item, CharClass):
            return _class_matches_something(item)
        if isinstance(item, RuleRef):
            return rules[item.name]
        if isinstance(item, Group):
            return any(all(self.is_satisfiable(i, rules) for i in s) for s in item.alternatives)
        if isinstance(item, Repeat):
            return item.min == 0 or self.is_satisfiable(item.item, rules)
        return True  # AnyChar, TokenRef

    def check_reachable_satisfiable(self) -> None:
        seen = {"root"}
        todo = ["root"]
        while todo:
            name = todo.pop()
            if not self.satisfiable[name]:
                raise self.fail(f"rule '{name}' can never match anything")
            for ref in _refs(self.g.rules[name]):
                if ref not in seen:
                    seen.add(ref)
                    todo.append(ref)

    # pass 3: repetitions that split one text in many ways -----------------------------------
    def check_repeats(self, item: Item, rule: str) -> None:
        if isinstance(item, Group):
            for seq in item.alternatives:
                for sub in seq:
                    self.check_repeats(sub, rule)
            return
        if not isinstance(item, Repeat):
            return
        self.check_repeats(item.item, rule)
        if item.max is not None and item.max <= 1:
            return
        if self.is_nullable(item.item, self.nullable):
            raise self.fail(
                f"rule '{rule}' repeats an item that can match the empty text "
                "(make the inner item non-optional)"
            )
        starts = first_chars(item.item, self.g.rules, self.nullable)
        for tail in tail_repeats(item.item, self.g.rules, self.nullable):
            if overlaps(starts, first_chars(tail.item, self.g.rules, self.nullable)):
                raise self.fail(
                    f"rule '{rule}' repeats an item that ends in a variable repetition of "
                    'characters it can also start with (ambiguous, like ("a"+)*)'
                )

    # pass 4: left recursion ---------------------------------------------------------------
    def check_left_recursion(self) -> None:
        edges = {name: self.leftmost_refs(alts) for name, alts in self.g.rules.items()}
        state: dict[str, int] = {}  # 1: on the path, 2: done
        for start in self.g.rules:
            if start in state:
                continue
            stack = [(start, iter(edges[start]))]
            state[start] = 1
            while stack:
                name, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[name] = 2
                    stack.pop()
                elif state.get(nxt) == 1:
                    raise self.fail(f"rule '{nxt}' is left-recursive")
                elif nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(edges[nxt])))

    def leftmost_refs(self, alternatives: list[list[Item]]) -> set[str]:
        """The rules an alternative can start with (past nullable items only)."""
        return _refs(alternatives, lambda item: self.is_nullable(item, self.nullable))


def _refs(
    alternatives: list[list[Item]], read_past: Callable[[Item], bool] = lambda _: True
) -> set[str]:
    """The rules the alternatives refer to, reading each sequence only as far as
    `read_past` allows (the item it refuses still counts)."""
    refs: set[str] = set()
    todo = list(alternatives)
    while todo:
        for item in todo.pop():
            if isinstance(item, RuleRef):
                refs.add(item.name)
            elif isinstance(item, Group):
                todo.extend(item.alternatives)
            elif isinstance(item, Repeat):
                todo.append([item.item])
            if not read_past(item):
                break
    return refs


def _class_matches_something(item: CharClass) -> bool:
    ranges = sorted((max(lo, 1), min(hi, MAX_CODE_POINT)) for lo, hi in item.ranges)
    ranges = [(lo, hi) for lo, hi in ranges if lo <= hi]
    if not item.negated:
        return bool(ranges)
    covered = 0  # the highest code point covered from 1 up
    for lo, hi in ranges:
        if lo > covered + 1:
            return True
        covered = max(covered, hi)
    return covered < MAX_CODE_POINT


def _show(code: int) -> str:
    return (
        chr(code) if 0x20 < code < 0x7F else f"\\x{code:02X}" if code < 0x100 else f"U+{code:04X}"
    )


__all__ = ["AnyChar", "TokenRef", "check_grammar"]
