"""llama-server's header-name casing for the CORS headers.

HTTP header names are case-insensitive, but some clients keep them in a plain dict
(llama.cpp's own test utils: `dict(response.headers)`) and look up
`Access-Control-Allow-Origin` as llama-server (cpp-httplib) writes it. Starlette writes
header names in lower case; this outermost ASGI layer rewrites the `Access-Control-*`
names to llama-server's casing and leaves everything else as it is.
"""

from __future__ import annotations

from typing import Any

_CASED = {
    name.lower().encode(): name.encode()
    for name in (
        "Access-Control-Allow-Origin",
        "Access-Control-Allow-Credentials",
        "Access-Control-Allow-Methods",
        "Access-Control-Allow-Headers",
        "Access-Control-Max-Age",
        "Access-Control-Expose-Headers",
    )
}


class HeaderCase:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def cased(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [
                        (_CASED.get(bytes(k).lower(), k), v) for k, v in message.get("headers", [])
                    ],
                }
            await send(message)

        await self.app(scope, receive, cased)
