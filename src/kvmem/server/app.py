"""The FastAPI application factory.

`create_app(settings)` builds the app; its lifespan starts the engine worker, which loads
the model in its own thread (so /health can answer 503 while loading) and owns the
engine from then on. `engine_factory` is the seam tests use to run the app on a fake.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from anyio import to_thread
from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from kvmem.chat.protocol import ChatEngine
from kvmem.chat.template import ChatTemplate
from kvmem.server.anthropic_api import anthropic_router
from kvmem.server.auth import ApiKeyChecker, require_api_key
from kvmem.server.body_guard import BodyGuard
from kvmem.server.chat_routes import chat_router
from kvmem.server.completion_routes import completion_router
from kvmem.server.conversation_routes import conversation_router
from kvmem.server.cors import Cors, CorsPolicy
from kvmem.server.error_map import install_error_handlers
from kvmem.server.header_case import HeaderCase
from kvmem.server.info_routes import health_router, info_router
from kvmem.server.metrics import ServerMetrics
from kvmem.server.response_store import ResponseStore
from kvmem.server.responses_api import responses_router
from kvmem.server.rpc_status import RpcWatch
from kvmem.server.settings import ServerSettings
from kvmem.server.slot_routes import slot_router
from kvmem.server.state import ServerState
from kvmem.server.ui_files import PACKAGED_UI, page_router, ui_directory
from kvmem.server.utility_routes import utility_router
from kvmem.server.worker import EngineWorker

logger = logging.getLogger(__name__)

EngineFactory = Callable[[ServerSettings], ChatEngine]


def default_engine_factory(settings: ServerSettings) -> ChatEngine:
    from kvmem.engine.engine import Engine
    from kvmem.engine.lanes import EngineLanes

    if settings.parallel > 1:
        lanes = EngineLanes(settings.engine, settings.parallel, unified=settings.kv_unified)
        return lanes  # type: ignore[return-value]
    return Engine(settings.engine)


def create_app(
    settings: ServerSettings,
    engine_factory: EngineFactory | None = None,
    *,
    on_ready: Callable[[ChatEngine], None] | None = None,
    on_failed: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    factory = engine_factory or default_engine_factory
    metrics = ServerMetrics()
    metrics.n_batch = settings.engine.n_batch
    holder: dict[str, ServerState] = {}

    def load() -> ChatEngine:
        engine = factory(settings)
        try:
            template = ChatTemplate.from_engine_info(engine.info, settings.chat_template)
        except Exception:
            engine.close()
            raise
        holder["state"].template = template
        holder["state"].info = engine.info
        holder["state"].window = getattr(engine, "window_tiers", None)
        holder["state"].transfer = getattr(engine, "transfer_profile", None)
        holder["state"].vocab = engine
        logger.info(
            "model %s loaded: n_ctx=%d, chat template from %s, tool format %s",
            engine.info.name,
            engine.info.n_ctx,
            settings.chat_template_origin,
            template.tool_format.value,
        )
        return engine

    worker = EngineWorker(
        load,
        settings.queue_size,
        metrics,
        on_ready=on_ready,
        on_failed=on_failed,
        grammar_deadline_s=settings.limits.grammar_deadline_s,
        kv_unified=settings.kv_unified,
    )
    state = ServerState(settings=settings, worker=worker, metrics=metrics)
    holder["state"] = state
    if settings.engine.placement.rpc:
        state.rpc = RpcWatch(settings, worker)
        state.rpc.install()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if settings.limits.threads_http is not None:  # --threads-http
            to_thread.current_default_thread_limiter().total_tokens = settings.limits.threads_http
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(
        title="kvmem-server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.kvmem = state
    app.state.auth = ApiKeyChecker(settings.api_keys)
    app.state.responses = ResponseStore()  # previous_response_id (server/responses_api.py)
    limits = settings.limits

    def on_error(exc: BaseException) -> None:
        metrics.record_failure()
        logger.error("unexpected server error", exc_info=exc)

    app.add_middleware(
        BodyGuard,
        max_body_bytes=limits.max_body_bytes,
        body_timeout_s=limits.body_timeout_s,
        on_error=on_error,
    )
    cors = CorsPolicy.of(limits, keyed=settings.api_keys.enabled)
    app.add_middleware(Cors, policy=cors)  # OPTIONS answered before auth and routing
    app.add_middleware(HeaderCase)  # outermost: llama-server's Access-Control-* casing
    install_error_handlers(app)
    app.include_router(health_router)  # public
    keyed = [Depends(require_api_key)]  # the Anthropic routes answer its 401 in their envelope
    for router in (
        info_router,
        chat_router,
        completion_router,
        utility_router,
        responses_router,
        anthropic_router,
        slot_router,
        conversation_router,
    ):
        app.include_router(router, dependencies=keyed)
    ui = ui_directory(settings)
    if ui is not None:
        if ui == PACKAGED_UI:
            app.include_router(page_router())  # public, as the page
        app.mount("/", StaticFiles(directory=str(ui), html=True), name="ui")
    return app
