"""CSRF protection for the dashboard's actions (who may act is :mod:`._authorize`'s).

An action ``authorize`` admits must also pass the CSRF check: a cookie, and a form token
bound to it. Each browser gets a cookie the dashboard made (``HttpOnly``,
``SameSite=Strict``): random, followed by its own MAC under the key, so a cookie the
dashboard did not make (set by another site sharing the domain, or by hand: a fixation)
is never given a token; it is replaced by a fresh one. Each form carries ``key id +
HMAC(key, cookie)``. Another site can make a browser send the cookie (not with
``SameSite=Strict``, in browsers that honour it) but cannot read it or the page, so it
cannot forge the token. A POST must also say it comes from the dashboard's own scheme
and host: by its ``Origin``, or, without one, its ``Referer``; with neither, it is
refused (browsers send ``Origin`` with every POST form).

The key is the fleet's: given (``csrf_secret=``), or else read from the ledger's secrets
table (made there by the first process), so every worker process accepts every other's
tokens. The key id (a digest of the key, which tells nothing about it) lets a refusal say
"made with another key" apart from "does not match your cookie".
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
_COOKIE_MAC_CHARS = 32
_ID_CHARS = 8
_MAC_CHARS = 64
_HEX = frozenset("0123456789abcdef")

FOREIGN = (
    "refused: this form was sent from another site than this dashboard (its Origin, or its "
    "Referer, is not this scheme and host; behind a proxy, pass the Host header on "
    "unchanged, and the scheme, e.g. uvicorn --proxy-headers); use the dashboard's page"
)
NO_ORIGIN = (
    "refused: the request says neither where it comes from (no Origin, no Referer header); "
    "browsers send one with every form: use the dashboard's page (a script must send "
    "Origin: <scheme>://<host> of the dashboard)"
)
FORGED_COOKIE = (
    f"refused: the browser's dashboard cookie ({COOKIE}) was not made by this dashboard "
    "(set by another site or by hand, or made with an older key); it has been replaced "
    "with a fresh one: reload the page"
)
NO_COOKIE = (
    f"refused: the browser sent no dashboard cookie ({COOKIE}): cookies are blocked for "
    "this site, or the form was sent without loading the page first; allow cookies for "
    "this site and reload the page"
)
NO_TOKEN = "refused: the form carried no CSRF token; reload the page and use its buttons"
MALFORMED = (
    "refused: the CSRF token is not one this dashboard makes (a page from an older "
    "cronlock, or a form made by hand); reload the page"
)
OTHER_KEY = (
    "refused: the CSRF token was made with another key than this process's: another "
    "process serves this dashboard with a key of its own (give every process the same "
    "csrf_secret=, or none, so that they share the ledger's key), or the key changed "
    "since the page was loaded; reload the page"
)
OTHER_COOKIE = (
    "refused: the CSRF token belongs to another cookie than this browser's (the cookie "
    "was replaced since the page was loaded, e.g. cleared or set again in another tab); "
    "reload the page"
)


class Csrf:
    """Issues and checks the tokens of one dashboard under *secret*."""

    def __init__(self, secret: bytes | str) -> None:
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._id = hmac.new(self._secret, b"cronlock csrf key id", hashlib.sha256).hexdigest()
        self._id = self._id[:_ID_CHARS]

    def cookie(self, request: Request) -> tuple[str, bool]:
        """The browser's cookie, if this dashboard made it, or a new one; and whether it
        is new (to be set)."""
        value = request.cookies.get(COOKIE, "")
        if self._made(value):
            return value, False
        nonce = secrets.token_urlsafe(_COOKIE_BYTES)
        return f"{nonce}.{self._cookie_mac(nonce)}", True

    def _cookie_mac(self, nonce: str) -> str:
        mac = hmac.new(self._secret, b"cronlock csrf cookie " + nonce.encode(), hashlib.sha256)
        return mac.hexdigest()[:_COOKIE_MAC_CHARS]

    def _made(self, cookie: str) -> bool:
        """*cookie* is one this dashboard made under this key (its MAC matches)."""
        if not (cookie.isascii() and len(cookie) <= 100):
            return False
        nonce, dot, mac = cookie.rpartition(".")
        return bool(dot and nonce) and hmac.compare_digest(self._cookie_mac(nonce), mac)

    def token(self, cookie: str) -> str:
        """The form token that goes with *cookie*: the key's id, then the HMAC."""
        return self._id + hmac.new(self._secret, cookie.encode(), hashlib.sha256).hexdigest()

    def refusal(self, request: Request, token: str | None) -> str | None:
        """Why a POST with form *token* may not act (the 403's message), or ``None``: it
        comes from this dashboard's scheme and host, its cookie is one this dashboard
        made, and the token matches that cookie."""
        source = request.headers.get("origin") or request.headers.get("referer")
        if source is None:
            return NO_ORIGIN
        where = urlsplit(source)
        if (where.scheme, where.netloc) != (request.url.scheme, request.headers.get("host")):
            return FOREIGN  # "null" (an opaque origin) included
        cookie = request.cookies.get(COOKIE, "")
        if not cookie:
            return NO_COOKIE
        if not self._made(cookie):
            return FORGED_COOKIE
        if not token:
            return NO_TOKEN
        if len(token) != _ID_CHARS + _MAC_CHARS or not set(token) <= _HEX:
            return MALFORMED
        if not hmac.compare_digest(token[:_ID_CHARS], self._id):
            return OTHER_KEY
        if not hmac.compare_digest(self.token(cookie), token):
            return OTHER_COOKIE
        return None
