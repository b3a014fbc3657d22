"""Deterministic synthetic text: filler prose, logs, JSON, source files, names and numbers.

Everything is drawn from a `random.Random` the caller seeds, so a benchmark's data is
the same on every machine and every run.
"""

from __future__ import annotations

import json
import random

ADJECTIVES = (
    "quiet",
    "old",
    "narrow",
    "bright",
    "distant",
    "wooden",
    "busy",
    "green",
    "small",
    "heavy",
    "cold",
    "crowded",
    "ancient",
    "modern",
    "hidden",
    "steep",
    "calm",
    "tall",
)
NOUNS = (
    "river",
    "market",
    "bridge",
    "library",
    "garden",
    "harbor",
    "village",
    "tower",
    "forest",
    "station",
    "museum",
    "orchard",
    "workshop",
    "valley",
    "lighthouse",
    "mill",
)
ACTORS = (
    "the baker",
    "a traveler",
    "the teacher",
    "an engineer",
    "the fisherman",
    "a painter",
    "the mayor",
    "a student",
    "the gardener",
    "a merchant",
    "the musician",
    "a doctor",
)
VERBS = (
    "walked past",
    "wrote about",
    "repaired",
    "photographed",
    "described",
    "visited",
    "measured",
    "cleaned",
    "painted",
    "studied",
    "forgot about",
    "talked about",
)
TIMES = (
    "early in the morning",
    "after the rain",
    "during the festival",
    "late at night",
    "before the winter",
    "on a windy afternoon",
    "every second Sunday",
    "in the spring",
)
CLAUSES = (
    "and nobody seemed to mind",
    "while the bells were ringing",
    "as the tide came in",
    "because the road was closed",
    "although it was getting late",
    "and then went home",
    "without saying a word",
    "as people had done for centuries",
)
SERVICES = ("api", "auth", "billing", "search", "worker", "gateway", "scheduler", "indexer")
LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
PATHS = ("/v1/items", "/v1/users", "/v1/orders", "/health", "/v1/search", "/v1/login")
FIRST_NAMES = (
    "Alice",
    "Bruno",
    "Clara",
    "Daniel",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Keiko",
    "Luca",
    "Maya",
    "Nadia",
    "Oscar",
    "Priya",
    "Quentin",
    "Rosa",
    "Samir",
    "Tara",
)
CITIES = (
    "Lisbon",
    "Porto",
    "Oslo",
    "Lyon",
    "Kyoto",
    "Quito",
    "Dublin",
    "Krakow",
    "Seville",
    "Bergen",
    "Tallinn",
    "Valencia",
    "Graz",
    "Utrecht",
    "Turin",
    "Malmo",
)
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white")
ANIMALS = ("dog", "cat", "parrot", "rabbit", "turtle", "hamster")
PET_NAMES = ("Biscuit", "Pepper", "Mochi", "Rocket", "Luna", "Ziggy", "Noodle", "Waffles")
VAULTS = ("amber", "cobalt", "granite", "juniper", "obsidian", "saffron", "tundra", "velvet")


def passkey(rng: random.Random) -> str:
    """A five-digit pass key without a leading zero."""
    return str(rng.randrange(10000, 100000))


def filler_sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(ACTORS).capitalize()} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} "
        f"{rng.choice(NOUNS)} {rng.choice(TIMES)}, {rng.choice(CLAUSES)}."
    )


def filler_paragraph(rng: random.Random, n_sentences: int) -> str:
    return " ".join(filler_sentence(rng) for _ in range(n_sentences))


def log_lines(rng: random.Random, n_lines: int, start_second: int = 0) -> list[str]:
    """Service log lines with increasing timestamps."""
    lines = []
    second = start_second
    for _ in range(n_lines):
        second += rng.randrange(1, 9)
        hh, mm, ss = (second // 3600) % 24, (second // 60) % 60, second % 60
        service = f"{rng.choice(SERVICES)}-{rng.randrange(1, 5)}"
        lines.append(
            f"2024-05-12T{hh:02d}:{mm:02d}:{ss:02d}Z {rng.choice(LEVELS)} {service} "
            f"request_id={rng.randrange(16**6):06x} path={rng.choice(PATHS)} "
            f"status={rng.choice((200, 200, 200, 201, 404, 500))} latency_ms={rng.randrange(3, 900)}"
        )
    return lines


def json_records(rng: random.Random, n_records: int) -> str:
    """A JSON array of order-like records."""
    records = [
        {
            "id": rng.randrange(100000, 999999),
            "customer": rng.choice(FIRST_NAMES),
            "city": rng.choice(CITIES),
            "items": rng.randrange(1, 9),
            "total_eur": round(rng.uniform(3, 500), 2),
            "status": rng.choice(("paid", "shipped", "pending", "refunded")),
        }
        for _ in range(n_records)
    ]
    return json.dumps(records, indent=1)


def source_file(rng: random.Random, n_functions: int) -> str:
    """A small Python module with arithmetic helper functions."""
    parts = ['"""Helpers for the inventory service."""', ""]
    for i in range(n_functions):
        name = (
            f"{rng.choice(('compute', 'load', 'merge', 'check', 'update'))}_{rng.choice(NOUNS)}_{i}"
        )
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        parts += [
            f"def {name}(value: int, limit: int = {a}) -> int:",
            f'    """Scale value by {b} and clamp it to limit."""',
            f"    result = value * {b}",
            "    if result > limit:",
            "        return limit",
            "    return result",
            "",
        ]
    return "\n".join(parts)


def tool_output(rng: random.Random, kind: int, size: int) -> str:
    """One tool result of roughly `size` units: kind 0 logs, 1 JSON, 2 source, 3 prose."""
    kind %= 4
    if kind == 0:
        return "\n".join(log_lines(rng, size, rng.randrange(0, 80000)))
    if kind == 1:
        return json_records(rng, max(1, size // 3))
    if kind == 2:
        return source_file(rng, max(1, size // 3))
    return filler_paragraph(rng, size)
