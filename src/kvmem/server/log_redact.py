"""The access log (`-lv` >= 4) never shows credentials passed in a URL's query string."""

from __future__ import annotations

import logging
import re

_SECRET_PARAM = re.compile(
    r"((?:^|[?&;])(?:api[_-]?key|key|token|access[_-]?token|auth|password)=)[^&;#\s]*",
    re.IGNORECASE,
)


def redact_query(path: str) -> str:
    """`/v1/models?api_key=sk-1&x=2` -> `/v1/models?api_key=***&x=2`."""
    return _SECRET_PARAM.sub(r"\1***", path)


class AccessLogRedactor(logging.Filter):
    """uvicorn's access record args are (client, method, path with query, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def install_access_log_redaction() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, AccessLogRedactor) for f in access.filters):
        access.addFilter(AccessLogRedactor())
