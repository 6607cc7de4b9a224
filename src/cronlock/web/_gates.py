"""Who may read the dashboard and who may act on it: the service's own callables.

``authorize`` gates the actions, ``authorize_read`` every page, fragment and JSON answer
(and the actions too: acting needs reading); the static files stay open (they are the
same for everyone and say nothing of the fleet). Each callable takes the request and
answers, sync or async: ``True`` or a non-empty string allows it, and a string names who
asked (it is logged with each action); anything else refuses it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request

__all__ = ("READ_REFUSED", "Authorize", "ReadRefused", "client", "verdict")

Authorize = Callable[[Request], bool | str | Awaitable[bool | str]]
"""Decides whether *request* may act (``authorize``) or read (``authorize_read``):
``True`` or a non-empty string (who asked, for the log) allows it."""

READ_REFUSED = "refused: you may not read this dashboard"


class ReadRefused(HTTPException):
    """A request ``authorize_read`` refused: its 403 page carries no CSRF cookie or token."""

    def __init__(self) -> None:
        super().__init__(403, READ_REFUSED)


async def verdict(gate: Authorize, request: Request) -> str | None:
    """What *gate* says of *request*: ``None`` refused, else who asked (``""`` unnamed)."""
    answer = gate(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is True:
        return ""
    if isinstance(answer, str) and answer:
        return answer
    return None


def client(request: Request) -> str:
    """The request's peer as ``host:port`` (behind a proxy: the proxy, unless the server
    takes the client's address from its headers, as ``uvicorn --proxy-headers`` does)."""
    peer = request.client
    return "unknown" if peer is None else f"{peer.host}:{peer.port}"
