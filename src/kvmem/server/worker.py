"""The engine worker: one thread per lane owns its engine; requests wait in a bounded queue.

The first thread loads the model (the server answers /health with 503 meanwhile); with
`--parallel N` the loaded `EngineLanes` has N lanes and N - 1 more threads start. Each
lane runs one job at a time: tokenize the rendered prompt, check the context size, run
the turn and send every event through the job's channel. A waiting job goes to the free
lane whose history shares the longest prefix with it (`_route`); a busy lane is never
taken. The queue bound counts the jobs beyond the free lanes. A job whose client went away (cancel set)
is skipped, or stopped at the next token; the session then holds exactly the tokens
produced so far, which the next request reuses as far as they match.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvmem.chat.prompt import PromptTokens, tokenize_prompt
from kvmem.chat.protocol import ChatEngine
from kvmem.chat.turn import ChatFinish, TurnDone, run_turn
from kvmem.errors import (
    ContextLengthExceededError,
    ContextPoolExhaustedError,
    EngineNotReadyError,
    QueueFullError,
    RpcWorkerLostError,
    ServerShuttingDownError,
    TurnCancelledError,
)
from kvmem.server.channel import JobFailed, JobStarted
from kvmem.server.chat_job import ChatJob
from kvmem.server.completion_job import CompletionDone, CompletionJob, CompletionToken, StopType
from kvmem.server.context_pool import SharedContextPool
from kvmem.server.conversation_job import ConversationJob
from kvmem.server.error_map import classify
from kvmem.server.grammar_deadline import wrap_engine
from kvmem.server.live_timings import TimingsSnapshot
from kvmem.server.metrics import ServerMetrics
from kvmem.server.slot_job import SlotJob

logger = logging.getLogger(__name__)

Job = ChatJob | CompletionJob | SlotJob | ConversationJob


class WorkerState(Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "rpc_worker_lost"  # an RPC worker holding layers went away (mark_lost)


@dataclass(slots=True, eq=False)
class _Lane:
    """One lane: its engine, the job it runs and the job routed to it."""

    index: int
    engine: ChatEngine
    current: Job | None = None
    assigned: tuple[Job, PromptTokens | None] | None = None
    last_used: float = 0.0

    @property
    def free(self) -> bool:
        return self.current is None and self.assigned is None


class EngineWorker:
    def __init__(
        self,
        load: Callable[[], ChatEngine],
        queue_size: int,
        metrics: ServerMetrics,
        on_ready: Callable[[ChatEngine], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
        grammar_deadline_s: float | None = None,
        kv_unified: bool = False,
    ) -> None:
        self._load = load
        self._grammar_deadline_s = grammar_deadline_s  # --grammar-deadline (grammar_deadline.py)
        self._kv_unified = kv_unified
        self._pool: SharedContextPool | None = None  # --kv-unified with lanes (context_pool.py)
        self._queue_size = queue_size
        self._metrics = metrics
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._lanes: list[_Lane] = []
        self._busy_count = 0  # lanes running a job (kvmem_requests_processing)
        self._stats_source: ChatEngine | None = None  # the loaded engine (all lanes' stats)
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
        """A job is running on some lane."""
        return any(self.lanes_busy())

    def lanes_busy(self) -> list[bool]:
        """Per lane, whether it runs (or was handed) a job: the /slots `is_processing`."""
        with self._cond:
            return [not lane.free for lane in self._lanes]

    def submit(self, job: Job) -> None:
        """Queue `job`; EngineNotReadyError while loading, QueueFullError past the bound."""
        with self._cond:
            if self._stopping:
                raise ServerShuttingDownError("the server is shutting down")
            if self.state is WorkerState.LOST and isinstance(self.load_error, RpcWorkerLostError):
                raise self.load_error
            if self.state is not WorkerState.READY:
                raise EngineNotReadyError(f"the model is not ready ({self.state.value})")
            capacity = self._queue_size + sum(1 for lane in self._lanes if lane.free)
            if len(self._pending) >= capacity:
                self._metrics.record_rejected()
                raise QueueFullError(
                    f"the server is busy: {len(self._pending)} requests are already waiting "
                    f"(--queue-size {self._queue_size})"
                )
            self._pending.append(job)
            self._metrics.deferred = len(self._pending)
            self._cond.notify_all()

    def cancel_all(self) -> None:
        """Stop the running generations and refuse every waiting job (shutdown)."""
        with self._cond:
            self._stopping = True
            waiting = list(self._pending)
            for lane in self._lanes:
                if lane.current is not None:
                    lane.current.cancel.set()
                if lane.assigned is not None:
                    waiting.append(lane.assigned[0])
                    lane.assigned = None
            for job in waiting:
                job.cancel.set()
                job.channel.put(JobFailed(ServerShuttingDownError("the server is shutting down")))
            self._pending.clear()
            self._metrics.deferred = 0
            self._cond.notify_all()

    def mark_lost(self, error: RpcWorkerLostError) -> None:
        """An RPC worker went away mid-graph: the running, routed and waiting jobs fail
        with `error` and later ones are refused. The engine thread that met it stays
        parked inside llama.cpp (kvmem.engine.llama.rpc), so the engine is never used again."""
        with self._cond:
            self.state = WorkerState.LOST
            self.load_error = error
            jobs = [lane.current for lane in self._lanes if lane.current is not None]
            jobs += [lane.assigned[0] for lane in self._lanes if lane.assigned is not None]
            jobs += list(self._pending)
            self._pending.clear()
            self._metrics.deferred = 0
            for job in jobs:
                job.channel.put(JobFailed(error))
            self._cond.notify_all()

    def withdraw(self, job: Job) -> None:
        """Take a job whose client went away out of the queue (a no-op once it runs)."""
        with self._cond:
            for lane in self._lanes:
                if lane.assigned is not None and lane.assigned[0] is job:
                    lane.assigned = None
                    self._cond.notify_all()
                    return
            try:
                self._pending.remove(job)
            except ValueError:
                return
            self._metrics.deferred = len(self._pending)

    def stop(self) -> None:
        """cancel_all, then wait until every lane has left llama.cpp and the engine is
        closed (a running prefill stops at its next chunk, a generation at its next token;
        a model still loading finishes loading first). Python must not exit while a
        llama.cpp call is in flight."""
        self.cancel_all()
        if not self._thread.is_alive() or self.state is WorkerState.LOST:
            return  # a lost RPC worker's engine thread never comes back
        waited = 0.0
        while self._thread.is_alive():
            self._thread.join(1.0)
            waited += 1.0
            if self._thread.is_alive() and waited % 10 == 0:
                logger.warning("waiting for the engine threads to stop (%.0f s)", waited)

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
        engines = list(getattr(engine, "lanes", None) or [engine])  # EngineLanes: N lanes
        if self._kv_unified and len(engines) > 1:
            self._pool = SharedContextPool(engines[0].info.n_ctx)
        with self._cond:
            self._lanes = [_Lane(i, e) for i, e in enumerate(engines)]
            self.state = WorkerState.READY if not self._stopping else WorkerState.STOPPED
        self._stats_source = engine
        self._metrics.set_engine_stats(engine.stats)
        self._metrics.read_live(engine.tier_gauges)
        if self._on_ready is not None:
            self._on_ready(engine)
        others = [
            threading.Thread(target=self._serve, args=(lane,), name=f"kvmem-lane-{lane.index}")
            for lane in self._lanes[1:]
        ]
        try:
            for thread in others:
                thread.start()
            self._serve(self._lanes[0])  # lane 0 runs on this thread
        finally:
            for thread in others:
                thread.join()
            self.state = WorkerState.STOPPED
            engine.close()

    def _serve(self, lane: _Lane) -> None:
        """A lane's loop: run the jobs routed to it until shutdown; only this thread
        touches the lane's llama.cpp context."""
        while True:
            taken = self._next_job(lane)
            if taken is None:
                return
            job, prompt = taken
            try:
                self._execute(lane, job, prompt)
            finally:
                with self._cond:
                    lane.current = None
                    lane.last_used = time.monotonic()
                    self._cond.notify_all()

    def _next_job(self, lane: _Lane) -> tuple[Job, PromptTokens | None] | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                if lane.assigned is not None:
                    taken, lane.assigned = lane.assigned, None
                    lane.current = taken[0]
                    return taken
                if self._pending:
                    job = self._pending.popleft()
                    target, prompt = self._route(job)
                    if target is None:  # a slot action waits for its lane (slot 0: lane 0)
                        self._pending.appendleft(job)
                        self._cond.wait()
                        continue
                    self._metrics.deferred = len(self._pending)
                    if target is lane:
                        lane.current = job
                        return job, prompt
                    target.assigned = (job, prompt)
                    self._cond.notify_all()
                    continue
                self._cond.wait()

    def _route(self, job: Job) -> tuple[_Lane | None, PromptTokens | None]:
        """The free lane that reuses the most of the job's prompt, less the history it would
        drop (`route_score`; ties: the lane idle longest); a busy lane is never taken. Called under the lock
        by a free lane, so one exists. A chat prompt tokenized here is passed on."""
        if isinstance(job, SlotJob):  # /slots/0 is lane 0's session
            first = self._lanes[0]
            return (first if first.free else None), None
        name = getattr(job, "conversation_id", None)
        holder = self.conversation_lane(name) if name is not None else None
        if holder is not None:  # a named conversation runs on the lane holding it
            return (holder if holder.free else None), None
        free = [lane for lane in self._lanes if lane.free]
        if isinstance(job, ConversationJob):
            return free[0], None  # no lane holds it: the job answers "not found"
        if len(free) == 1:
            return free[0], None
        prompt: PromptTokens | None = None
        if isinstance(job, CompletionJob):
            tokens = job.tokens
        else:
            try:
                prompt = tokenize_prompt(free[0].engine, job.rendered)
            except Exception:  # _execute reports it on the lane it lands on
                return min(free, key=lambda lane: lane.last_used), None
            tokens = prompt.tokens

        def score(lane: _Lane) -> tuple[int, float]:
            prefix = getattr(lane.engine, "route_score", None)
            return (prefix(tokens) if prefix is not None else 0, -lane.last_used)

        return max(free, key=score), prompt

    def conversation_lane(self, name: str) -> _Lane | None:
        """The lane whose engine holds the client's conversation `name` (None: none)."""
        for lane in self._lanes:
            holds = getattr(lane.engine, "holds_conversation", None)
            if holds is not None and holds(name):
                return lane
        return None

    def conversation(self, name: str) -> tuple[int, Any] | None:
        """The lane index and summary of the conversation `name` (None: no lane holds it)."""
        for lane in list(self._lanes):
            describe = getattr(lane.engine, "conversation", None)
            summary = describe(name) if describe is not None else None
            if summary is not None:
                return lane.index, summary
        return None

    def _set_processing(self, delta: int) -> None:
        with self._cond:
            self._busy_count += delta
            self._metrics.processing = self._busy_count

    def _execute(self, lane: _Lane, job: Job, routed: PromptTokens | None = None) -> None:
        engine = lane.engine
        if job.cancel.is_set():
            error = (
                ServerShuttingDownError("the server is shutting down")
                if self._stopping
                else EngineNotReadyError("the request was cancelled")
            )
            job.channel.put(JobFailed(error))
            return
        self._set_processing(1)
        try:
            probe = getattr(job, "timing_probe", None)  # timings_per_token (live_timings.py)
            target = wrap_engine(engine, self._grammar_deadline_s)
            if self._pool is not None:
                target = self._pool.wrap(target, lane.index)
            target = target if probe is None else probe.wrap(target)
            reporter = getattr(job, "progress", None)  # return_progress (prompt_progress.py)
            target = target if reporter is None else reporter.wrap(target)
            use = getattr(engine, "use_conversation", None)
            if use is not None:  # the client's conversation; None: routed by prefix
                use(getattr(job, "conversation_id", None))
            if isinstance(job, (CompletionJob, SlotJob, ConversationJob)):
                for event in job.run(target):
                    if isinstance(event, CompletionDone):
                        self._metrics.record_turn(event.usage)
                    elif probe is not None and isinstance(event, CompletionToken):
                        job.channel.put(TimingsSnapshot(probe.timings()))
                    job.channel.put(self._ending(event))
                return
            prompt = routed if routed is not None else tokenize_prompt(engine, job.rendered)
            n_ctx = engine.info.n_ctx
            if len(prompt.tokens) >= n_ctx:
                raise ContextLengthExceededError(len(prompt.tokens), n_ctx)
            if job.pin_limit is not None:  # an agent harness's pinned set: 413 past the budget
                job.pin_limit.check(prompt)
            if job.grammar:
                engine.check_grammar(job.grammar)  # a bad grammar is a 400, even when streaming
            job.channel.put(JobStarted(len(prompt.tokens)))
            for event in run_turn(target, job.turn_request(prompt)):
                if isinstance(event, TurnDone):
                    self._metrics.record_turn(event.usage)
                    _log_turn(event)
                elif probe is not None:
                    job.channel.put(TimingsSnapshot(probe.timings()))
                job.channel.put(self._ending(event))
        except TurnCancelledError:
            logger.info("the prompt's processing was cancelled")
            error = (
                ServerShuttingDownError("the server is shutting down")
                if self._stopping
                else EngineNotReadyError("the request was cancelled")
            )
            job.channel.put(JobFailed(error))
        except Exception as exc:  # the route maps the type to an HTTP error
            if classify(exc).status >= 500 and not isinstance(exc, ContextPoolExhaustedError):
                logger.exception("generation failed")
            else:
                logger.info("request refused: %s", exc)
            self._metrics.record_failure()
            job.channel.put(JobFailed(exc))
        finally:
            if self._pool is not None:
                self._pool.release(lane.index)
            self._set_processing(-1)
            self._metrics.set_engine_stats((self._stats_source or engine).stats)

    def _ending(self, event: Any) -> Any:
        """`event`, except that a generation cut short by shutdown ends with the
        shutting-down error (streams get a terminal error event, not a finished turn)."""
        cut = (isinstance(event, TurnDone) and event.finish_reason is ChatFinish.CANCELLED) or (
            isinstance(event, CompletionDone) and event.stop_type is StopType.NONE
        )
        if cut and self._stopping:
            logger.info("the generation was stopped by the shutdown")
            return JobFailed(ServerShuttingDownError("the server is shutting down"))
        return event


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
