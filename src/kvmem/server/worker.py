"""The engine worker: one thread owns the engine; requests wait in a bounded queue.

The thread loads the model (the server answers /health with 503 meanwhile), then runs one
job at a time: tokenize the rendered prompt, check the context size, run the turn and
send every event through the job's channel. A job whose client went away (cancel set)
is skipped, or stopped at the next token; the session then holds exactly the tokens
produced so far, which the next request reuses as far as they match.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from enum import Enum

from kvmem.chat.prompt import tokenize_prompt
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.turn import TurnDone, run_turn
from kvmem.errors import (
    ContextLengthExceededError,
    EngineNotReadyError,
    QueueFullError,
    ServerShuttingDownError,
    TurnCancelledError,
)
from kvmem.server.channel import JobFailed, JobStarted
from kvmem.server.chat_job import ChatJob
from kvmem.server.completion_job import CompletionDone, CompletionJob, CompletionToken
from kvmem.server.error_map import classify
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.metrics import ServerMetrics
from kvmem.server.slot_job import SlotJob

logger = logging.getLogger(__name__)


class WorkerState(Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class EngineWorker:
    def __init__(
        self,
        load: Callable[[], ChatEngine],
        queue_size: int,
        metrics: ServerMetrics,
        on_ready: Callable[[ChatEngine], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._load = load
        self._queue_size = queue_size
        self._metrics = metrics
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._pending: collections.deque[ChatJob | CompletionJob] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._current: ChatJob | CompletionJob | None = None
        self.state = WorkerState.LOADING
        self.load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvmem-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._pending)

    @property
    def busy(self) -> bool:
        """A job is running (the /slots `is_processing`)."""
        with self._cond:
            return self._current is not None

    def submit(self, job: ChatJob | CompletionJob | SlotJob) -> None:
        """Queue `job`; EngineNotReadyError while loading, QueueFullError past the bound."""
        with self._cond:
            if self._stopping:
                raise ServerShuttingDownError("the server is shutting down")
            if self.state is not WorkerState.READY:
                raise EngineNotReadyError(f"the model is not ready ({self.state.value})")
            capacity = self._queue_size + (1 if self._current is None else 0)
            if len(self._pending) >= capacity:
                self._metrics.record_rejected()
                raise QueueFullError(
                    f"the server is busy: {len(self._pending)} requests are already waiting "
                    f"(--queue-size {self._queue_size})"
                )
            self._pending.append(job)
            self._metrics.deferred = len(self._pending)
            self._cond.notify()

    def cancel_all(self) -> None:
        """Stop the running generation and refuse every waiting job (shutdown)."""
        with self._cond:
            self._stopping = True
            if self._current is not None:
                self._current.cancel.set()
            for job in self._pending:
                job.cancel.set()
                job.channel.put(JobFailed(ServerShuttingDownError("the server is shutting down")))
            self._pending.clear()
            self._metrics.deferred = 0
            self._cond.notify_all()

    def withdraw(self, job: ChatJob) -> None:
        """Take a job whose client went away out of the queue (a no-op once it runs)."""
        with self._cond:
            try:
                self._pending.remove(job)
            except ValueError:
                return
            self._metrics.deferred = len(self._pending)

    def stop(self) -> None:
        """cancel_all, then wait until the engine thread has left llama.cpp and closed the
        engine (a running prefill stops at its next chunk, a generation at its next token;
        a model still loading finishes loading first). Python must not exit while a
        llama.cpp call is in flight."""
        self.cancel_all()
        if not self._thread.is_alive():
            return
        waited = 0.0
        while self._thread.is_alive():
            self._thread.join(1.0)
            waited += 1.0
            if self._thread.is_alive() and waited % 10 == 0:
                logger.warning("waiting for the engine thread to stop (%.0f s)", waited)

    def _run(self) -> None:
        try:
            engine = self._load()
        except BaseException as exc:  # report any load failure to the server, then end
            self.load_error = exc
            logger.error("model load failed: %s", exc)
            if self._on_failed is not None:
                self._on_failed(exc)
            self.state = WorkerState.FAILED
            return
        with self._cond:
            self.state = WorkerState.READY if not self._stopping else WorkerState.STOPPED
        self._metrics.set_engine_stats(engine.stats)
        if self._on_ready is not None:
            self._on_ready(engine)
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        break
                    job = self._pending.popleft()
                    self._metrics.deferred = len(self._pending)
                    self._current = job
                try:
                    self._execute(engine, job)
                finally:
                    with self._cond:
                        self._current = None
        finally:
            self.state = WorkerState.STOPPED
            engine.close()

    def _execute(self, engine: ChatEngine, job: ChatJob | CompletionJob) -> None:
        if job.cancel.is_set():
            error = (
                ServerShuttingDownError("the server is shutting down")
                if self._stopping
                else EngineNotReadyError("the request was cancelled")
            )
            job.channel.put(JobFailed(error))
            return
        self._metrics.processing = 1
        try:
            probe = getattr(job, "timing_probe", None)  # timings_per_token (live_timings.py)
            target = engine if probe is None else probe.wrap(engine)
            if isinstance(job, (CompletionJob, SlotJob)):
                for event in job.run(target):
                    if isinstance(event, CompletionDone):
                        self._metrics.record_turn(event.usage)
                    elif probe is not None and isinstance(event, CompletionToken):
                        job.channel.put(TimingsSnapshot(probe.timings()))
                    job.channel.put(event)
                return
            prompt = tokenize_prompt(engine, job.rendered)
            n_ctx = engine.info.n_ctx
            if len(prompt.tokens) >= n_ctx:
                raise ContextLengthExceededError(len(prompt.tokens), n_ctx)
            if job.grammar:
                engine.check_grammar(job.grammar)  # a bad grammar is a 400, even when streaming
            job.channel.put(JobStarted(len(prompt.tokens)))
            for event in run_turn(target, job.turn_request(prompt)):
                if isinstance(event, TurnDone):
                    self._metrics.record_turn(event.usage)
                    _log_turn(event)
                elif probe is not None:
                    job.channel.put(TimingsSnapshot(probe.timings()))
                job.channel.put(event)
        except TurnCancelledError:
            logger.info("the prompt's processing was cancelled")
            error = (
                ServerShuttingDownError("the server is shutting down")
                if self._stopping
                else EngineNotReadyError("the request was cancelled")
            )
            job.channel.put(JobFailed(error))
        except Exception as exc:  # the route maps the type to an HTTP error
            if classify(exc).status >= 500:
                logger.exception("generation failed")
            else:
                logger.info("request refused: %s", exc)
            self._metrics.record_failure()
            job.channel.put(JobFailed(exc))
        finally:
            self._metrics.processing = 0
            self._metrics.set_engine_stats(engine.stats)


def _log_turn(done: TurnDone) -> None:
    u = done.usage
    new = u.prompt_tokens - u.cached_tokens
    logger.info(
        "prompt %d tokens (%d cached, %d processed in %.0f ms, %.1f t/s); generated %d tokens in %.0f ms "
        "(%.1f t/s); finish %s",
        u.prompt_tokens,
        u.cached_tokens,
        new,
        u.prefill_ms,
        new / (u.prefill_ms / 1e3) if u.prefill_ms else 0.0,
        u.completion_tokens,
        u.decode_ms,
        u.completion_tokens / (u.decode_ms / 1e3) if u.decode_ms else 0.0,
        done.finish_reason.value,
    )
