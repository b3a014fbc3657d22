"""`POST /slots/{id}?action=save|restore|erase` (llama-server's slot actions).

Without `--slot-save-path` the answer is llama-server's 501. The one KVMem lane is slot 0;
another id is 400 `Invalid slot ID`. `filename` must be a plain file name inside the
directory (no separators, `..`, or NUL): anything else is 400 `Invalid filename`, before
the file system is touched. Responses carry llama-server's fields: `n_saved`/`n_written`
and `timings.save_ms`, `n_restored`/`n_read` and `timings.restore_ms`, `n_erased`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from kvmem.errors import InvalidRequestError, JobCrashedError
from kvmem.server.error_map import envelope, error_response
from kvmem.server.flow import read_json, submit
from kvmem.server.slot_job import SlotAction, SlotDone, new_slot_job
from kvmem.server.state import ready_state

slot_router = APIRouter()

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


@slot_router.post("/slots/{id_slot}")
async def slot_action(request: Request, id_slot: str) -> Response:
    state = ready_state(request)
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
        body = await read_json(request)
        if not isinstance(body, dict) or "filename" not in body:
            return _invalid("'filename' is required")
        filename = body["filename"]
        path = slot_file(directory, filename)
    try:
        done = await submit(request, state, new_slot_job(action, path)).first()
    except InvalidRequestError as exc:
        return error_response(exc)
    except JobCrashedError as exc:
        if not isinstance(exc.error, OSError):
            raise
        reason = exc.error.strerror or exc.error
        return envelope(500, f"Unable to save slot: {reason}", "server_error")
    assert isinstance(done, SlotDone)
    result = done.result
    if action is SlotAction.SAVE:
        body_out = {"id_slot": 0, "filename": filename, "n_saved": result.n_tokens,
                    "n_written": result.n_bytes, "timings": {"save_ms": result.ms}}  # fmt: skip
    elif action is SlotAction.RESTORE:
        body_out = {"id_slot": 0, "filename": filename, "n_restored": result.n_tokens,
                    "n_read": result.n_bytes, "timings": {"restore_ms": result.ms}}  # fmt: skip
    else:
        body_out = {"id_slot": 0, "n_erased": result.n_tokens}
    return JSONResponse(body_out)
