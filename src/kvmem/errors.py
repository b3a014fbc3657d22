"""Every exception KVMem raises on purpose.

The server maps these types (never their message text) to HTTP errors in one place.
"""

from __future__ import annotations


class KVMemError(Exception):
    """Base class of all KVMem errors."""


class ConfigError(KVMemError):
    """An invalid flag, environment value or setting, found before the model loads.

    `flag` names the offending option (for example ``--kvmem-budget``).
    """

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}" if flag else message)
        self.flag = flag


class ModelNotFoundError(KVMemError):
    """The model file (or the default embedded model) cannot be found."""


class ModelLoadError(KVMemError):
    """llama.cpp refused to load the model or create a context."""


class ContextLengthExceededError(KVMemError):
    """A request is longer than the logical context (-c)."""

    def __init__(self, n_tokens: int, n_ctx: int) -> None:
        super().__init__(
            f"the request ({n_tokens} tokens) exceeds the available context size ({n_ctx} tokens)"
        )
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx


class ContextPoolExhaustedError(KVMemError):
    """--kv-unified: the lanes' running requests together would hold more than -c tokens
    (llama-server's "Context size has been exceeded.", a 500 there too)."""

    def __init__(self, needed: int, free: int, n_ctx: int) -> None:
        super().__init__(
            f"Context size has been exceeded. The request needs {needed} more tokens of the "
            f"{n_ctx}-token context the lanes share (--kv-unified); {free} are free"
        )
        self.needed = needed
        self.free = free
        self.n_ctx = n_ctx


class DecodeError(KVMemError):
    """llama_decode failed."""


class StateFormatError(KVMemError):
    """A llama.cpp sequence-state blob has a layout the codec does not know."""


class KVTransferError(KVMemError):
    """Moving KV between the GPU context and the host store failed."""


class StoreCorruptError(KVMemError):
    """A block file or session manifest on disk is torn, truncated or fails its checksum."""


class InvalidRequestError(KVMemError):
    """A malformed API request (bad field, type or value)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class GrammarDeadlineError(InvalidRequestError):
    """A grammar- or schema-constrained generation ran past `--grammar-deadline` seconds
    (kvmem.server.grammar_deadline): it ended between two tokens and its lane is free."""


class PinnedTooLargeError(KVMemError):
    """An agent harness's pinned control text (system prompt, tools, reminders) cannot fit
    the KVMem budget (HTTP 413; `--kvmem-harness-overflow fallback` lets it through)."""

    def __init__(self, harness: str, parts: list[tuple[str, int]], needed: int, budget: int):
        listed = ", ".join(f"{name}: {n} tokens" for name, n in parts)
        super().__init__(
            f"the {harness} request's pinned control text needs {needed} tokens of the GPU "
            f"window ({listed}; with the sink, recent and open blocks, in whole blocks) but the "
            f"KVMem budget is {budget} tokens: raise --kvmem-budget, or start the server "
            "with --kvmem-harness-overflow fallback to run it unpinned"
        )
        self.harness = harness
        self.parts = parts
        self.needed = needed
        self.budget = budget
        self.param = "messages"


class NotFoundError(KVMemError):
    """A request names an object the server does not have (a stored response id)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class AuthenticationError(KVMemError):
    """Missing or invalid API key."""


class QueueFullError(KVMemError):
    """The single generation slot is busy and the waiting queue is full."""


class TemplateError(KVMemError):
    """The chat template failed to render."""


class MemoryLayoutError(KVMemError, ValueError):
    """Arrays, ids or parameters handed to `kvmem.memory` do not fit its layout or state.

    A caller bug (wrong shape, dtype, unknown block id), not a user error.
    """


class EngineNotReadyError(KVMemError):
    """The server's model is still loading (or failed to load); retry later."""


class BenchServerError(KVMemError):
    """A benchmark's HTTP server answered with an error or could not be reached."""


class TurnCancelledError(KVMemError):
    """A turn's cancel event was set while its prompt was being processed (prefill)."""


class ServerShuttingDownError(EngineNotReadyError):
    """The server received SIGTERM/SIGINT/SIGHUP: queued and running requests end."""


class RpcUnavailableError(KVMemError):
    """The llama.cpp build has no RPC backend (libggml-rpc), or a worker cannot be reached."""


class RpcWorkerLostError(EngineNotReadyError):
    """An RPC worker holding some of the model's layers went away (the engine cannot go on)."""


class ClientGoneError(KVMemError):
    """The client disconnected while sending its body, or while its job waited or ran
    (answered with nginx's 499, which nobody reads)."""


class JobCrashedError(KVMemError):
    """A job failed on the engine worker with an unexpected exception (`error`); the
    worker has logged and counted it, so the route only answers its 500."""

    def __init__(self, error: BaseException) -> None:
        super().__init__("internal server error")
        self.error = error
