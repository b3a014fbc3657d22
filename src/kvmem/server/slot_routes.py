"""`POST /slots/{id}?action=save|restore|erase` (llama-server's slot actions).

Without `--slot-save-path` the answer is llama-server's 501. The one KVMem lane is slot 0;
another id is 400 `Invalid slot ID`. `filename` must be a plain file name inside the
directory (no separators, `..`, or NUL): anything else is 400 `Invalid filename`, before
the file system is touched. Responses carry llama-server's fields: `n_saved`/`n_written`
and `timings.save_ms`, `n_restored`/`n_read` and `timings.restore_ms`, `n_erased`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from kvmem.errors import InvalidRequestError
from kvmem.server.auth import require_api_key
from kvmem.server.channel import EventChannel, JobFailed
from kvmem.server.error_map import envelope, error_response
from kvmem.server.json_body import parse_json_body
from kvmem.server.routes import _ready_state
from kvmem.server.slot_job import SlotAction, SlotDone, SlotJob

if TYPE_CHECKING:
    from kvmem.server.app import ServerState

slot_router = APIRouter(dependencies=[Depends(require_api_key)])

_MAX_NAME = 255


def slot_file(directory: str, filename: Any) -> Path:
    """The path of `filename` in `directory`; InvalidRequestError unless it is a plain name."""
    if (
        not isinstance(filename, str)
        or not filename
        or len(filename.encode("utf-8", "surrogatepass")) > _MAX_NAME
        or filename in (".", "..")
        or any(c in filename for c in "/\\\0")
        or any(ord(c) < 32 for c in filename)
    ):
        raise InvalidRequestError("Invalid filename", param="filename")
    root = Path(directory).resolve()
    path = (root / filename).resolve()
    if path.parent != root:
        raise InvalidRequestError("Invalid filename", param="filename")
    return path


def _invalid(message: str) -> JSONResponse:
    return envelope(400, message, "invalid_request_error")


async def _run(state: ServerState, job: SlotJob) -> SlotDone:
    state.worker.submit(job)
    event = await job.channel.get()
    if isinstance(event, JobFailed):
        raise event.error
    assert isinstance(event, SlotDone)
    return event


@slot_router.post("/slots/{id_slot}")
async def slot_action(request: Request, id_slot: str) -> JSONResponse:
    state = _ready_state(request)
    directory = state.settings.slot_save_path
    if directory is None:
        return envelope(
            501,
            "This server does not support slots action. Start it with `--slot-save-path`",
            "not_supported_error",
        )
    try:
        slot = int(id_slot)
    except ValueError:
        return _invalid("Invalid slot ID")
    if slot != 0:
        return _invalid("Invalid slot ID")
    try:
        action = SlotAction(request.query_params.get("action", ""))
    except ValueError:
        return _invalid("Invalid action")
    path = None
    filename = None
    if action is not SlotAction.ERASE:
        body = parse_json_body(await request.body())
        if not isinstance(body, dict) or "filename" not in body:
            return _invalid("'filename' is required")
        filename = body["filename"]
        path = slot_file(directory, filename)
    job = SlotJob(action, path, EventChannel(asyncio.get_running_loop()))
    try:
        result = (await _run(state, job)).result
    except InvalidRequestError as exc:
        return error_response(exc)
    except OSError as exc:
        return envelope(500, f"Unable to save slot: {exc.strerror or exc}", "server_error")
    if action is SlotAction.SAVE:
        body_out = {"id_slot": 0, "filename": filename, "n_saved": result.n_tokens,
                    "n_written": result.n_bytes, "timings": {"save_ms": result.ms}}  # fmt: skip
    elif action is SlotAction.RESTORE:
        body_out = {"id_slot": 0, "filename": filename, "n_restored": result.n_tokens,
                    "n_read": result.n_bytes, "timings": {"restore_ms": result.ms}}  # fmt: skip
    else:
        body_out = {"id_slot": 0, "n_erased": result.n_tokens}
    return JSONResponse(body_out)
