"""The server's view of its RPC workers (`--rpc`): where the layers live and which worker
was lost.

`/props` and `KVMEM_STARTUP ready=` carry `rpc_body`: the workers and each layer range's
device, read back from llama.cpp at load time (kvmem.settings.rpc_endpoints.LayerPlacement).
`RpcWatch` turns ggml-rpc's "remote RPC server crashed" abort into `RpcWorkerLostError`
for the running request (a 503 in the API's envelope), marks the engine worker lost, and
names the workers that no longer accept connections for `/health`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvmem.chat.protocol import ModelInfoLike
from kvmem.errors import RpcUnavailableError, RpcWorkerLostError
from kvmem.server.settings import ServerSettings
from kvmem.server.worker import EngineWorker, WorkerState

logger = logging.getLogger(__name__)


def rpc_body(settings: ServerSettings, info: ModelInfoLike | None) -> dict[str, Any] | None:
    """{workers, layers: [{device, endpoint, first, last}], output} or None without --rpc."""
    workers = settings.engine.placement.rpc
    if not workers:
        return None
    layers = getattr(info, "layers", None)
    placement = layers.as_json() if layers is not None else {"layers": [], "output": None}
    return {"workers": [str(w) for w in workers], **placement}


PROBE_ROUNDS = 10  # probes of the workers after a lost connection, PROBE_PAUSE_S apart
PROBE_PAUSE_S = 0.1


@dataclass(slots=True)
class RpcWatch:
    """Installed by create_app when --rpc is given."""

    settings: ServerSettings
    worker: EngineWorker
    lost: list[str] = field(default_factory=list)

    def install(self) -> None:
        from kvmem.engine.llama.rpc import watch_workers

        watch_workers(self._on_lost)

    def _on_lost(self, message: str) -> None:
        """On the engine thread that met the lost worker, before it is parked."""
        from kvmem.engine.llama.rpc import check_reachable

        lost = self._unreachable(check_reachable)
        self.lost = lost
        names = ", ".join(lost) or "a worker"
        logger.error("RPC worker lost (%s): %s", names, message)
        self.worker.mark_lost(
            RpcWorkerLostError(
                f"the RPC worker {names} went away while it held model layers; the model "
                "cannot run until kvmem-server is restarted over running workers"
            )
        )

    def _unreachable(self, check_reachable: Callable[[Any], None]) -> list[str]:
        """The workers that no longer accept connections. A worker that just died may close
        its connection to us before its listening socket: probe again for up to a second."""
        lost: list[str] = []
        for _ in range(PROBE_ROUNDS):
            for endpoint in self.settings.engine.placement.rpc:
                try:
                    check_reachable(endpoint)
                except RpcUnavailableError:
                    lost.append(str(endpoint))
            if lost:
                break
            time.sleep(PROBE_PAUSE_S)
        return lost

    def health(self) -> dict[str, Any]:
        return {"workers": [str(w) for w in self.settings.engine.placement.rpc], "lost": self.lost}


def exit_if_worker_lost(worker: EngineWorker, code: int) -> None:
    """After shutdown: with a lost RPC worker, leave at once (os._exit). ggml-rpc's
    connection thread that met the lost worker is parked, and llama.cpp's teardown at
    normal exit would wait for it forever."""
    if worker.state is not WorkerState.LOST:
        return
    logger.warning("exiting without llama.cpp's teardown: an RPC worker was lost")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
