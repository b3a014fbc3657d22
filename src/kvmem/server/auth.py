"""API-key authentication: `Authorization: Bearer KEY` or `X-Api-Key: KEY`.

Applied as a dependency on the API routes only: /health, /v1/health, CORS preflights and
the chat page's static assets stay public. No keys configured: no authentication. Keys
are compared in constant time, against every configured key.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from kvmem.cli.api_keys import ApiKeys
from kvmem.errors import AuthenticationError


class ApiKeyChecker:
    __slots__ = ("_keys",)

    def __init__(self, keys: ApiKeys) -> None:
        self._keys = tuple(k.encode("ascii") for k in keys.keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def is_valid(self, presented: str | None) -> bool:
        if not self._keys:
            return True
        if not presented:
            return False
        candidate = presented.encode("utf-8", "surrogateescape")
        matched = False
        for key in self._keys:
            matched |= hmac.compare_digest(candidate, key)
        return matched

    def check(self, authorization: str | None, x_api_key: str | None) -> None:
        """Raise AuthenticationError unless one header carries a configured key."""
        if not self._keys:
            return
        if self.is_valid(bearer_token(authorization)) or self.is_valid(x_api_key):
            return
        if authorization is None and x_api_key is None:
            raise AuthenticationError(
                "missing API key: send 'Authorization: Bearer YOUR_KEY' or 'X-Api-Key: YOUR_KEY'"
            )
        raise AuthenticationError("invalid API key")


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


async def require_api_key(request: Request) -> None:
    """FastAPI dependency for protected routes."""
    checker: ApiKeyChecker = request.app.state.auth
    checker.check(request.headers.get("authorization"), request.headers.get("x-api-key"))
