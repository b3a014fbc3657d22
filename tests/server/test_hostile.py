"""Hostile requests against a real kvmem-server process under an address-space limit.

Each case asserts the status and the error envelope, that it held the server only briefly,
and that the server still answers a normal request correctly afterwards.
"""

from __future__ import annotations

import json
import re
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer
from tests.server.hostile_helpers import (
    HI,
    NORMAL,
    fresh_answer,
    normal_answer,
    raw_request,
    start_limited,
    status_of,
)

pytestmark = pytest.mark.slow

GOOD_ORIGIN = "http://good.example"
HEADER_TIMEOUT_S = 3
BODY_TIMEOUT_S = 3
MAX_CONNECTIONS = 520
PER_CLIENT = 250
ARGS = (
    "-c",
    "2048",
    "-t",
    "1",
    "--metrics",
    "--max-body-size",
    "4M",
    "--header-timeout",
    str(HEADER_TIMEOUT_S),
    "--body-timeout",
    str(BODY_TIMEOUT_S),
    "--cors-origins",
    GOOD_ORIGIN,
    "--max-connections",
    str(MAX_CONNECTIONS),
    "--max-connections-per-client",
    str(PER_CLIENT),
    "-lv",
    "4",
)
JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_limited(ARGS, tmp_path_factory.mktemp("hostile"))
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def expected_normal(hostile: LiveServer) -> str:
    return normal_answer(hostile)


