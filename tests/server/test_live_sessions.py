"""Sessions a client steers (issue 29, item 4), on a real kvmem-server (SmolLM2).

`{"kvmem": {"conversation_id": ...}}` picks the conversation; `max_tokens: 0` processes
the prompt only and keeps its KV; `GET /kvmem/conversations/{id}` shows it and `DELETE`
frees its host memory (the store's byte count drops by what it held).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server

KEY = "sk-sessions"
BASE = ("-c", "4096", "--kvmem-budget", "1024", "--kvmem-gen-reserve", "512", "-t", "2")
BASE += ("--metrics", "--api-key", KEY)
ARGS = (*BASE, "--kvmem-conversations", "2")
AUTH = {"Authorization": f"Bearer {KEY}"}
RULES = " ".join(f"Rule {i}: answer briefly about topic {i}." for i in range(30))
SYSTEM = {"role": "system", "content": RULES}  # over two 128-token blocks


@pytest.fixture(scope="module")
def server(server_logs: Path) -> Iterator[LiveServer]:
    live = start_server(ARGS, server_logs)
    yield live
    assert live.stop() == 0, live.log()[-3000:]


def post(server: LiveServer, path: str, body: dict) -> dict:
    r = httpx.post(server.base_url + path, json=body, headers=AUTH, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def conversation(server: LiveServer, name: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}/kvmem/conversations/{name}", headers=AUTH, timeout=60)


def store_bytes(server: LiveServer) -> int:
    text = httpx.get(server.base_url + "/metrics", headers=AUTH, timeout=60).text
    found = re.search(r"^kvmem_host_store_bytes (\S+)$", text, re.M)
    assert found is not None, text
    return int(float(found.group(1)))


def assert_not_found(r: httpx.Response) -> None:
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {
        "message": "no conversation with id 'alpha'",
        "type": "invalid_request_error",
        "param": "conversation_id",
        "code": "not_found",
    }


def test_prefill_only_then_a_turn_reuses_it_and_delete_frees_it(server: LiveServer) -> None:
    first = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
    named = {"kvmem": {"conversation_id": "alpha"}}
    warm = post(server, "/v1/chat/completions", {"messages": first, "max_tokens": 0, **named})
    assert warm["choices"][0]["message"]["content"] == ""
    assert warm["choices"][0]["finish_reason"] == "length"
    n_first = warm["usage"]["prompt_tokens"]
    assert warm["usage"]["completion_tokens"] == 0 and n_first > 256
    shown = conversation(server, "alpha").json()
    assert shown["tokens"] == n_first and shown["host_blocks"] == n_first // 128
    assert shown["active"] is True and shown["host_bytes"] > 0

    second = [*first, {"role": "assistant", "content": "Paris."}]
    second.append({"role": "user", "content": "And of Spain?"})
    body = {"messages": second, "max_tokens": 4, "temperature": 0, **named}
    turn = post(server, "/v1/chat/completions", body)
    assert turn["usage"]["prompt_tokens_details"]["cached_tokens"] == n_first
    assert turn["usage"]["completion_tokens"] >= 1

    # an unnamed request with the same prompt never enters the named conversation
    other = post(server, "/v1/chat/completions", {"messages": first, "max_tokens": 1})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert conversation(server, "alpha").json()["active"] is False

    held = conversation(server, "alpha").json()["host_bytes"]
    before = store_bytes(server)
    r = httpx.delete(f"{server.base_url}/kvmem/conversations/alpha", headers=AUTH, timeout=600)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "id": "alpha",
        "object": "kvmem.conversation.deleted",
        "deleted": True,
        "freed_bytes": held,
    }
    assert store_bytes(server) == before - held
    assert_not_found(conversation(server, "alpha"))
    assert_not_found(httpx.delete(f"{server.base_url}/kvmem/conversations/alpha", headers=AUTH))
    unkeyed = httpx.get(f"{server.base_url}/kvmem/conversations/alpha", timeout=60)
    assert unkeyed.status_code == 401


def test_completions_prefill_only_then_continue(server: LiveServer) -> None:
    prompt = "Once upon a time " * 40
    named = {"kvmem": {"conversation_id": "beta"}}
    warm = post(server, "/completion", {"prompt": prompt, "n_predict": 0, **named})
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    assert warm["stop_type"] == "limit"
    n_warm = warm["tokens_evaluated"]
    assert conversation(server, "beta").json()["tokens"] == n_warm
    more = {"prompt": prompt + "there was", "max_tokens": 2, "temperature": 0, **named}
    turn = post(server, "/v1/completions", more)
    assert turn["usage"]["prompt_tokens_details"]["cached_tokens"] >= n_warm - 1


def test_anthropic_and_responses_take_the_conversation_id(server: LiveServer) -> None:
    ask = [{"role": "user", "content": "Hi"}]
    message = {"model": "smol", "max_tokens": 2, "messages": ask}
    post(server, "/v1/messages", {**message, "kvmem": {"conversation_id": "gamma"}})
    post(server, "/v1/responses", {"input": "Hi", "max_output_tokens": 2,
                                    "kvmem": {"conversation_id": "delta"}})  # fmt: skip
    gamma = conversation(server, "gamma").json()
    delta = conversation(server, "delta").json()
    assert gamma["tokens"] > 0 and delta["tokens"] > 0
    assert delta["active"] is True and gamma["active"] is False


def test_lanes_route_by_id_and_another_id_takes_the_lane(server_logs: Path) -> None:
    """One conversation per lane (the default): the named turn goes to its lane; a request
    with another id that lands on that lane takes it, and the first id is gone."""
    lanes = start_server((*BASE, "--parallel", "2"), server_logs)
    try:
        first = [SYSTEM, {"role": "user", "content": "Name a colour."}]
        solo = {"kvmem": {"conversation_id": "solo"}}
        post(lanes, "/v1/chat/completions", {"messages": first, "max_tokens": 0, **solo})
        shown = conversation(lanes, "solo").json()
        second = [*first, {"role": "assistant", "content": "Blue."}]
        second.append({"role": "user", "content": "Another?"})
        body = {"messages": second, "max_tokens": 2, **solo}
        turn = post(lanes, "/v1/chat/completions", body)
        assert turn["usage"]["prompt_tokens_details"]["cached_tokens"] == shown["tokens"]
        assert conversation(lanes, "solo").json()["lane"] == shown["lane"]
        other = {"kvmem": {"conversation_id": "other"}}  # shares the prefix: the same lane
        post(lanes, "/v1/chat/completions", {"messages": first, "max_tokens": 1, **other})
        assert conversation(lanes, "other").json()["lane"] == shown["lane"]
        assert conversation(lanes, "solo").status_code == 404
    finally:
        assert lanes.stop() == 0, lanes.log()[-3000:]
