"""Serving the dashboard (or any plain ASGI app) from an aiohttp service, on its own port.

``app.router.add_route("*", "/cron/{tail:.*}", aiohttp_handler(dashboard, prefix="/cron"))``
hands each request under the prefix to the ASGI app, in aiohttp's event loop, sharing the
service's pool. The dashboard needs no more of ASGI than one request body in, one response
out (its live updates poll), so the bridge is that and nothing else: no streaming, no
websockets, no lifespan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ("aiohttp_handler",)

_MAX_BODY = 64 * 1024
_HOP_BY_HOP = frozenset({b"content-length", b"transfer-encoding", b"connection"})


def aiohttp_handler(asgi: Any, *, prefix: str) -> Callable[[Any], Awaitable[Any]]:
    """An aiohttp handler that serves the ASGI app *asgi* mounted at *prefix* (``/cron``).

    Route every method of ``<prefix>/{tail:.*}`` and ``<prefix>`` to it. Request bodies
    over 64 KiB are refused (413): the dashboard's forms are a few hundred bytes.
    """
    from aiohttp import web
    from multidict import CIMultiDict

    root = "/" + prefix.strip("/") if prefix.strip("/") else ""

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > _MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(
                max_size=_MAX_BODY, actual_size=request.content_length
            )
        body = await request.read()
        if len(body) > _MAX_BODY:
            raise web.HTTPRequestEntityTooLarge(max_size=_MAX_BODY, actual_size=len(body))
        path = request.path if request.path != root else root + "/"
        host, _, port = request.host.partition(":")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": f"{request.version.major}.{request.version.minor}",
            "method": request.method,
            "scheme": request.scheme,
            "path": path,
            "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
            "query_string": request.query_string.encode("latin-1"),
            "root_path": root,
            "headers": [(k.lower(), v) for k, v in request.raw_headers],
            "client": (request.remote or "", 0),
            "server": (host, int(port) if port.isdigit() else 80),
        }
        sent = False
        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await asgi(scope, receive, send)
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in start.get("headers", []):
            if name.lower() not in _HOP_BY_HOP:
                headers.add(name.decode("latin-1"), value.decode("latin-1"))
        return web.Response(status=start.get("status", 500), headers=headers, body=b"".join(chunks))

    return handle
