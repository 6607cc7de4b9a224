"""Response headers that keep the dashboard's pages from being framed, sniffed or scripted.

The pages load one script and one stylesheet from the dashboard itself and nothing else,
so the Content-Security-Policy forbids every inline script and every other origin: even
if some text escaped the templates' escaping, a browser would not run it.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ("SecurityHeaders", "crashed")

_HEADERS = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)


class SecurityHeaders:
    """ASGI middleware adding :data:`_HEADERS` to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @classmethod
    def middleware(cls) -> Middleware:
        """This middleware, for ``Starlette(middleware=[...])``."""
        return Middleware(cls)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def crashed(request: Request, exc: Exception) -> Response:
    """The 500 of an unexpected error, with the headers: Starlette answers it outside
    every middleware (the error is then raised on, for the server's log), so they are
    set here. It says nothing of the error."""
    response = PlainTextResponse("internal error: see the server's log", status_code=500)
    response.raw_headers.extend(_HEADERS)
    return response
