"""The GBNF checker every grammar passes before llama.cpp (issue 28): exact messages for
the crash, wedge and memory cases, and generated grammars that are either refused with
an InvalidRequestError or parse to a tree the checks accept."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvmem.chat.grammar_ambiguity import max_live_parses
from kvmem.chat.grammar_check import check_grammar
from kvmem.chat.grammar_parse import CharClass, Literal, Repeat, RuleRef, parse_grammar
from kvmem.chat.json_grammar import json_object_grammar, json_schema_grammar
from kvmem.errors import InvalidRequestError

BIG = "x" * 250_000


@pytest.mark.parametrize(
    ("grammar", "message"),
    [
        (
            "root ::= [z-a]",
            "the character range z-a in rule 'root' is empty (its start is after its end)",
        ),
        (
            'root ::= "a" [z-a]',
            "the character range z-a in rule 'root' is empty (its start is after its end)",
        ),
        (
            'root ::= ("a"?){0,1000} "b"',
            "rule 'root' repeats an item that can match the empty text (make the inner item non-optional)",
        ),
        (
            'root ::= (("a"{0,20}){0,20}) "b"',
            "rule 'root' repeats an item that can match the empty text (make the inner item non-optional)",
        ),
        (
            'root ::= ("a"+)* "b"',
            "rule 'root' repeats an item that ends in a variable repetition of characters it can also start with (ambiguous, like (\"a\"+)*)",
        ),
        (
            'root ::= (w " "?)+\nw ::= [a-z]+',
            "rule 'root' repeats an item that ends in a variable repetition of characters it can also start with (ambiguous, like (\"a\"+)*)",
        ),
        (
            f'root ::= "{BIG}"{{1000}}',
            "a literal in rule 'root' has 250000 characters, more than 65536",
        ),
        (
            'root ::= "' + "y" * 60_000 + '"{100}',
            "about 6000001 elements after expanding its repetitions, more than the limit of 1000000",
        ),
        (
            'root ::= "a"{2000}',
            "rule 'root' repeats an item 2000 times: repetition counts are limited to 1000",
        ),
        (
            'root ::= "a"{5,2}',
            "rule 'root' repeats an item {5,2}: the minimum is above the maximum",
        ),
        (
            'root ::= (("ab"{1,100} ","){1,100} ";")',
            "rule 'root' nests repetitions whose counts multiply to 10000, more than the limit of 4096",
        ),
        ('root ::= x\nx ::= x "a" | "b"', "rule 'x' is left-recursive"),
        ('root ::= x "c"\nx ::= y x | "b"\ny ::= ""', "rule 'x' is left-recursive"),
        ("root ::= y", "rule 'root' uses the undefined rule 'y'"),
        ('rot ::= "a"', "there is no 'root' rule"),
        ('root ::= "a" x\nx ::= "b" x', "rule 'root' can never match anything"),
        ('root ::= "a" | x\nx ::= "b" x', "rule 'x' can never match anything"),
        ("root ::= [^\\x00-\\U0010FFFF]", "rule 'root' can never match anything"),
        ('root ::= "\\x00"', "rule 'root' can never match anything"),
        ("root ::= []", "rule 'root' has an empty character class"),
        (
            "root ::= " + "(" * 70 + '"a"' + ")" * 70,
            "groups or repetitions nested deeper than 64 levels at offset 74",
        ),
        (
            'root ::= "a"' + "?" * 70,
            "groups or repetitions nested deeper than 64 levels at offset 76",
        ),
        ("root ::= this is (not valid", "expecting ')' at offset 27"),
        ('root ::= "a"\n| "b"', "expecting name at offset 13"),
        ('root ::= "\\q"', "unknown escape at offset 10"),
        ('root ::= "\\u12"', "expecting 4 hex chars at offset 10"),
        ('root ::= "a" ::= "b"', "expecting newline or end at offset 13"),
        ("root ::= *", "expecting preceding item to */+/?/{ at offset 9"),
        ('root ::= ""?', "expecting preceding item to */+/?/{ at offset 11"),
        ('root ::= "a" ""{2}', "expecting preceding item to */+/?/{ at offset 15"),
        ('root ::= "a"{x}', "expecting an int at offset 13"),
        ('root ::= "a"\x00', "it holds a NUL character"),
        (
            "root ::= " + " | ".join(f'"v{i}"' for i in range(1100)),
            "rule 'root' has 1100 alternatives, more than 1024",
        ),
        ('root ::= "a" ' * 30_000, "390000 characters, more than 262144"),
        (
            "root ::= " + " | ".join(f'"common-prefix-{i}"' for i in range(200)),
            "more than 128 ways to parse the same text are alive at once (at the start); "
            "make the alternatives start differently",
        ),
    ],
)
def test_refused_with_the_reason(grammar: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check_grammar(grammar)
    assert str(caught.value) == f"invalid grammar: {message}"
    assert caught.value.param == "grammar"


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "a"',
        'root ::= ""',
        'root ::= ("a" | "b")* "c"',
        'root ::= (w " ")* w\nw ::= [a-z]+  # a comment',
        'root ::= [a-] [\\]\\-] [^"\\\\] . "\\x41\\u00e9\\U0001F600\\t\\n\\r"',
        "root ::= <[12]> !<[3]>",
        'root ::= ("a"\n | "b")\n\n# trailing comment',
        'root ::= "a"{3} "b"{0,} "c"{1,} "d"{2,4} "e"?',
        'root ::= ("[" [0-9]{1,3} "]"){0,10}',
        'root ::= "x" root | "y"',  # right recursion is fine
        json_object_grammar(),
        json_schema_grammar({"type": "array", "items": {"type": "string"}, "maxItems": 5}),
        json_schema_grammar({"type": "object", "properties": {"a": {"type": "number"}}}),
    ],
)
def test_accepted(grammar: str) -> None:
    check_grammar(grammar)


def test_parse_tree() -> None:
    g = parse_grammar('root ::= "ab" [^a-c] x{2,}\nx ::= "y"')
    seq = g.rules["root"][0]
    assert seq[0] == Literal([97, 98])
    assert seq[1] == CharClass([(97, 99)], negated=True)
    assert isinstance(seq[2], Repeat) and (seq[2].min, seq[2].max) == (2, None)
    assert seq[2].item == RuleRef("x", 21)


_GOOD_ATOMS = ['"a"', '"b"', '"ab"', '","', "[a-c]", "[^a]", "[0-9]", "x", "y", '"q"', '"z"']
_atoms = st.sampled_from([*_GOOD_ATOMS * 4, '""', "[c-a]", "."])  # rare bad ones
_GOOD_COUNTS = ["", "", "", "", "", "?", "*", "+", "{0,20}", "{1,3}", "{2}"]
_counts = st.sampled_from([*_GOOD_COUNTS * 3, "{0,1000}", "{3,1}", "{30}"])


def _items(depth: int) -> st.SearchStrategy[str]:
    if depth == 0:
        return st.tuples(_atoms, _counts).map("".join)
    inner = st.lists(_items(depth - 1), min_size=1, max_size=2).map(" ".join)
    group = st.lists(inner, min_size=1, max_size=2).map(lambda alts: "(" + " | ".join(alts) + ")")
    return st.tuples(group | _atoms, _counts).map("".join)


def _rules() -> st.SearchStrategy[str]:
    seq = st.lists(_items(2), min_size=1, max_size=3).map(" ".join)
    alts = st.lists(seq, min_size=1, max_size=3).map(" | ".join)
    enum = st.integers(1, 1100).map(lambda n: " | ".join(f'"prefix-{i}"' for i in range(n)))
    return st.tuples(alts, alts | enum, alts).map(
        lambda t: f"root ::= {t[0]}\nx ::= {t[1]}\ny ::= {t[2]}\n"
    )


GENERATED = _rules()


@settings(
    max_examples=600,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(GENERATED)
def test_generated_grammars_are_refused_or_sound(grammar: str) -> None:
    try:
        check_grammar(grammar)
    except InvalidRequestError as exc:
        assert str(exc).startswith("invalid grammar: ")
        return
    g = parse_grammar(grammar)
    assert set(g.rules) == {"root", "x", "y"}
    assert "[c-a]" not in grammar  # an inverted range is always refused
    assert "{3,1}" not in grammar  # so is min > max
    assert '""*' not in grammar and '""+' not in grammar  # an empty item repeated


def _nested_any_of(levels: int) -> dict[str, object]:
    defs: dict[str, object] = {}
    for k in range(levels):
        inner = {"$ref": f"#/$defs/l{k + 1}"} if k + 1 < levels else {"type": "integer"}
        alternatives = [{"type": "array", "items": inner, "maxItems": i + 1} for i in range(8)]
        defs[f"l{k}"] = {"anyOf": alternatives}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


def test_nested_any_of_schema_is_refused_after_conversion() -> None:
    """Issue 28: 5 levels of anyOf x 8 arrays of $ref wedged the engine thread."""
    with pytest.raises(InvalidRequestError) as caught:
        json_schema_grammar(_nested_any_of(5))
    assert str(caught.value) == (
        "invalid grammar: more than 128 ways to parse the same text are alive at once "
        "(after '[['); make the alternatives start differently"
    )
    assert caught.value.param == "response_format"
    json_schema_grammar(_nested_any_of(1))  # one level: 8 parses, fine


def test_large_enum_becomes_a_prefix_tree() -> None:
    """1,000 strings with a shared 58-character prefix kept 1,000 parses alive (25.6 s for
    40 tokens); as a prefix tree of rules one parse is alive."""
    values = ["x" * 58 + str(i) for i in range(1000)]
    grammar = json_schema_grammar({"enum": values})
    lines = dict(line.split(" ::= ", 1) for line in grammar.splitlines())
    assert (
        lines["root-value-t"]
        == '"\\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" root-value-t-2'
    )
    assert max_live_parses(parse_grammar(grammar), 1000).count <= 11


def _accepts(grammar: str, text: str) -> bool:
    """Whether llama.cpp's stack machine (as grammar_ambiguity runs it) accepts `text`."""
    from kvmem.chat.grammar_ambiguity import _Machine

    machine = _Machine(parse_grammar(grammar), cap=10_000)
    stacks: set = set()
    for alt in machine.rules["root"]:
        machine.advance(((alt, 0, 0),), stacks)
    for ch in text:
        stacks = machine.feed(stacks, ord(ch))
    return () in stacks


