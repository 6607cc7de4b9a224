"""CSRF protection for the dashboard's actions: a cookie, and a form token bound to it.

Each browser gets a random cookie (``HttpOnly``, ``SameSite=Strict``); each form carries
``HMAC(secret, cookie)``. Another site can make a browser send the cookie (not with
``SameSite=Strict``, in browsers that honour it) but cannot read it or the page, so it
cannot forge the token. A POST also has to come from the dashboard's own origin when the
browser says where it comes from (``Origin``). The secret is made per app unless given:
give the same one to every worker process that serves the dashboard.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ("COOKIE", "Csrf")

COOKIE = "cronlock_csrf"
_COOKIE_BYTES = 32


class Csrf:
    """Issues and checks the tokens of one dashboard (*secret*: ``None`` makes one)."""

    def __init__(self, secret: bytes | str | None = None) -> None:
        if secret is None:
            secret = secrets.token_bytes(32)
        self._secret = secret.encode() if isinstance(secret, str) else secret

    @staticmethod
    def cookie(request: Request) -> tuple[str, bool]:
        """The browser's cookie value, or a new one; and whether it is new (to be set)."""
        value = request.cookies.get(COOKIE, "")
        if 20 <= len(value) <= 100 and value.isascii():
            return value, False
        return secrets.token_urlsafe(_COOKIE_BYTES), True

    def token(self, cookie: str) -> str:
        """The form token that goes with *cookie*."""
        return hmac.new(self._secret, cookie.encode(), hashlib.sha256).hexdigest()

    def check(self, request: Request, token: str | None) -> bool:
        """Whether a POST with form *token* may act: same origin, and the token matches
        the browser's cookie."""
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            parts = urlsplit(origin)
            if parts.netloc != request.headers.get("host", ""):
                return False
        elif origin == "null":
            return False
        cookie = request.cookies.get(COOKIE)
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token(cookie), token)
