"""llama-server's server flags (issue 30): their meanings, int32 ranges checked before the
model loads, model-path messages, the CORS answers, and the layout of `--help`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from kvmem.cli.chat_cli import build_parser as build_cli_parser
from kvmem.cli.limit_flags import ServerLimits
from kvmem.cli.server_args import build_server_parser
from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError
from kvmem.models.catalog import model_names
from kvmem.server.app import create_app
from kvmem.server.main import main as server_main
from kvmem.server.startup import configure_logging
from kvmem.settings.flag import Group
from tests.fakes.app import settings, wait_ready
from tests.fakes.engine import FakeEngine


def load(*argv: str):
    return load_server_settings(list(argv), {})[0]


def test_timeout_is_the_write_timeout_and_the_body_deadline() -> None:
    default = load().limits
    assert (default.write_timeout_s, default.body_timeout_s) == (600.0, 60.0)
    s = load("--timeout", "30").limits
    assert (s.write_timeout_s, s.body_timeout_s, s.header_timeout_s) == (30.0, 30.0, 10.0)
    s = load("-to", "30", "--body-timeout", "5").limits
    assert (s.write_timeout_s, s.body_timeout_s) == (30.0, 5.0)
    env = load_server_settings([], {"LLAMA_ARG_TIMEOUT": "90"})[0].limits
    assert (env.write_timeout_s, env.body_timeout_s) == (90.0, 90.0)


def test_threads_http_cors_and_model_loading_flags() -> None:
    assert load().limits.threads_http is None
    assert load("--threads-http", "2").limits.threads_http == 2
    assert load("--threads-http", "0").limits.threads_http is None  # llama-server: < 1 = auto
    lim = load(
        "--cors-origins", "http://a.example", "--cors-methods", "GET,POST",
        "--cors-headers", "Authorization, Content-Type", "--no-cors-credentials",
    ).limits  # fmt: skip
    assert (lim.cors_origins, lim.cors_methods, lim.cors_headers, lim.cors_credentials) == (
        ("http://a.example",),
        ("GET", "POST"),
        ("Authorization", "Content-Type"),
        False,
    )
    modes = {
        (): "auto",
        ("--no-mmap",): "none",
        ("--mmap",): "mmap",
        ("--mlock",): "mmap+mlock",
        ("--mlock", "--no-mmap"): "mlock",
        ("-lm", "dio"): "dio",
        ("--load-mode", "none", "--mlock"): "none",  # the explicit mode wins
    }
    for argv, mode in modes.items():
        assert load(*argv).engine.load_mode == mode, argv
    env = load_server_settings([], {"LLAMA_ARG_LOAD_MODE": "mmap+mlock"})[0].engine
    assert env.load_mode == "mmap+mlock"
    with pytest.raises(ConfigError) as info:
        load("-lm", "fast")
    assert str(info.value) == (
        "argument -lm/--load-mode: invalid choice: 'fast' (choose from 'auto', 'none', "
        "'mmap', 'mlock', 'mmap+mlock', 'dio')"
    )
    assert load("--reuse-port").reuse_port is True
    assert load("--log-disable", "-lv", "4").verbosity == 0
    assert load("--log-file", "/tmp/x.log").log_file == "/tmp/x.log"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--threads-batch", "2147483648"],
         "argument -tb/--threads-batch: 2147483648 is out of range: must be in 1..512 or -1"),
        (["-t", "513"], "argument -t/--threads: 513 is out of range: must be in 1..512 or -1"),
        (["-b", "2147483648"],
         "argument -b/--batch-size: 2147483648 is out of range: must be in 1..2147483647"),
        (["-ub", "-2147483649"],
         "argument -ub/--ubatch-size: -2147483649 is out of range: must be in 1..2147483647"),
        (["--top-k", "4294967296"],
         "argument --top-k: 4294967296 is out of range: must be in 0..2147483647"),
        (["-n", "2147483648"],
         "argument -n/--n-predict/--predict: 2147483648 is out of range: must be in "
         "1..2147483647 or -1"),
        (["-np", "2147483648"],
         "argument -np/--parallel: 2147483648 is out of range: must be in 1..2147483647 or -1"),
        (["--kvmem-budget", "2147483648"],
         "argument --kvmem-budget: 2147483648 is out of range: must be in "
         "-2147483648..2147483647"),
        (["--timeout", "0"], "argument -to/--timeout: 0 is out of range: must be in 1..86400"),
        (["--timeout", "1.5"], "argument -to/--timeout: invalid integer value: '1.5'"),
        (["--threads-http", "-2"],
         "argument --threads-http: -2 is out of range: must be in 1..1024 or -1, 0"),
        (["--threads-http", "2147483648"],
         "argument --threads-http: 2147483648 is out of range: must be in 1..1024 or -1, 0"),
        (["--cors-methods", "GET,,POST"],
         "argument --cors-methods: invalid list 'GET,,POST': give comma-separated names, "
         "e.g. 'GET, POST' or '*'"),
        (["--reasoning-budget", "2147483648"],
         "argument --reasoning-budget: 2147483648 is out of range: must be in -1..2147483647"),
    ],
)  # fmt: skip
def test_int32_flags_reject_values_llama_cpp_would_overflow(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(*argv)
    assert str(info.value) == message


def test_an_out_of_range_flag_exits_2_before_the_model_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert server_main(["--threads-batch", "2147483648", "-m", "/nonexistent.gguf"]) == 2
    assert capsys.readouterr().err == (
        "kvmem-server: error: argument -tb/--threads-batch: 2147483648 is out of range: "
        "must be in 1..512 or -1\n"
    )


def test_model_flag_names_a_directory_and_lists_the_model_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert server_main(["-m", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"kvmem-server: error: --model: {tmp_path} is a directory: give a GGUF file or a "
        "model name\n"
    )
    assert server_main(["-m", "qwen-0.6b"]) == 2
    names = ", ".join(model_names())
    assert "qwen-0.5b" in names
    assert capsys.readouterr().err == (
        "kvmem-server: error: --model: no model file or model name 'qwen-0.6b': give a GGUF "
        f"file path or one of the model names: {names}\n"
    )
    assert server_main(["-m", str(tmp_path / "missing.gguf")]) == 2
    assert capsys.readouterr().err == (
        f"kvmem-server: error: --model: file not found: {tmp_path / 'missing.gguf'}\n"
    )


def test_log_file_gets_the_log(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    configure_logging(3, str(path))
    try:
        logging.getLogger("kvmem.test").info("hello %s", "file")
    finally:
        configure_logging(3)
    assert path.read_text().rstrip().endswith("kvmem.test: hello file")


def test_unwritable_log_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "no-such-dir" / "x.log"
    assert server_main(["--log-file", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"kvmem-server: error: --log-file: cannot open {target}: No such file or directory\n"
    )


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(replies=["Hello"])


def _options(limits: ServerLimits, engine: FakeEngine, headers: dict[str, str]):
    with TestClient(create_app(settings(limits=limits), lambda _: engine)) as c:
        wait_ready(c)
        return c.options("/v1/chat/completions", headers=headers)


def test_preflight_is_answered_without_an_origin_and_with_configured_lists(
    engine: FakeEngine,
) -> None:
    r = _options(ServerLimits(), engine, {})
    assert r.status_code == 200 and r.content == b""
    assert "access-control-allow-origin" not in r.headers
    assert r.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert r.headers["access-control-allow-headers"] == "*"
    limits = ServerLimits(
        cors_origins=("http://a.example",),
        cors_methods=("POST",),
        cors_headers=("Content-Type",),
        cors_credentials=False,
    )
    r = _options(
        limits,
        engine,
        {"Origin": "http://a.example", "Access-Control-Request-Headers": "authorization"},
    )
    assert r.headers["access-control-allow-origin"] == "http://a.example"
    assert r.headers["access-control-allow-methods"] == "POST"
    assert r.headers["access-control-allow-headers"] == "Content-Type"
    assert r.headers["access-control-allow-credentials"] == "false"


def test_responses_carry_cors_headers_only_for_allowed_origins(engine: FakeEngine) -> None:
    limits = ServerLimits(cors_origins=("http://a.example",))
    with TestClient(create_app(settings(limits=limits), lambda _: engine)) as c:
        wait_ready(c)
        ok = c.get("/v1/models", headers={"Origin": "http://a.example"})
        other = c.get("/v1/models", headers={"Origin": "http://b.example"})
    assert ok.headers["access-control-allow-origin"] == "http://a.example"
    assert ok.headers["access-control-allow-credentials"] == "true"
    assert "access-control-allow-origin" not in other.headers
    assert json.loads(ok.content)["object"] == "list"


def _help(parser) -> str:  # type: ignore[no-untyped-def]
    return parser.format_help()


def test_server_help_opens_with_a_short_usage_and_groups_in_order() -> None:
    text = _help(build_server_parser())
    lines = text.splitlines()
    assert lines[0] == (
        "usage: kvmem-server [-m FNAME|NAME] [-c N] [--kvmem-budget N] [--host HOST] "
        "[--port PORT] [FLAGS...]"
    )
    assert lines[1] == ""
    assert lines[2].startswith("OpenAI-compatible chat server with KVMem")
    titles = [line[:-1] for line in lines if line and not line[0].isspace() and line.endswith(":")]
    assert titles == [
        "options",
        "model & context",
        "KVMem memory",
        "KV cache types",
        "sampling",
        "server & network",
        "authentication",
        "chat page",
        "chat template & thinking",
        "vision",
        "GPU placement",
        "logging",
        "speculative decoding",
        "llama-server compatibility: accepted, no effect",
        "llama-server compatibility: rejected",
        "Examples",
    ]
    assert [g.value for g in Group if g is not Group.CLI] == titles[1:-1]
    server_section = text[text.index("server & network:") : text.index("authentication:")]
    for flag in ("--timeout", "--threads-http", "--cors-origins", "--cors-methods", "--port"):
        assert flag in server_section
    for flag in ("--temp", "--api-key", "--ui-dir", "--chat-template"):
        assert flag not in server_section


def test_cli_help_opens_with_a_short_usage() -> None:
    lines = _help(build_cli_parser()).splitlines()
    assert (
        lines[0] == "usage: kvmem-cli [-m FNAME|NAME] [-c N] (-p TEXT | -f FNAME | -i) [FLAGS...]"
    )
    titles = [line[:-1] for line in lines if line and not line[0].isspace() and line.endswith(":")]
    assert titles[:5] == [
        "options",
        "model & context",
        "KVMem memory",
        "KV cache types",
        "sampling",
    ]
    assert "generation (kvmem-cli)" in titles


@pytest.mark.parametrize(("threads_http", "tokens"), [(3, 3), (None, 40)])
def test_threads_http_sets_the_worker_thread_limit(
    engine: FakeEngine, threads_http: int | None, tokens: int
) -> None:
    from anyio import to_thread

    async def limit() -> float:
        return to_thread.current_default_thread_limiter().total_tokens

    s = settings(limits=ServerLimits(threads_http=threads_http))
    with TestClient(create_app(s, lambda _: engine)) as c:
        wait_ready(c)
        assert c.portal is not None
        assert c.portal.call(limit) == tokens


def test_cli_checks_the_same_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvmem.console.chat import main as cli_main

    assert cli_main(["-m", str(tmp_path), "-p", "x"]) == 2
    assert capsys.readouterr().err == (
        f"kvmem-cli: error: -m: {tmp_path} is a directory: give a GGUF file or a model name\n"
    )
    assert cli_main(["-m", "qwen-0.6b", "-p", "x"]) == 2
    assert capsys.readouterr().err == (
        "kvmem-cli: error: -m: no model file or model name 'qwen-0.6b': give a GGUF file "
        f"path or one of the model names: {', '.join(model_names())}\n"
    )
    assert cli_main(["-tb", "2147483648", "-p", "x"]) == 2
    assert capsys.readouterr().err == (
        "kvmem-cli: error: argument -tb/--threads-batch: 2147483648 is out of range: must be "
        "in -2147483648..2147483647\n"
    )
    assert cli_main(["-tb", "513", "-p", "x"]) == 2
    assert capsys.readouterr().err == "kvmem-cli: error: -tb: must be at most 512, got 513\n"
