"""A GBNF parser that follows llama.cpp's (src/llama-grammar.cpp) syntax exactly.

It turns grammar text into a small tree (`Grammar`: rules of alternatives of sequences of
items) for `kvmem.chat.grammar_check`, which decides whether llama.cpp may see it. Every
syntax llama.cpp accepts parses here to the same meaning: rules `name ::= ...` (names of
`[a-zA-Z0-9-]`), `|` alternation, `( )` groups, string literals and `[...]`/`[^...]`
character classes with llama.cpp's escapes (`\\x`, `\\u`, `\\U`, `\\t`, `\\r`, `\\n`,
`\\\\`, `\\"`, `\\[`, `\\]`, `\\-`), `.`, tokens `<[id]>`/`<text>` and `!`-negated tokens,
the repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`, and `#` comments. A newline ends a
rule except inside a group, and the next alternative's `|` must start on the same line.
A syntax error is a `GrammarSyntaxError` with llama.cpp's wording and the offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_CODE_POINT = 0x10FFFF


class GrammarSyntaxError(Exception):
    """The text is not GBNF llama.cpp would parse."""


@dataclass(slots=True)
class Literal:
    chars: list[int]  # code points; may be empty


@dataclass(slots=True)
class CharClass:
    ranges: list[tuple[int, int]]  # inclusive (start, end); a single char is (c, c)
    negated: bool


@dataclass(slots=True)
class AnyChar:
    pass


@dataclass(slots=True)
class TokenRef:
    spec: str  # "[123]" or the token text between < >
    negated: bool


@dataclass(slots=True)
class RuleRef:
    name: str
    offset: int


@dataclass(slots=True)
class Group:
    alternatives: list[list[Item]]


@dataclass(slots=True)
class Repeat:
    item: Item
    min: int
    max: int | None  # None: unbounded


Item = Literal | CharClass | AnyChar | TokenRef | RuleRef | Group | Repeat


@dataclass(slots=True)
class Grammar:
    rules: dict[str, list[list[Item]]] = field(default_factory=dict)  # name -> alternatives


def _is_word(ch: str) -> bool:
    return ch == "-" or ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ("0" <= ch <= "9")


_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX_SIZES = {"x": 2, "u": 4, "U": 8}


class _Parser:
    def __init__(self, text: str, max_nesting: int) -> None:
        self.src = text
        self.pos = 0
        self.max_nesting = max_nesting
        self.depth = 0  # groups open, and repetitions of repetitions

    def peek(self, ahead: int = 0) -> str:
        i = self.pos + ahead
        return self.src[i] if i < len(self.src) else ""

    def fail(self, message: str) -> GrammarSyntaxError:
        return GrammarSyntaxError(f"{message} at offset {self.pos}")

    def space(self, newline_ok: bool) -> None:
        while True:
            ch = self.peek()
            if ch == "#":
                while self.peek() not in ("", "\r", "\n"):
                    self.pos += 1
            elif ch in (" ", "\t") or (newline_ok and ch in ("\r", "\n")):
                self.pos += 1
            else:
                return

    def name(self) -> str:
        start = self.pos
        while _is_word(self.peek()):
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting name")
        return self.src[start : self.pos]

    def integer(self) -> int:
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting an int")
        digits = self.src[start : self.pos]
        return int(digits[:20]) if len(digits) <= 20 else 10**20  # huge: over every limit

    def char(self) -> int:
        ch = self.peek()
        if ch == "":
            raise self.fail("unexpected end of input")
        if ch != "\\":
            self.pos += 1
            return ord(ch)
        kind = self.peek(1)
        if kind in _HEX_SIZES:
            size = _HEX_SIZES[kind]
            digits = self.src[self.pos + 2 : self.pos + 2 + size]
            if len(digits) != size or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise self.fail(f"expecting {size} hex chars")
            self.pos += 2 + size
            return int(digits, 16)
        if kind in _ESCAPES:
            self.pos += 2
            return ord(_ESCAPES[kind])
        raise self.fail("unknown escape")

    def parse(self) -> Grammar:
        grammar = Grammar()
        self.space(True)
        while self.pos < len(self.src):
            name = self.name()
            self.space(False)
            if self.src[self.pos : self.pos + 3] != "::=":
                raise self.fail("expecting ::=")
            self.pos += 3
            self.space(True)
            grammar.rules[name] = self.alternates(nested=False)  # a later definition wins
            ch = self.peek()
            if ch == "\r":
                self.pos += 2 if self.peek(1) == "\n" else 1
            elif ch == "\n":
                self.pos += 1
            elif ch != "":
                raise self.fail("expecting newline or end")
            self.space(True)
        return grammar

    def alternates(self, nested: bool) -> list[list[Item]]:
        alternatives = [self.sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alternatives.append(self.sequence(nested))
        return alternatives

    def sequence(self, nested: bool) -> list[Item]:
        items: list[Item] = []
        while True:
            ch = self.peek()
            if ch == '"':
                self.pos += 1
                chars = []
                while self.peek() != '"':
                    chars.append(self.char())
                self.pos += 1
                items.append(Literal(chars))
            elif ch == "[":
                items.append(self.char_class())
            elif ch in ("<", "!"):
                items.append(self.token())
            elif _is_word(ch):
                offset = self.pos
                items.append(RuleRef(self.name(), offset))
            elif ch == "(":
                self.pos += 1
                self.space(True)
                self.enter()
                group = Group(self.alternates(nested=True))
                self.depth -= 1
                if self.peek() != ")":
                    raise self.fail("expecting ')'")
                self.pos += 1
                items.append(group)
            elif ch == ".":
                self.pos += 1
                items.append(AnyChar())
            elif ch in ("*", "+", "?", "{"):
                if not items or items[-1] == Literal([]):  # "" adds no element to repeat
                    raise self.fail("expecting preceding item to */+/?/{")
                items[-1] = self.repeat(items[-1], nested)
                continue  # repeat() skipped the space after it
            else:
                return items
            self.space(nested)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > self.max_nesting:
            raise self.fail(f"groups or repetitions nested deeper than {self.max_nesting} levels")

    def char_class(self) -> CharClass:
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            start = self.char()
            end = start
            if self.peek() == "-" and self.peek(1) != "]":
                if self.peek(1) == "":
                    raise self.fail("unexpected end of input")
                self.pos += 1
                end = self.char()
            ranges.append((start, end))
        self.pos += 1
        return CharClass(ranges, negated)

    def token(self) -> TokenRef:
        negated = self.peek() == "!"
        if negated:
            self.pos += 1
        if self.peek() != "<":
            raise self.fail("expecting '<'")
        end = self.src.find(">", self.pos)
        if end < 0:
            raise self.fail("expecting '>'")
        spec = self.src[self.pos + 1 : end]
        if spec.startswith("[") and not (spec.endswith("]") and spec[1:-1].isdigit()):
            raise self.fail("expecting a token id as <[id]>")
        self.pos = end + 1
        return TokenRef(spec, negated)

    def repeat(self, item: Item, nested: bool) -> Repeat:
        if _repeat_depth(item) >= self.max_nesting:
            raise self.fail(f"groups or repetitions nested deeper than {self.max_nesting} levels")
        ch = self.peek()
        self.pos += 1
        self.space(nested)
        if ch == "*":
            return Repeat(item, 0, None)
        if ch == "+":
            return Repeat(item, 1, None)
        if ch == "?":
            return Repeat(item, 0, 1)
        low = self.integer()
        self.space(nested)
        high: int | None = low
        if self.peek() == ",":
            self.pos += 1
            self.space(nested)
            high = self.integer() if self.peek().isdigit() else None
            self.space(nested)
        elif self.peek() != "}":
            raise self.fail("expecting ','")
        if self.peek() != "}":
            raise self.fail("expecting '}'")
        self.pos += 1
        self.space(nested)
        return Repeat(item, low, high)


def _repeat_depth(item: Item) -> int:
    depth = 0
    while isinstance(item, Repeat):
        depth += 1
        item = item.item
    return depth


def parse_grammar(text: str, max_nesting: int = 64) -> Grammar:
    """The rules of `text`; GrammarSyntaxError where llama.cpp's parser would fail, or
    where groups or repetitions nest deeper than `max_nesting`."""
    return _Parser(text, max_nesting).parse()
