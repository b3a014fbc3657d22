"""Every route bounded before it works (issue 28), through the app on the fake engine:
the chat route's size pre-check on /completion, /v1/completions, /tokenize, /detokenize,
/apply-template and input_tokens; ids outside the vocabulary; temperature caps; a NUL in
a file:// image path."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvmem.chat.images import ImageCollector
from kvmem.errors import InvalidRequestError
from kvmem.server.app import create_app
from tests.fakes.app import settings, wait_ready
from tests.fakes.engine import FakeEngine, FakeInfo

N_CTX = 4096
LONG = "x" * (4 * N_CTX)  # at 4 characters a token at most: at least 4096 tokens


@dataclass(frozen=True)
class SizedInfo(FakeInfo):
    max_token_chars: int = 4


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = FakeEngine(info=SizedInfo())
    with TestClient(create_app(settings(), lambda _: engine)) as c:
        wait_ready(c)
        yield c


def _error(r) -> tuple[int, str, str | None, str]:  # type: ignore[no-untyped-def]
    body = r.json()
    return r.status_code, body["error"]["type"], body["error"]["param"], body["error"]["message"]


TOO_LONG = (
    f"the request has {len(LONG)} characters, at least 4096 tokens, "
    "more than the context size of 4096 tokens"
)


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/completion", {"prompt": LONG}),
        ("/completion", {"prompt": ["short", LONG]}),  # each prompt of a batch
        ("/v1/completions", {"prompt": LONG}),
        ("/tokenize", {"content": LONG}),
        ("/tokenize", {"content": LONG, "parse_special": False}),
        ("/apply-template", {"messages": [{"role": "user", "content": LONG}]}),
        ("/v1/chat/completions/input_tokens", {"messages": [{"role": "user", "content": LONG}]}),
    ],
)
def test_text_longer_than_the_context_is_refused_first(
    client: TestClient, route: str, body: dict
) -> None:
    status, kind, _, message = _error(client.post(route, json=body))
    assert (status, kind, message) == (400, "exceed_context_size_error", TOO_LONG)


@pytest.mark.parametrize(
    ("route", "body", "n"),
    [
        ("/detokenize", {"tokens": [65] * 5000}, 5000),
        ("/completion", {"prompt": [65] * 4096}, 4096),
        ("/tokenize", {"content": [65] * 4096}, 4096),
    ],
)
def test_more_ids_than_the_context_are_refused(
    client: TestClient, route: str, body: dict, n: int
) -> None:
    status, kind, _, message = _error(client.post(route, json=body))
    assert (status, kind) == (400, "exceed_context_size_error")
    assert message == f"the request ({n} tokens) exceeds the available context size (4096 tokens)"


@pytest.mark.parametrize("bad", [-1, 0x110000, 2**40])
@pytest.mark.parametrize("add_special", [False, True])
def test_tokenize_ids_outside_the_vocabulary(
    client: TestClient, bad: int, add_special: bool
) -> None:
    r = client.post("/tokenize", json={"content": [bad], "add_special": add_special})
    assert _error(r) == (
        400,
        "invalid_request_error",
        "content",
        f"token id {bad} is out of range (vocabulary of {0x110000})",
    )


def test_tokenize_and_detokenize_still_work(client: TestClient) -> None:
    assert client.post("/tokenize", json={"content": "Hi"}).json() == {"tokens": [72, 105]}
    assert client.post("/tokenize", json={"content": [72, "i"]}).json() == {"tokens": [72, 105]}
    assert client.post("/detokenize", json={"tokens": [72, 105]}).json() == {"content": "Hi"}


@pytest.mark.parametrize("route", ["/completion", "/v1/completions"])
@pytest.mark.parametrize(("field", "limit"), [("temperature", 100), ("repeat_penalty", 100)])
def test_completion_sampling_caps_match_chat(
    client: TestClient, route: str, field: str, limit: int
) -> None:
    r = client.post(route, json={"prompt": "x", field: 1e308})
    chat = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], field: 1e308}
    )
    assert r.status_code == chat.status_code == 400
    assert _error(r)[:3] == (400, "invalid_request_error", field)
    assert f"less than or equal to {limit}" in _error(r)[3]
    assert f"less than or equal to {limit}" in _error(chat)[3]


def test_nul_in_a_file_url_is_a_400(tmp_path: Path) -> None:
    collector = ImageCollector(str(tmp_path))
    with pytest.raises(InvalidRequestError) as caught:
        collector.add({"url": "file:///a%00b.png"}, "messages[0].content[0].image_url")
    assert str(caught.value) == "messages[0].content[0].image_url: the path holds a NUL character"
