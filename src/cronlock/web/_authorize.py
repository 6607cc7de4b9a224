"""Who may read the dashboard and who may act on it, and on what.

``authorize`` gates the actions, ``authorize_read`` every page, fragment and JSON answer
(and the actions too: acting needs reading); the static files stay open (they are the
same for everyone and say nothing of the fleet). Each callable answers, sync or async:
``True`` or a non-empty string allows, and a string names who asked (it is logged with
each action and recorded as who made the change); anything else refuses.

A callable that takes the request alone decides for every action alike, as before. One
that also accepts a second positional argument is given the :class:`Action` as well: its
verb, its target (a job's or a stored schedule's name) and the fields it changes, so it
can allow one tenant's schedules and refuse another's, or allow a change of the schedule
but not of the kwargs. ``authorize`` is also asked, with the verb ``read-kwargs``, who may
see a stored schedule's kwargs on the schedules page (:mod:`._schedules`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

__all__ = ("READ_REFUSED", "Action", "Authorize", "Gate", "ReadRefused", "client")


@dataclass(frozen=True, slots=True)
class Action:
    """What a request asks, as a two-parameter ``authorize(request, action)`` sees it.

    *verb*: ``pause``, ``resume``, ``trigger``, ``retire`` (of a job),
    ``update-schedule``, ``remove-schedule`` (of a stored schedule), ``read-kwargs``
    (seeing a stored schedule's kwargs on the schedules page), or ``read`` (any page, for
    ``authorize_read``). *target*: the job's or the schedule's name (``""`` for ``read``).
    *fields*: what the action changes, each with its new value: for ``update-schedule``,
    ``schedule`` (a :class:`~cronlock.Schedule`) and ``kwargs`` (a dict) when the form
    changes them; empty for the other verbs.
    """

    verb: str
    target: str
    fields: Mapping[str, Any] = field(default_factory=dict)


Authorize = (
    Callable[[Request], bool | str | Awaitable[bool | str]]
    | Callable[[Request, Action], bool | str | Awaitable[bool | str]]
)
"""Decides whether a request may act (``authorize``) or read (``authorize_read``):
``True`` or a non-empty string (who asked: logged, and recorded as who made the change)
allows it. Given the request alone, or the request and the :class:`Action` when the
callable accepts a second positional argument."""

READ_REFUSED = "refused: you may not read this dashboard"


class ReadRefused(HTTPException):
    """A request ``authorize_read`` refused: its 403 page carries no CSRF cookie or token."""

    def __init__(self) -> None:
        super().__init__(403, READ_REFUSED)


def _takes_action(fn: Callable[..., Any]) -> bool:
    """Whether *fn* accepts a second positional argument (the :class:`Action`)."""
    try:
        inspect.signature(fn).bind(None, None)
    except (TypeError, ValueError):  # it does not; or no signature to read (a builtin)
        return False
    return True


class Gate:
    """An ``authorize`` or ``authorize_read`` callable, and how it is called (read once)."""

    def __init__(self, fn: Authorize) -> None:
        self._fn: Callable[..., Any] = fn
        self.per_action = _takes_action(fn)
        """It is given the :class:`Action`: its answer may differ from one to another."""

    async def verdict(self, request: Request, action: Action) -> str | None:
        """What the callable says of *request* asking *action*: ``None`` refused, else who
        asked (``""`` unnamed)."""
        answer = self._fn(request, action) if self.per_action else self._fn(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if answer is True:
            return ""
        if isinstance(answer, str) and answer:
            return answer
        return None

    async def verdicts(self, request: Request, actions: list[Action]) -> list[str | None]:
        """:meth:`verdict` of each of *actions*: a callable given the request alone is
        asked once for all of them."""
        if not actions:
            return []
        if not self.per_action:
            return [await self.verdict(request, actions[0])] * len(actions)
        return [await self.verdict(request, action) for action in actions]


def client(request: Request) -> str:
    """The request's peer as ``host:port`` (behind a proxy: the proxy, unless the server
    takes the client's address from its headers, as ``uvicorn --proxy-headers`` does)."""
    peer = request.client
    return "unknown" if peer is None else f"{peer.host}:{peer.port}"
