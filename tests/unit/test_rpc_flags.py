"""--rpc on kvmem-server, kvmem-cli and the launcher; kvmem-rpc-worker's checks before
llama.cpp starts (no model, no RPC library needed)."""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path

import pytest

from kvmem.cli.chat_cli import build_parser, settings_from_args
from kvmem.cli.server_config import load_server_settings
from kvmem.console import rpc_worker
from kvmem.engine_settings import GpuPlacement
from kvmem.errors import ConfigError
from kvmem.launch.main import main as launch_main
from kvmem.settings.rpc_endpoints import RpcEndpoint

TWO = (RpcEndpoint("127.0.0.1", 50052), RpcEndpoint("127.0.0.1", 50053))


def test_server_rpc_workers_join_the_layer_split() -> None:
    s, warnings = load_server_settings(
        ["--rpc", "127.0.0.1:50052,127.0.0.1:50053", "-sm", "layer", "-ts", "1,1"], {}
    )
    assert s.engine.placement == GpuPlacement("layer", 0, (1.0, 1.0), TWO)
    assert warnings == []


def test_server_rpc_from_the_environment_as_llama_server() -> None:
    s, _ = load_server_settings([], {"LLAMA_ARG_RPC": "10.0.0.2:50052"})
    assert s.engine.placement.rpc == (RpcEndpoint("10.0.0.2", 50052),)


def test_tensor_split_over_several_devices_still_needs_rpc() -> None:
    with pytest.raises(ConfigError) as err:
        load_server_settings(["-ts", "1,1"], {})
    assert str(err.value) == (
        "--tensor-split: multi-GPU operation is not supported: give at most one GPU a share"
    )


def test_server_rejects_a_bad_worker_list() -> None:
    with pytest.raises(ConfigError) as err:
        load_server_settings(["--rpc", "127.0.0.1"], {})
    assert str(err.value) == (
        "argument --rpc: invalid RPC worker '127.0.0.1': use HOST:PORT, e.g. 127.0.0.1:50052"
    )


def test_cli_rpc_reaches_the_engine_settings() -> None:
    ns = build_parser().parse_args(["-p", "hi", "--rpc", "127.0.0.1:50052,127.0.0.1:50053"])
    assert settings_from_args(ns).placement == GpuPlacement(rpc=TWO)


def test_worker_names_a_taken_port(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert rpc_worker.main(["--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"kvmem-rpc-worker: error: --port: cannot listen on 127.0.0.1:{port}: "
        "Address already in use\n"
    )


def test_worker_warns_when_bound_beyond_loopback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as held:  # a taken port: the warning comes first, nothing starts
        held.bind(("0.0.0.0", 0))
        held.listen(1)
        port = held.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="kvmem.console.rpc_worker"):
            assert rpc_worker.main(["--host", "0.0.0.0", "--port", str(port)]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"listening on 0.0.0.0:{port}: the RPC protocol has no authentication; anyone who "
        "reaches this port can run work on this machine and read its memory. Use a trusted "
        "network only."
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "localhost"], "argument --host: invalid host 'localhost'"),
        (["--port", "0"], "argument --port: invalid port '0': use 1-65535"),
        (["-t", "0"], "argument -t/--threads: invalid thread count '0': use 1 or more"),
    ],
)
def test_worker_rejects_bad_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        rpc_worker.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_launch_dry_run_plans_workers_then_the_server(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVMEM_LAUNCH_DIR", str(tmp_path))
    for name in ("MODEL", "MMPROJ", "HOST", "PORT", "API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert launch_main(["rpc-smollm2", "--dry-run"]) == 0
    plan = json.loads(capsys.readouterr().out)
    worker = [sys.executable, "-m", "kvmem.console.rpc_worker", "--host", "127.0.0.1", "--port"]
    assert [w["argv"] for w in plan["workers"]] == [
        [*worker, "50052", "-t", "1"],
        [*worker, "50053", "-t", "1"],
    ]
    assert [w["log"] for w in plan["workers"]] == [
        str(tmp_path / "worker-50052.log"),
        str(tmp_path / "worker-50053.log"),
    ]
    argv = plan["argv"]
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:50052,127.0.0.1:50053"
    assert argv[argv.index("--tensor-split") + 1] == "1,1"
    assert not list(tmp_path.glob("*.pid"))  # a dry run starts nothing


def test_launch_refuses_a_worker_port_equal_to_the_server_port(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVMEM_LAUNCH_DIR", str(tmp_path))
    assert launch_main(["rpc-smollm2", "--dry-run", "--port", "50053"]) == 2
    err = capsys.readouterr().err
    assert "error: PORT: the server's port 50053 is also RPC worker 1's port" in err
