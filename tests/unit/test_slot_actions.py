"""`POST /slots/{id}?action=...` validation and `--slot-save-path` (no model loaded)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError, InvalidRequestError
from kvmem.server.app import create_app
from kvmem.server.slot_routes import slot_file
from tests.fakes.app import settings, wait_ready
from tests.fakes.engine import FakeEngine


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(settings(slot_save_path=str(tmp_path)), lambda s: FakeEngine())
    with TestClient(app) as c:
        wait_ready(c)
        yield c


def error(r) -> tuple[int, str, str]:
    e = r.json()["error"]
    return r.status_code, e["type"], e["message"]


def test_without_the_flag_slot_actions_are_501() -> None:
    with TestClient(create_app(settings(), lambda s: FakeEngine())) as c:
        wait_ready(c)
        r = c.post("/slots/0?action=save", json={"filename": "a.bin"})
    assert error(r) == (
        501,
        "not_supported_error",
        "This server does not support slots action. Start it with `--slot-save-path`",
    )


@pytest.mark.parametrize(
    ("url", "body", "message"),
    [
        ("/slots/x?action=save", {"filename": "a"}, "Invalid slot ID"),
        ("/slots/1?action=save", {"filename": "a"}, "Invalid slot ID"),
        ("/slots/0?action=load", {"filename": "a"}, "Invalid action"),
        ("/slots/0", {"filename": "a"}, "Invalid action"),
        ("/slots/0?action=save", {}, "'filename' is required"),
        ("/slots/0?action=save", {"filename": "../escape.bin"}, "Invalid filename"),
        ("/slots/0?action=restore", {"filename": "/etc/passwd"}, "Invalid filename"),
        ("/slots/0?action=save", {"filename": ".."}, "Invalid filename"),
        ("/slots/0?action=save", {"filename": "a\\b"}, "Invalid filename"),
        ("/slots/0?action=save", {"filename": ""}, "Invalid filename"),
        ("/slots/0?action=save", {"filename": 7}, "Invalid filename"),
        ("/slots/0?action=save", {"filename": "x" * 256}, "Invalid filename"),
        ("/slots/0?action=restore", {"filename": "missing.bin"}, "Unable to restore slot: no file missing.bin"),
    ],
)  # fmt: skip
def test_bad_slot_requests_are_400(client: TestClient, url: str, body: object, message: str):
    assert error(client.post(url, json=body)) == (400, "invalid_request_error", message)


def test_a_file_that_is_not_a_slot_file_is_refused(client: TestClient, tmp_path: Path) -> None:
    (tmp_path / "junk.bin").write_bytes(b"not a slot")
    r = client.post("/slots/0?action=restore", json={"filename": "junk.bin"})
    assert error(r) == (
        400,
        "invalid_request_error",
        "Unable to restore slot: not a kvmem slot file",
    )


def test_slot_file_stays_inside_the_directory(tmp_path: Path) -> None:
    assert slot_file(str(tmp_path), "s1.bin") == tmp_path.resolve() / "s1.bin"
    (tmp_path / "evil").symlink_to("/etc/passwd")  # a name that leads out of the directory
    with pytest.raises(InvalidRequestError) as info:
        slot_file(str(tmp_path), "evil")
    assert str(info.value) == "Invalid filename"


def test_slot_save_path_flag(tmp_path: Path) -> None:
    s, _ = load_server_settings(["--slot-save-path", str(tmp_path)], {})
    assert s.slot_save_path == str(tmp_path.resolve())
    env, _ = load_server_settings([], {"LLAMA_ARG_SLOT_SAVE_PATH": str(tmp_path)})
    assert env.slot_save_path == str(tmp_path.resolve())
    assert load_server_settings([], {})[0].slot_save_path is None
    with pytest.raises(ConfigError) as info:
        load_server_settings(["--slot-save-path", str(tmp_path / "nope")], {})
    assert str(info.value) == f"--slot-save-path: {tmp_path / 'nope'} is not a directory"
