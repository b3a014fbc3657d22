"""A llama-server launch line starts kvmem-server (issue 30): `--timeout`, `--threads-http`,
the no-op flags with values, `--log-file`; CORS preflights are answered 200 before
authentication, with Access-Control-Allow-Origin only for the allowed origins: those of
`--cors-origins`, every origin on a keyed server without it, none on a keyless one."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import LiveServer, start_server

pytestmark = pytest.mark.slow

KEY = "sk-launch-line"
PAGE = "http://localhost:5173"
LAUNCH_LINE = (
    "-c", "2048", "-t", "2", "--timeout", "45", "--threads-http", "3", "-cb",
    "--cache-reuse", "256", "--ctx-checkpoints", "8", "--keep", "-1", "--log-colors", "off",
    "--no-mmap", "--props", "--api-key", KEY, "--cors-origins", PAGE, "--kvmem-trace",
)  # fmt: skip
ASK = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


@pytest.fixture(scope="module")
def launch_line_server(server_logs: Path) -> Iterator[tuple[LiveServer, Path]]:
    log_file = server_logs / "launch-line.log"
    server = start_server([*LAUNCH_LINE, "--log-file", str(log_file)], server_logs)
    yield server, log_file
    assert server.stop() == 0, server.log()[-3000:]


def test_the_launch_line_starts_with_its_timeouts_and_http_threads(
    launch_line_server: tuple[LiveServer, Path],
) -> None:
    server, log_file = launch_line_server
    found = re.search(r"^KVMEM_STARTUP requested=(\{.*\})$", server.log(), re.M)
    assert found, server.log()[-3000:]
    record = json.loads(found.group(1))
    assert record["timeouts_s"] == {"header": 10.0, "body": 45.0, "write": 45.0, "keep_alive": 5.0}
    assert record["threads_http"] == 3
    assert record["cors_origins"] == [PAGE]
    assert "server is listening on http://127.0.0.1" in log_file.read_text()


def test_preflight_is_public_and_reflects_only_the_allowed_origin(
    launch_line_server: tuple[LiveServer, Path],
) -> None:
    server, _ = launch_line_server
    with server.http() as http:
        ok = http.options("/v1/chat/completions", headers={"Origin": PAGE, **ASK})
        assert ok.status_code == 200 and ok.content == b""
        assert ok.headers["Access-Control-Allow-Origin"] == PAGE
        assert ok.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
        assert ok.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        assert ok.headers["Access-Control-Allow-Credentials"] == "true"
        other = http.options(
            "/v1/chat/completions", headers={"Origin": "http://evil.example", **ASK}
        )
        assert other.status_code == 200
        assert "Access-Control-Allow-Origin" not in other.headers
        bare = http.options("/v1/models")
        assert bare.status_code == 200 and "Access-Control-Allow-Origin" not in bare.headers
        # the request the preflight allowed: with the key it is served, with the origin's header
        r = http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
            headers={"Origin": PAGE, "Authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == PAGE
        denied = http.get("/v1/models", headers={"Origin": PAGE})
        assert denied.status_code == 401


def test_preflight_on_a_server_without_keys_or_origins(main_server: LiveServer) -> None:
    with main_server.http() as http:
        r = http.options("/v1/chat/completions", headers={"Origin": PAGE, **ASK})
        assert r.status_code == 200  # answered, but no origin is allowed without a key
        assert "Access-Control-Allow-Origin" not in r.headers
        assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["Access-Control-Allow-Headers"] == "authorization, content-type"
        models = http.get("/v1/models", headers={"Origin": PAGE})
        assert models.status_code == 200 and "Access-Control-Allow-Origin" not in models.headers


@pytest.fixture(scope="module")
def keyed_server(server_logs: Path) -> Iterator[LiveServer]:
    """An API key and no --cors-origins: CORS answered as llama-server answers it."""
    server = start_server(["-c", "1024", "-t", "2", "--api-key", KEY], server_logs)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


def test_preflight_on_a_keyed_server_without_origins_is_llama_servers(
    keyed_server: LiveServer,
) -> None:
    origin = "http://web.mydomain.fr"
    with keyed_server.http() as http:
        r = http.options("/completions", headers={"Origin": origin, **ASK})
        assert (r.status_code, r.content) == (200, b"")
        assert r.headers["Access-Control-Allow-Origin"] == origin
        assert r.headers["Access-Control-Allow-Credentials"] == "true"
        assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, DELETE, OPTIONS"
        assert r.headers["Access-Control-Allow-Headers"] == "*"
        served = http.post(
            "/completions",
            json={"prompt": "Hi", "n_predict": 1},
            headers={"Origin": origin, "Authorization": f"Bearer {KEY}"},
        )
        assert served.status_code == 200, served.text
        assert served.headers["Access-Control-Allow-Origin"] == origin
        refused = http.post("/completions", json={"prompt": "Hi"}, headers={"Origin": origin})
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"


def _maps_model(server: LiveServer) -> bool:
    from kvmem.gguf.model_path import default_model_path

    model = str(Path(default_model_path()).resolve())
    return model in Path(f"/proc/{server.proc.pid}/maps").read_text()


def test_no_mmap_reads_the_model_instead_of_mapping_it(
    launch_line_server: tuple[LiveServer, Path], main_server: LiveServer
) -> None:
    server, _ = launch_line_server
    assert _maps_model(main_server)  # llama.cpp's default: the GGUF is mapped
    assert not _maps_model(server)  # --no-mmap: read into buffers, the file is not mapped


def test_a_server_without_keys_answers_only_to_its_own_host_names(
    main_server: LiveServer, launch_line_server: tuple[LiveServer, Path]
) -> None:
    """DNS rebinding: a page on evil.example (resolving to 127.0.0.1) sends its own name as
    Host. Without an API key only IP addresses, localhost and --host names are served;
    with a key every Host is (the key is the defence)."""
    port = main_server.base_url.rsplit(":", 1)[1]
    with httpx.Client(base_url=main_server.base_url, timeout=30) as http:
        evil = http.get("/v1/models", headers={"Host": f"evil.example:{port}"})
        assert evil.status_code == 403
        assert evil.json()["error"]["type"] == "permission_error"
        assert "'evil.example'" in evil.json()["error"]["message"]
        assert http.get("/health", headers={"Host": "evil.example"}).status_code == 403
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST."):
            assert http.get("/v1/models", headers={"Host": host}).status_code == 200, host
    keyed, _ = launch_line_server
    with keyed.http() as http:
        r = http.get(
            "/v1/models", headers={"Host": "evil.example", "Authorization": f"Bearer {KEY}"}
        )
        assert r.status_code == 200
