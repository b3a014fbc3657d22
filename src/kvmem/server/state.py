"""What every route shares: the server's state (app.state.kvmem) and its readiness.

The bottom of the server's route layers: state <- request flow (flow.py, chat_flow.py)
<- one router per API <- app.py. The state holds the settings, the engine worker, the
metrics and what the loaded model exposes to the routes (template, info, vocabulary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request

from kvmem.chat.protocol import ChatEngine, ModelInfoLike
from kvmem.chat.template import ChatTemplate
from kvmem.errors import EngineNotReadyError, RpcWorkerLostError, ServerShuttingDownError
from kvmem.server.metrics import ServerMetrics
from kvmem.server.props import served_model_id
from kvmem.server.rpc_status import RpcWatch
from kvmem.server.settings import ServerSettings
from kvmem.server.worker import EngineWorker, WorkerState


@dataclass(slots=True)
class ServerState:
    """What the routes share (app.state.kvmem)."""

    settings: ServerSettings
    worker: EngineWorker
    metrics: ServerMetrics
    template: ChatTemplate | None = None
    info: ModelInfoLike | None = None
    window: Callable[[], dict[str, list[int]]] | None = None  # the last plan's blocks by tier
    # data movement since start: time, bytes and GB/s per transfer path (issue 9's profile)
    transfer: Callable[[], dict[str, dict[str, float | int | None]]] | None = None
    vocab: ChatEngine | None = None  # tokenize/detokenize only (thread-safe vocab reads)
    rpc: RpcWatch | None = None  # --rpc: the workers and the one lost (server/rpc_status.py)

    @property
    def phase(self) -> str:
        """The engine worker's state: loading, ready, failed or stopped."""
        return self.worker.state.value

    @property
    def model_id(self) -> str:
        """The served model's name (--alias, else the file name); only once loaded."""
        assert self.info is not None
        return served_model_id(self.settings, self.info)


def server_state(request: Request) -> ServerState:
    return request.app.state.kvmem


def ready_state(request: Request) -> ServerState:
    """The state once the model is loaded; 503 errors while loading or shutting down."""
    state = server_state(request)
    if state.worker.state is WorkerState.STOPPED:
        raise ServerShuttingDownError("the server is shutting down")
    if isinstance(state.worker.load_error, RpcWorkerLostError):  # --rpc: a worker went away
        raise state.worker.load_error
    if state.worker.state is not WorkerState.READY or state.template is None:
        raise EngineNotReadyError(f"the model is not ready ({state.worker.state.value})")
    return state
