"""`--slot-save-path` on a real server: save the KVMem session, talk about something else,
restore it, and the next turn reuses the restored history with the same greedy answer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TURN1 = [SYSTEM, {"role": "user", "content": "Name a fruit that is red."}]
OTHER = [
    {"role": "system", "content": "You are a pirate who answers in one line."},
    {"role": "user", "content": "What is the sea like today?"},
]


@pytest.fixture(scope="module")
def slot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    slots = tmp_path_factory.mktemp("slots")
    logs = tmp_path_factory.mktemp("slot-logs")
    server = start_server(
        ["-c", "2048", "-t", "2", "--temp", "0", "--slot-save-path", str(slots)], logs
    )
    yield server, slots
    assert server.stop() == 0


def chat(server: LiveServer, messages: list[dict]) -> tuple[str, int, int]:
    r = server.client().chat.completions.create(
        model="x", messages=messages, max_tokens=12, temperature=0
    )
    usage = r.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return r.choices[0].message.content or "", cached, usage.prompt_tokens


def slot(server: LiveServer, action: str, body: dict | None = None) -> dict:
    with server.http() as http:
        r = http.post(f"/slots/0?action={action}", json=body or {})
    assert r.status_code == 200, r.text
    return r.json()


def test_save_other_conversation_restore_then_the_next_turn_reuses_it(slot_server) -> None:
    server, slots = slot_server
    reply1, _, prompt1 = chat(server, TURN1)
    saved = slot(server, "save", {"filename": "fruit.bin"})
    assert saved["id_slot"] == 0 and saved["filename"] == "fruit.bin"
    assert (
        saved["n_saved"] >= prompt1 and saved["n_written"] == (slots / "fruit.bin").stat().st_size
    )
    assert saved["timings"]["save_ms"] >= 0

    turn2 = [*TURN1, {"role": "assistant", "content": reply1}, {"role": "user", "content": "Why?"}]
    answer, cached_direct, _ = chat(server, turn2)  # the reference: no interruption
    assert cached_direct >= prompt1

    chat(server, OTHER)  # another conversation replaces the session's history
    _, cached_after_other, _ = chat(server, OTHER)
    assert cached_after_other > 0

    restored = slot(server, "restore", {"filename": "fruit.bin"})
    assert restored["n_restored"] == saved["n_saved"]
    assert restored["n_read"] == saved["n_written"] and restored["timings"]["restore_ms"] > 0

    again, cached_restored, _ = chat(server, turn2)
    assert cached_restored == cached_direct  # the restored history is reused as before
    assert again == answer  # and the greedy answer is the same

    erased = slot(server, "erase")
    assert erased == {"id_slot": 0, "n_erased": erased["n_erased"]} and erased["n_erased"] > 0
    _, cached_erased, _ = chat(server, turn2)
    assert cached_erased == 0


def test_restoring_a_damaged_file_is_a_400_and_the_server_keeps_serving(slot_server) -> None:
    server, slots = slot_server
    slot(server, "save", {"filename": "ok.bin"})
    data = (slots / "ok.bin").read_bytes()
    (slots / "cut.bin").write_bytes(data[:-2])
    with server.http() as http:
        r = http.post("/slots/0?action=restore", json={"filename": "cut.bin"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "Unable to restore slot: the slot file is damaged"
        r = http.post("/slots/0?action=save", json={"filename": "../out.bin"})
        assert (r.status_code, r.json()["error"]["message"]) == (400, "Invalid filename")
    assert chat(server, TURN1)[0]


def test_a_255_byte_filename_saves_and_restores(slot_server) -> None:
    """The longest name the file system takes (the temporary file's name once passed it:
    a 500, issue 28); a byte more is a 400."""
    server, slots = slot_server
    chat(server, TURN1)
    for name in ("é" * 127 + "x", "n" * 251, "n" * 255):
        assert len(name.encode()) in (255, 251)
        saved = slot(server, "save", {"filename": name})
        assert saved["n_saved"] > 0 and (slots / name).is_file()
        assert slot(server, "restore", {"filename": name})["n_restored"] == saved["n_saved"]
    assert not list(slots.glob(".slot-*"))  # no temporary file left
    with server.http() as http:
        r = http.post("/slots/0?action=save", json={"filename": "n" * 256})
        assert (r.status_code, r.json()["error"]["message"]) == (400, "Invalid filename")