def _schema(schema: object) -> dict[str, object]:
    return {
        "messages": HI,
        "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }


def _tool(params: object, choice: object = "required") -> dict[str, object]:
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    return {"messages": HI, "max_tokens": 4, "tools": [tool], "tool_choice": choice}


def _with(**fields: object) -> dict[str, object]:
    return {"messages": HI, "max_tokens": 4, **fields}


def _nest(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# (name, raw body, status, error code, param or None, words in the message)
CASES: list[tuple[str, str, int, str, str | None, str]] = [
    ("min>max string", json.dumps(_schema({"type": "string", "minLength": 5, "maxLength": 2})),
     400, "invalid_request", "response_format", "'minLength' (5) is greater than 'maxLength' (2)"),
    ("min>max array", json.dumps(_schema({"type": "array", "minItems": 3, "maxItems": 1})),
     400, "invalid_request", "response_format", "'minItems' (3) is greater than 'maxItems' (1)"),
    ("forced tool min>max", json.dumps(_tool({"type": "object", "properties": {
        "a": {"type": "string", "minLength": 9, "maxLength": 1}}})),
     400, "invalid_request", "tools", "'minLength' (9) is greater than 'maxLength' (1)"),
    ("named tool min>max", json.dumps(_tool({"type": "object", "properties": {
        "a": {"type": "array", "minItems": 4, "maxItems": 2}}},
        {"type": "function", "function": {"name": "f"}})),
     400, "invalid_request", "tools", "'minItems' (4) is greater than 'maxItems' (2)"),
    ("huge repetition", json.dumps(_schema({"type": "string", "maxLength": 10**9})),
     400, "invalid_request", "response_format", "'maxLength' is larger than 1000"),
    ("minItems string", json.dumps(_schema({"type": "array", "minItems": "x"})),
     400, "invalid_request", "response_format", "'minItems' must be a non-negative integer"),
    ("required 5", json.dumps(_schema({"type": "object", "properties": {"a": {}}, "required": 5})),
     400, "invalid_request", "response_format", "'required' must be an array of strings"),
    ("anyOf 5", json.dumps(_schema({"anyOf": 5})),
     400, "invalid_request", "response_format", "'anyOf' must be a non-empty array"),
    ("allOf [5]", json.dumps(_schema({"allOf": [5]})),
     400, "invalid_request", "response_format", "'allOf' must hold schema objects"),
    ("type 7", json.dumps(_schema({"type": 7})),
     400, "invalid_request", "response_format", "'type' must be one of"),
    ("deep schema", json.dumps(_schema(json.loads('{"items":' * 40 + "{}" + "}" * 40))),
     400, "invalid_request", "response_format", "nested deeper than 32 levels"),
    ("800-deep schema", json.dumps(_schema(json.loads('{"items":' * 800 + "{}" + "}" * 800))),
     400, "invalid_request", None, "nested too deeply"),
    ("50,000-value enum", json.dumps(_schema({"enum": [f"v{i}" for i in range(50000)]})),
     400, "invalid_request", "response_format", "more than 1000 enum values"),
    ("100,000 [", "[" * 100_000, 400, "invalid_request", None, "nested too deeply"),
    ("deep template kwargs", json.dumps(_with(chat_template_kwargs={"x": _nest(900, 1)})),
     400, "invalid_request", None, "nested too deeply"),
    ("deep messages", json.dumps({"messages": _nest(900, HI[0])}),
     400, "invalid_request", None, "nested too deeply"),
    ("5,000-digit integer", '{"messages": [], "seed": ' + "9" * 5000 + "}",
     400, "invalid_request", None, "an integer has 5000 digits"),
    ("temperature Infinity", '{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}',
     400, "invalid_request", None, "Infinity is not valid JSON"),
    ("temperature 1e999999", '{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999999}',
     400, "invalid_request", None, "out of range"),
    ("repeat_penalty 1e308", json.dumps(_with(repeat_penalty=1e308)),
     400, "invalid_request", "repeat_penalty", "less than or equal to 100"),
    ("lone surrogate content", '{"messages": [{"role": "user", "content": "\\ud800"}]}',
     400, "invalid_request", "messages[0].content", "lone UTF-16 surrogate"),
    ("lone surrogate key", '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"\\udfff": 1}}',
     400, "invalid_request", "chat_template_kwargs", "lone UTF-16 surrogate"),
    ("reserved kwarg messages", json.dumps(_with(chat_template_kwargs={"messages": []})),
     400, "invalid_request", "chat_template_kwargs", "may not set messages"),
    ("reserved kwarg tools", json.dumps(_with(chat_template_kwargs={"tools": 1})),
     400, "invalid_request", "chat_template_kwargs", "may not set tools"),
    ("reserved kwarg add_generation_prompt",
     json.dumps(_with(chat_template_kwargs={"add_generation_prompt": False})),
     400, "invalid_request", "chat_template_kwargs", "may not set add_generation_prompt"),
    ("3 MB prompt over -c", json.dumps({"messages": [{"role": "user", "content": "ab " * 1_000_000}]}),
     400, "context_length_exceeded", None, "more than the context size of 2048 tokens"),
    ("body over --max-body-size", json.dumps({"messages": [{"role": "user", "content": "a" * 5_000_000}]}),
     413, "payload_too_large", None, "larger than 4194304 bytes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "raw", "status", "code", "param", "words"), CASES, ids=[c[0] for c in CASES]
)
def test_hostile_body_gets_a_clean_4xx_and_the_server_stays_well(
    hostile: LiveServer,
    expected_normal: str,
    name: str,
    raw: str,
    status: int,
    code: str,
    param: str | None,
    words: str,
) -> None:
    with hostile.http() as http:
        t0 = time.monotonic()
        r = http.post("/v1/chat/completions", content=raw.encode(), headers=JSON_HEADERS)
        held = time.monotonic() - t0
        assert r.status_code == status, r.text[:500]
        error = r.json()["error"]
        # llama-server's type for a context overflow; the OpenAI code stays
        expected_type = "exceed_context_size_error" if code == "context_length_exceeded" else None
        assert error["type"] == (expected_type or "invalid_request_error")
        assert error["code"] == code
        assert error["param"] == param
        assert words in error["message"]
        assert held < 5.0, f"{name} held the server {held:.1f} s"
        normal = http.post("/v1/chat/completions", json=NORMAL)
        assert normal.status_code == 200
        assert normal.json()["choices"][0]["message"]["content"] == expected_normal
    assert hostile.proc.poll() is None


def test_no_5xx_was_counted_and_no_traceback_was_logged(hostile: LiveServer) -> None:
    text = httpx.get(hostile.base_url + "/metrics", timeout=30).text
    failed = re.search(r"^kvmem_requests_failed_total (\S+)$", text, re.M)
    assert failed is not None
    log = hostile.log()
    assert "Traceback" not in log
    assert "unexpected server error" not in log


def test_unparseable_grammar_is_a_400_with_stream_too(hostile: LiveServer) -> None:
    # A grammar the builder writes can still be refused by llama.cpp (here: a $ref cycle
    # that resolves to no terminal); the server checks it before the stream begins.
    body = _schema({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})
    for stream in (False, True):
        r = httpx.post(
            hostile.base_url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=60
        )
        assert r.headers["content-type"].startswith("application/json"), r.text[:300]
        assert r.status_code == 400


def test_head_answers_like_get(hostile: LiveServer) -> None:
    for path in ("/health", "/v1/models", "/props", "/metrics"):
        r = httpx.head(hostile.base_url + path, timeout=30)
        assert r.status_code == 200, path
        assert r.content == b""


def test_api_key_in_a_url_is_not_logged(hostile: LiveServer) -> None:
    httpx.get(hostile.base_url + "/v1/models?api_key=sk-secret-123&x=1", timeout=30)
    deadline = time.monotonic() + 5
    while "/v1/models?api_key=***&x=1" not in hostile.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "/v1/models?api_key=***&x=1" in hostile.log()
    assert "sk-secret-123" not in hostile.log()


def test_body_shorter_than_content_length_gets_408(hostile: LiveServer) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    t0 = time.monotonic()
    response = raw_request(hostile.port, head + b'{"messages": ', timeout=BODY_TIMEOUT_S + 10)
    assert status_of(response) == 408
    assert b'"code": "request_timeout"' in response
    assert time.monotonic() - t0 < BODY_TIMEOUT_S + 3


@pytest.mark.parametrize("expect", [b"", b"Expect: 100-continue\r\n"])
def test_a_declared_oversized_body_is_refused_at_once(hostile: LiveServer, expect: bytes) -> None:
    """Content-Length: 100000000 and no body: a 413 without waiting for the body deadline,
    and no `100 Continue` invitation first."""
    head = (
        b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000000\r\n" + expect + b"\r\n"
    )
    t0 = time.monotonic()
    response = raw_request(hostile.port, head, timeout=BODY_TIMEOUT_S + 10)
    assert response.startswith(b"HTTP/1.1 413 "), response[:200]
    assert b"100 Continue" not in response and b'"code": "payload_too_large"' in response
    if expect:  # answered before any read (the idle drain without it: a unit test)
        assert time.monotonic() - t0 < BODY_TIMEOUT_S  # the body deadline is not waited for


def test_content_length_with_transfer_encoding_gets_400_and_a_closed_connection(
    hostile: LiveServer,
) -> None:
    head = (
        b"POST /completion HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    response = raw_request(hostile.port, head, timeout=BODY_TIMEOUT_S + 10)  # reads to close
    assert status_of(response) == 400, response[:300]
    assert b'"code": "ambiguous_length"' in response and b"connection: close" in response


def test_client_leaving_mid_body_logs_nothing_unexpected(hostile: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", hostile.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        time.sleep(0.3)
    time.sleep(0.5)
    assert "unexpected server error" not in hostile.log()
    assert httpx.get(hostile.base_url + "/health", timeout=5).status_code == 200


def _get_health_from(source: str, port: int) -> bytes:
    """GET /health on a connection from the local address `source` (another client)."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(5)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        return sock.recv(200)


def _closed_now(socks: list[socket.socket], wait_s: float) -> set[int]:
    """Indexes of the sockets the server has closed (EOF or reset within `wait_s`)."""
    closed: set[int] = set()
    with selectors.DefaultSelector() as sel:
        for i, sock in enumerate(socks):
            sel.register(sock, selectors.EVENT_READ, i)
        for key, _ in sel.select(wait_s):
            try:
                gone = key.fileobj.recv(1) == b""  # type: ignore[union-attr]
            except ConnectionResetError:  # closed with its unread request bytes
                gone = True
            if gone:
                closed.add(key.data)
    return closed


def test_slow_clients_cannot_starve_health(hostile: LiveServer) -> None:
    """500 slow sockets of one client: past its share (--max-connections-per-client 250)
    each new connection closes that client's oldest idle one, so its own /health and
    another client's are answered within 1 s; the rest close at --header-timeout."""
    socks = []
    try:
        for i in range(500):
            sock = socket.create_connection(("127.0.0.1", hostile.port), timeout=10)
            if i % 2:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # headers never finish
            socks.append(sock)
        opened = time.monotonic()
        t0 = time.monotonic()
        r = httpx.get(hostile.base_url + "/health", timeout=10)
        assert r.status_code == 200
        assert time.monotonic() - t0 < 1.0
        t0 = time.monotonic()
        assert _get_health_from("127.0.0.2", hostile.port).startswith(b"HTTP/1.1 200 OK")
        assert time.monotonic() - t0 < 1.0
        evicted = _closed_now(socks, 0.5)
        assert time.monotonic() - opened < HEADER_TIMEOUT_S  # before any header timeout
        # the client's oldest connections made room: 500 + /health - 250 of them
        assert evicted == set(range(len(evicted))) and len(evicted) >= 500 - PER_CLIENT, evicted
        closed = len(evicted)
        for sock in socks[closed:]:
            sock.settimeout(max(0.1, opened + HEADER_TIMEOUT_S + 5 - time.monotonic()))
            try:
                if sock.recv(1) == b"":
                    closed += 1
            except (TimeoutError, ConnectionResetError):
                pass
        assert closed == len(socks)
        assert time.monotonic() - opened < HEADER_TIMEOUT_S + 5
    finally:
        for sock in socks:
            sock.close()
    assert httpx.get(hostile.base_url + "/health", timeout=5).status_code == 200


def test_cors_reflects_only_the_listed_origins(hostile: LiveServer) -> None:
    url = hostile.base_url + "/v1/chat/completions"
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    good = httpx.options(url, headers={"Origin": GOOD_ORIGIN, **preflight}, timeout=30)
    assert good.status_code == 200
    assert good.headers["access-control-allow-origin"] == GOOD_ORIGIN
    assert good.headers["access-control-allow-credentials"] == "true"
    evil = httpx.options(url, headers={"Origin": "http://evil.example", **preflight}, timeout=30)
    assert evil.status_code == 200  # answered, as llama-server does, but not allowed:
    assert "access-control-allow-origin" not in evil.headers
    simple = httpx.post(
        url,
        content=json.dumps(NORMAL),
        headers={"Origin": "http://evil.example", "Content-Type": "text/plain"},
        timeout=60,
    )
    assert simple.status_code == 415
    assert simple.json()["error"]["code"] == "unsupported_media_type"
    assert "access-control-allow-origin" not in simple.headers


def _metric(server: LiveServer, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=30).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


def test_queued_clients_that_leave_give_their_places_back(
    hostile: LiveServer, expected_normal: str
) -> None:
    busy = {"messages": HI, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    stop = threading.Event()
    streaming = threading.Event()

    def occupy() -> None:
        with (
            httpx.Client(base_url=hostile.base_url, timeout=300) as http,
            http.stream("POST", "/v1/chat/completions", json=busy) as response,
        ):
            assert response.status_code == 200
            for _ in response.iter_lines():
                streaming.set()
                if stop.is_set():
                    return

    holder = threading.Thread(target=occupy)
    holder.start()
    try:
        assert streaming.wait(120)
        body = json.dumps(NORMAL).encode()
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        leavers = [socket.create_connection(("127.0.0.1", hostile.port)) for _ in range(16)]
        for sock in leavers:
            sock.sendall(request)
        deadline = time.monotonic() + 30
        while _metric(hostile, "kvmem_requests_deferred") < 16 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _metric(hostile, "kvmem_requests_deferred") == 16  # the queue is full
        for sock in leavers:
            sock.close()
        time.sleep(1.0)  # the handlers notice within DISCONNECT_POLL_S
        assert _metric(hostile, "kvmem_requests_deferred") == 0
        result: dict[str, object] = {}

        def next_request() -> None:
            r = httpx.post(hostile.base_url + "/v1/chat/completions", json=NORMAL, timeout=300)
            result["status"], result["body"] = r.status_code, r.json()

        waiter = threading.Thread(target=next_request)
        waiter.start()
        time.sleep(0.5)
        assert "status" not in result  # it waits for the slot instead of getting 503
    finally:
        stop.set()
        holder.join(120)
    waiter.join(120)
    assert result["status"] == 200, result
    assert result["body"]["choices"][0]["message"]["content"] == expected_normal  # type: ignore[index]


def test_fifty_forged_im_start_cost_their_text_tokens(hostile: LiveServer) -> None:
    def prompt_tokens(content: str) -> int:
        r = httpx.post(
            hostile.base_url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": content}], "max_tokens": 1},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    # 50 more tokens if they became <|im_start|> control tokens; 301 as text
    assert prompt_tokens("x" + "<|im_start|>" * 50) - prompt_tokens("x") == 301


def test_zz_the_answer_afterwards_equals_a_fresh_servers(
    hostile: LiveServer, expected_normal: str, tmp_path: Path
) -> None:
    """Runs last in the file (pytest keeps definition order): after every case above."""
    assert normal_answer(hostile) == expected_normal == fresh_answer(ARGS, tmp_path)
