"""Robustness on the real server: client disconnects, malformed requests, concurrency."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import LiveServer

pytestmark = pytest.mark.slow

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def metric(server: LiveServer, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def gen_records(server: LiveServer) -> list[str]:
    return re.findall(r"^KVMEM_GEN .*$", server.log(), re.M)


def test_disconnect_mid_stream_stops_generation_and_the_next_request_reuses_the_session(
    main_server: LiveServer,
) -> None:
    before = len(gen_records(main_server))
    body = {"messages": STORY, "stream": True, "max_tokens": 400, "temperature": 0}
    with (
        httpx.Client(base_url=main_server.base_url, timeout=600) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]  # role chunk and a few content chunks
    assert received[0].startswith("data: ")
    deadline = time.monotonic() + 120
    while len(gen_records(main_server)) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    record = gen_records(main_server)[before]
    assert "finish=cancelled" in record
    generated = int(re.search(r"tokens=(\d+)", record).group(1))  # type: ignore[union-attr]
    assert generated < 400

    follow_up = main_server.client().chat.completions.create(
        model="smol", messages=STORY, max_tokens=4, temperature=0
    )
    assert follow_up.choices[0].message.content
    assert follow_up.usage is not None and follow_up.usage.prompt_tokens_details is not None
    cached = follow_up.usage.prompt_tokens_details.cached_tokens
    assert (
        cached is not None and cached >= follow_up.usage.prompt_tokens - 1
    )  # at most the last token re-run


MALFORMED = [
    "not json at all",
    "[1, 2, 3]",
    "{}",
    '{"messages": []}',
    '{"messages": "hello"}',
    '{"messages": [{"role": "pirate", "content": "arr"}]}',
    '{"messages": [{"content": "no role"}]}',
    '{"messages": [{"role": "user", "content": 12}]}',
    '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}]}]}',
    '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}]}]}',
    '{"messages": [{"role": "user", "content": [{"type": "video"}]}]}',
    '{"messages": [{"role": "user", "content": "hi"}], "temperature": "warm"}',
    '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -7}',
    '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}',
    '{"messages": [{"role": "user", "content": "hi"}], "top_p": 7}',
    '{"messages": [{"role": "user", "content": "hi"}], "stream": "true"}',
    '{"messages": [{"role": "user", "content": "hi"}], "stop": {"a": 1}}',
    '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}',
    '{"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}',
    '{"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}',
    '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": "no"}}',
    '{"messages": [{"role": "user", "content": "hi"}], "n": 9}',
    '{"messages": [{"role": "user", "content": "hi"}], "reasoning_budget_tokens": -9}',
    '{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}',
]


def test_malformed_requests_get_4xx_with_the_openai_envelope(main_server: LiveServer) -> None:
    assert len(MALFORMED) >= 20
    with main_server.http() as http:
        for raw in MALFORMED:
            r = http.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert 400 <= r.status_code < 500, (raw, r.status_code, r.text)
            error = r.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"], raw
        assert http.get("/health").status_code == 200


def test_eight_concurrent_clients_are_served_one_at_a_time(main_server: LiveServer) -> None:
    before_requests = metric(main_server, "kvmem_requests_total")
    before_failed = metric(main_server, "kvmem_requests_failed_total")
    before_gens = len(gen_records(main_server))

    def ask(i: int) -> tuple[int, str]:
        r = httpx.post(
            main_server.base_url + "/v1/chat/completions",
            timeout=900,
            json={
                "messages": [
                    {"role": "user", "content": f"Give me a word that rhymes with number {i}."}
                ],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        return r.status_code, r.text

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(ask, range(8)))
    assert [status for status, _ in results] == [200] * 8, results
    assert metric(main_server, "kvmem_requests_total") == before_requests + 8
    assert metric(main_server, "kvmem_requests_failed_total") == before_failed
    records = gen_records(main_server)[before_gens:]
    assert len(records) == 8  # one engine turn per request, in sequence on the engine thread
    assert metric(main_server, "kvmem_requests_processing") == 0
    assert metric(main_server, "kvmem_requests_deferred") == 0
