"""LongMemEval-style episodes: personal facts planted early, questions many turns later.

An episode is one long conversation of chat and tool sessions. Facts are planted in the
first third (some by the user, some inside tool results), a few are updated around the
middle, and filler sessions follow up to the target length. Then each question is asked
on its own as the final user turn. Question types: `single` (one fact), `multi` (two
facts combined) and `update` (the latest value of a fact that changed).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from kvmem.bench import content
from kvmem.bench.conversation import Message, Role

SYSTEM_PROMPT = "You are a helpful personal assistant. Remember what the user tells you."


class QuestionType(Enum):
    SINGLE = "single"
    MULTI = "multi"
    UPDATE = "update"


@dataclass(frozen=True, slots=True)
class Question:
    qtype: QuestionType
    text: str
    answer_prefix: str
    expected: tuple[str, ...]  # every string must appear in the answer (case-insensitive)
    form_field: str = ""  # the `--final tool` variant: the form field that asks for it
    form_label: str = ""  # ... and the field's question, about "the user"


@dataclass(slots=True)
class Episode:
    seed: int
    history: list[Message]
    questions: list[Question]


@dataclass(frozen=True, slots=True)
class _Facts:
    dog: str
    cat: str
    sister: str
    sister_city: str
    color: str
    port: int
    old_city: str
    new_city: str
    old_car: str
    new_car: str


def _draw_facts(rng: random.Random) -> _Facts:
    dog, cat = rng.sample(content.PET_NAMES, 2)
    old_city, new_city, sister_city = rng.sample(content.CITIES, 3)
    color, old_car, new_car = rng.sample(content.COLORS, 3)
    return _Facts(
        dog=dog,
        cat=cat,
        sister=rng.choice(content.FIRST_NAMES),
        sister_city=sister_city,
        color=color,
        port=rng.randrange(2000, 9000),
        old_city=old_city,
        new_city=new_city,
        old_car=old_car,
        new_car=new_car,
    )


def _plant(f: _Facts) -> list[list[Message]]:
    """Sessions that state the facts (first values of the updated ones)."""
    return [
        [
            Message(
                Role.USER,
                f"I just adopted a dog. His name is {f.dog}. Any tips for the first week?",
            ),
            Message(
                Role.ASSISTANT,
                f"Congratulations on adopting {f.dog}! Keep a calm routine and short walks.",
            ),
        ],
        [
            Message(Role.USER, f"I live in {f.old_city}. What is a good weekend activity here?"),
            Message(
                Role.ASSISTANT, f"In {f.old_city} you could visit the old town and a local market."
            ),
        ],
        [
            Message(
                Role.USER,
                f"My sister {f.sister} lives in {f.sister_city}. I want to send her a gift.",
            ),
            Message(
                Role.ASSISTANT,
                f"A local specialty from your city would make a nice gift for {f.sister}.",
            ),
        ],
        [
            Message(Role.USER, "Please read the staging config."),
            Message(
                Role.ASSISTANT,
                '<tool_call>{"name": "read_file", "arguments": {"path": "config/staging.ini"}}</tool_call>',
            ),
            Message(
                Role.TOOL,
                f"[server]\nhost = staging.internal\nport = {f.port}\nworkers = 4\n[db]\nname = orders\n",
            ),
            Message(Role.ASSISTANT, f"The staging server listens on port {f.port} with 4 workers."),
        ],
        [
            Message(Role.USER, f"My favorite color is {f.color}. Can you suggest a scarf?"),
            Message(Role.ASSISTANT, f"A soft wool scarf in {f.color} would suit you."),
        ],
        [
            Message(
                Role.USER, f"We also have a cat called {f.cat}. She does not like the dog yet."
            ),
            Message(
                Role.ASSISTANT, f"Give {f.cat} a quiet room of her own and introduce them slowly."
            ),
        ],
        [
            Message(Role.USER, f"My car is {f.old_car}. Is it hard to keep clean?"),
            Message(Role.ASSISTANT, f"A {f.old_car} car shows dust less than you might think."),
        ],
    ]


def _updates(f: _Facts) -> list[list[Message]]:
    return [
        [
            Message(Role.USER, f"Big news: I moved from {f.old_city} to {f.new_city} last week."),
            Message(Role.ASSISTANT, f"Congratulations on the move to {f.new_city}!"),
        ],
        [
            Message(
                Role.USER, f"I had my car repainted. It is {f.new_car} now instead of {f.old_car}."
            ),
            Message(Role.ASSISTANT, f"A {f.new_car} car, nice choice."),
        ],
    ]


def _questions(f: _Facts) -> list[Question]:
    return [
        Question(
            QuestionType.SINGLE,
            "What is my dog's name?",
            "Your dog's name is",
            (f.dog,),
            "dog_name",
            "What is the name of the user's dog?",
        ),
        Question(
            QuestionType.SINGLE,
            "What is my favorite color?",
            "Your favorite color is",
            (f.color,),
            "favorite_color",
            "What is the user's favorite color?",
        ),
        Question(
            QuestionType.SINGLE,
            "Which port does the staging server listen on?",
            "The staging server listens on port",
            (str(f.port),),
            "staging_port",
            "Which port does the user's staging server listen on?",
        ),
        Question(
            QuestionType.MULTI,
            "What are the names of my dog and my cat?",
            "Your dog is called",
            (f.dog, f.cat),
            "pet_names",
            "What are the names of the user's dog and cat?",
        ),
        Question(
            QuestionType.MULTI,
            "What is my sister's name, and in which city does she live?",
            "Your sister is",
            (f.sister, f.sister_city),
            "sister",
            "What is the name of the user's sister, and in which city does she live?",
        ),
        Question(
            QuestionType.UPDATE,
            "Which city do I live in now?",
            "You live in",
            (f.new_city,),
            "home_city",
            "Which city does the user live in now?",
        ),
        Question(
            QuestionType.UPDATE,
            "What color is my car now?",
            "Your car is",
            (f.new_car,),
            "car_color",
            "What color is the user's car now?",
        ),
    ]


def _filler_session(rng: random.Random, index: int) -> list[Message]:
    if index % 3 == 2:
        kind = rng.randrange(3)
        return [
            Message(Role.USER, "Can you check the latest service output?"),
            Message(
                Role.ASSISTANT,
                '<tool_call>{"name": "run_command", "arguments": {"cmd": "status"}}</tool_call>',
            ),
            Message(Role.TOOL, content.tool_output(rng, kind, rng.randrange(8, 16))),
            Message(Role.ASSISTANT, "The output looks normal; nothing needs attention."),
        ]
    paragraph = content.filler_paragraph(rng, rng.randrange(4, 9))
    return [
        Message(
            Role.USER,
            f"Here is a passage from a travel book I am reading: {paragraph} What do you think?",
        ),
        Message(Role.ASSISTANT, f"It is a vivid passage. {content.filler_sentence(rng)}"),
    ]


def build_episode(seed: int, target_tokens: int, count_tokens: Callable[[str], int]) -> Episode:
    """An episode whose history is about `target_tokens` long (measured by `count_tokens`)."""
    rng = random.Random(f"agent/{seed}")
    facts = _draw_facts(rng)
    planted, updates = _plant(facts), _updates(facts)
    rng.shuffle(planted)
    fillers: list[list[Message]] = []
    used = sum(count_tokens(m.content) + 5 for s in planted + updates for m in s) + 40
    while used < target_tokens:
        session = _filler_session(rng, len(fillers))
        used += sum(count_tokens(m.content) + 5 for m in session)
        fillers.append(session)
    # planted facts spread over the first third, updates around the middle
    n = len(fillers)
    before: dict[int, list[list[Message]]] = {}
    for i, session in enumerate(planted):
        before.setdefault(i * n // (3 * len(planted)), []).append(session)
    for i, session in enumerate(updates):
        before.setdefault(n // 2 + i, []).append(session)
    sessions: list[list[Message]] = []
    for i in range(max([n, *before]) + 1):
        sessions += before.get(i, [])
        if i < n:
            sessions.append(fillers[i])
    history = [Message(Role.SYSTEM, SYSTEM_PROMPT)] + [m for s in sessions for m in s]
    return Episode(seed=seed, history=history, questions=_questions(facts))


def is_correct(answer: str, question: Question) -> bool:
    text = answer.lower()
    return all(item.lower() in text for item in question.expected)
