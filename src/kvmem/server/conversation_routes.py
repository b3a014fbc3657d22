"""`GET` and `DELETE /kvmem/conversations/{id}`: a client's named conversation.

A request names its conversation with `{"kvmem": {"conversation_id": ...}}`
(server/kvmem_options.py). GET shows what the server keeps of it (tokens, host bytes and
blocks, whether it holds the GPU window, its lane); DELETE forgets it on its lane's
thread, after any turn running there, freeing its host memory (`freed_bytes`; the
`kvmem_host_store_bytes` metric drops by as much). An id no lane holds is a 404 in
OpenAI's error envelope. Both sit behind the API key, as every route but /health.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvmem.errors import NotFoundError
from kvmem.server.conversation_job import ConversationDone, new_conversation_job
from kvmem.server.flow import submit
from kvmem.server.kvmem_options import CONVERSATION_ID
from kvmem.server.state import ready_state

conversation_router = APIRouter()

OBJECT = "kvmem.conversation"


def _unknown(conversation_id: str) -> NotFoundError:
    shown = conversation_id if re.fullmatch(CONVERSATION_ID, conversation_id) else "(invalid id)"
    return NotFoundError(f"no conversation with id {shown!r}", "conversation_id")


@conversation_router.get("/kvmem/conversations/{conversation_id}")
async def get_conversation(request: Request, conversation_id: str) -> JSONResponse:
    state = ready_state(request)
    found = state.worker.conversation(conversation_id)
    if found is None:
        raise _unknown(conversation_id)
    lane, summary = found
    return JSONResponse(
        {
            "id": conversation_id,
            "object": OBJECT,
            "lane": lane,
            "tokens": summary.tokens,
            "host_bytes": summary.host_bytes,
            "host_blocks": summary.host_blocks,
            "active": summary.active,
            "last_used": summary.last_used,
        }
    )


@conversation_router.delete("/kvmem/conversations/{conversation_id}")
async def delete_conversation(request: Request, conversation_id: str) -> JSONResponse:
    state = ready_state(request)
    if state.worker.conversation_lane(conversation_id) is None:
        raise _unknown(conversation_id)  # before queueing: nothing to wait for
    done = await submit(request, state, new_conversation_job(conversation_id)).first()
    assert isinstance(done, ConversationDone)
    if done.freed_bytes is None:  # deleted meanwhile by another request
        raise _unknown(conversation_id)
    return JSONResponse(
        {
            "id": conversation_id,
            "object": f"{OBJECT}.deleted",
            "deleted": True,
            "freed_bytes": done.freed_bytes,
        }
    )
