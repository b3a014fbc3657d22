"""kvmem-cli -i in a real terminal (tmux): the banner, /help, Ctrl-C stopping a reply while
the chat goes on, the next message answered, /trace switching the KVMem trace (records on
their own lines) and /save writing the conversation as JSON."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]


class Pane:
    def __init__(self, command: str) -> None:
        self.name = f"kvmem-cli-{uuid.uuid4().hex[:8]}"
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.name, "-x", "200", "-y", "50", command],
            check=True,
        )

    def text(self) -> str:
        got = subprocess.run(
            ["tmux", "capture-pane", "-p", "-J", "-S", "-200", "-t", self.name],
            capture_output=True,
            text=True,
        )
        return got.stdout

    def send(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, needle: str, after: int = 0, timeout: float = 120) -> str:
        """The pane once `needle` shows at or after offset `after`; fails on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text[after:]:
                return text
            time.sleep(0.2)
        raise AssertionError(f"{needle!r} never showed:\n{self.text()}")

    def alive(self) -> bool:
        return subprocess.run(["tmux", "has-session", "-t", self.name]).returncode == 0

    def kill(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is needed for a real terminal")
def test_interactive_chat_banner_help_and_ctrl_c(tmp_path: Path) -> None:
    status, saved = tmp_path / "status", tmp_path / "chat.json"
    cli = [sys.executable, "-m", "kvmem.console.chat", "-i", "--temp", "0", "-n", "400"]
    pane = Pane(f"{shlex.join(cli)}; echo $? > {status}")
    try:
        text = pane.wait_for("Ctrl-C stops a reply.")
        assert "kvmem-cli: chat with SmolLM2-135M-Instruct.Q4_1.gguf (8192-token context," in text
        pane.send("/help", "Enter")
        pane.wait_for("Ctrl-C while a reply is written stops that reply")
        start = len(pane.text())
        pane.send("Tell me a very long story about a cat who travels the world.", "Enter")
        pane.wait_for("The", after=start)  # the reply is being written
        pane.send("C-c")
        text = pane.wait_for("[stopped]", after=start)
        stopped_at = text.index("[stopped]", start)
        pane.wait_for("> ", after=stopped_at)
        pane.send("What is the capital city of Japan?", "Enter")
        pane.wait_for("Tokyo", after=stopped_at)
        pane.send("/trace", "Enter")
        text = pane.wait_for("(KVMem trace on: KVMEM_* records on stderr)", after=stopped_at)
        traced_from = text.index("(KVMem trace on")
        pane.send("Say hi.", "Enter")
        text = pane.wait_for("KVMEM_GEN ", after=traced_from)
        assert any(line.startswith("KVMEM_GEN tokens=") for line in text.splitlines())
        pane.send("/trace", "Enter")
        pane.wait_for("(KVMem trace off)", after=traced_from)
        pane.send(f"/save {saved}", "Enter")
        pane.wait_for(f"(saved 6 messages to {saved})", after=traced_from)
        messages = json.loads(saved.read_text())["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * 3
        assert messages[0]["content"].startswith("Tell me a very long story")
        assert messages[2]["content"] == "What is the capital city of Japan?"
        assert "Tokyo" in messages[3]["content"] and messages[4]["content"] == "Say hi."
        pane.send("/exit", "Enter")
        deadline = time.monotonic() + 60
        while pane.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status.read_text().strip() == "0"
    finally:
        pane.kill()
