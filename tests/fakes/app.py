"""Helpers for in-process tests of the HTTP app on the fake engine."""

from __future__ import annotations

import json
import time

from fastapi.testclient import TestClient

from kvmem.engine_settings import EngineSettings
from kvmem.server.settings import ServerSettings

USER = [{"role": "user", "content": "Hi"}]
PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def settings(**kw: object) -> ServerSettings:
    base = {"engine": EngineSettings(model_path="/models/fake-model.gguf"), "ui": False}
    base.update(kw)
    return ServerSettings(**base)  # type: ignore[arg-type]


def wait_ready(client: TestClient) -> None:
    for _ in range(200):
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.01)
    raise AssertionError("the fake engine never became ready")


def sse_events(text: str) -> list[object]:
    out: list[object] = []
    for block in text.strip().split("\n\n"):
        assert block.startswith("data: ")
        payload = block[len("data: ") :]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
