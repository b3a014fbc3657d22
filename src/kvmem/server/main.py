"""`kvmem-server`: parse flags and environment, validate, bind, serve.

Order: configuration and files are validated (exit 2 on a bad flag or variable, 1 on a
missing model), the `KVMEM_STARTUP requested=` record is written, the port is bound (a
failure names the address and exits 1), then uvicorn starts and the model loads in the
engine thread; `KVMEM_STARTUP ready=` follows once it has loaded. SIGINT, SIGTERM and
SIGHUP cancel the running generation (a prefill stops at its next chunk, a decode at its
next token), answer queued requests with 503, end the streams with a `shutting_down` error
event, wait for the engine thread to leave llama.cpp and close the engine, and exit 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from types import FrameType

import uvicorn

from kvmem.chat.protocol import ChatEngine
from kvmem.cli.server_config import load_server_settings
from kvmem.errors import ConfigError, ModelNotFoundError
from kvmem.gguf.model_path import resolve_model_path
from kvmem.server.app import create_app
from kvmem.server.connection_guard import (
    effective_connection_limit,
    guarded_protocol,
    raise_fd_limit,
)
from kvmem.server.host_check import HostCheck, served_names
from kvmem.server.log_redact import install_access_log_redaction
from kvmem.server.rpc_status import exit_if_worker_lost
from kvmem.server.startup import (
    bind_socket,
    configure_logging,
    emit_record,
    ready_record,
    requested_record,
)

logger = logging.getLogger("kvmem.server")

EXIT_CONFIG = 2
EXIT_RUNTIME = 1


class _Server(uvicorn.Server):
    """uvicorn that also cancels the running generation when a signal arrives."""

    def __init__(self, config: uvicorn.Config, on_signal: object) -> None:
        super().__init__(config)
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if callable(self._on_signal):
            self._on_signal()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, but a signal-initiated shutdown ends with exit 0 (uvicorn re-raises it)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {
            sig: signal.signal(sig, self.handle_exit)
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _gpu_free() -> tuple[str, int] | None:
    """--fit on: the GPU's free memory before the load (loads llama.cpp)."""
    from kvmem.engine.llama.device_memory import gpu_free

    return gpu_free()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings, warnings = load_server_settings(args, os.environ, _gpu_free)
    except ConfigError as exc:
        sys.stderr.write(f"kvmem-server: error: {exc}\n")
        return EXIT_CONFIG
    try:
        configure_logging(settings.verbosity, settings.log_file)
    except OSError as exc:
        sys.stderr.write(
            f"kvmem-server: error: --log-file: cannot open {settings.log_file}: "
            f"{exc.strerror or exc}\n"
        )
        return EXIT_CONFIG
    for warning in warnings:
        logger.warning("%s", warning)
    if settings.fit is not None:
        kv = settings.engine.kvmem
        logger.info("--fit on: --kvmem-budget %d --kvmem-gen-reserve %d", kv.budget, kv.gen_reserve)
        for line in settings.fit.lines:
            logger.info("--fit plan: %s", line)
    try:
        settings = settings.with_model_path(resolve_model_path(settings.engine.model_path))
    except ModelNotFoundError as exc:
        sys.stderr.write(f"kvmem-server: error: {exc}\n")
        return EXIT_RUNTIME
    if settings.trace:
        emit_record("requested", requested_record(settings))
    sockets = []
    for host in settings.hosts:
        try:
            sockets.append(bind_socket(host, settings.port, settings.reuse_port))
        except OSError as exc:
            for sock in sockets:
                sock.close()
            sys.stderr.write(
                f"kvmem-server: error: cannot listen on {host}:{settings.port}: {exc.strerror or exc}\n"
            )
            return EXIT_RUNTIME

    exit_code = [0]
    server_ref: list[_Server] = []

    def on_ready(engine: ChatEngine) -> None:
        logger.info(
            "server is listening on http://%s:%d (model %s)",
            settings.host,
            settings.port,
            engine.info.name,
        )
        if settings.trace:
            emit_record("ready", ready_record(settings, engine.info, engine.stats))

    def on_failed(exc: BaseException) -> None:
        sys.stderr.write(f"kvmem-server: error: cannot load the model: {exc}\n")
        exit_code[0] = EXIT_RUNTIME
        if server_ref:
            server_ref[0].should_exit = True

    logger.info("loading model %s", settings.engine.model_path)
    app = create_app(settings, on_ready=on_ready, on_failed=on_failed)
    limits = settings.limits
    max_connections = effective_connection_limit(limits.max_connections, raise_fd_limit())
    if max_connections < limits.max_connections:
        logger.warning(
            "--max-connections %d exceeds the file-descriptor limit: using %d",
            limits.max_connections,
            max_connections,
        )
    install_access_log_redaction()
    config = uvicorn.Config(
        HostCheck(app, served_names(settings)),  # outermost: a foreign Host gets nothing else
        log_config=None,
        access_log=settings.verbosity >= 4,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=max(1, round(limits.keep_alive_timeout_s)),
        http=guarded_protocol(
            limits.header_timeout_s,
            max_connections,
            limits.write_timeout_s,
            per_client=limits.max_connections_per_client,
        ),
        ws="none",
    )
    server = _Server(config, on_signal=lambda: app.state.kvmem.worker.cancel_all())
    server_ref.append(server)
    try:
        server.run(sockets=sockets)
    finally:
        # A second signal makes uvicorn skip the lifespan shutdown: the engine thread must
        # still leave llama.cpp and close the engine before Python exits.
        app.state.kvmem.worker.stop()
        for sock in sockets:
            sock.close()
    exit_if_worker_lost(app.state.kvmem.worker, exit_code[0])  # --rpc: see rpc_status.py
    return exit_code[0]


if __name__ == "__main__":
    sys.exit(main())