def test_enum_prefix_tree_matches_exactly_its_values() -> None:
    values = [1, 12, 123, "a", "ab", "", None, True, 1.5, 'é\n"', *[f"v{i}" for i in range(40)]]
    grammar = json_schema_grammar({"enum": values})
    for value in values:
        assert _accepts(grammar, json.dumps(value, ensure_ascii=False)), value
    for other in ["2", "1234", '"abc"', '"v40"', "false", '"v"', "12.5"]:
        assert not _accepts(grammar, other), other


def _schemas() -> st.SearchStrategy[object]:
    leaf = st.sampled_from(
        [
            {"type": "string"},
            {"type": "integer"},
            {"type": "string", "maxLength": 5},
            {"enum": ["a", "b", 3]},
            {"$ref": "#/$defs/d"},
            {"type": "array", "items": {"type": "number"}, "maxItems": 3},
            {"type": "array", "minItems": "abc"},
            {"anyOf": 5},
            True,
        ]
    )
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, min_size=1, max_size=8).map(lambda xs: {"anyOf": xs}),
            st.dictionaries(st.sampled_from("abcdefgh"), inner, min_size=1, max_size=5).map(
                lambda props: {"type": "object", "properties": props}
            ),
            inner.map(lambda x: {"type": "array", "items": x}),
        ),
        max_leaves=40,
    ).map(
        lambda s: (
            {"$defs": {"d": {"anyOf": [{"type": "array"}, {"$ref": "#/$defs/d"}]}}, **s}
            if isinstance(s, dict)
            else s
        )
    )


@settings(
    max_examples=500, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(_schemas())
def test_generated_schemas_are_refused_or_checked_grammars(schema: object) -> None:
    """A schema becomes a grammar only through the same checks: an InvalidRequestError
    naming response_format, or a grammar check_grammar accepts (never another error)."""
    try:
        grammar = json_schema_grammar(schema)
    except InvalidRequestError as exc:
        assert exc.param == "response_format"
        return
    check_grammar(grammar)
