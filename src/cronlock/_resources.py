"""What a scheduler was given and closes when it stops (the ownership rule).

A :class:`~cronlock.Scheduler` closes the lockers and electors it was given — its own, and
the jobs' ``locker=`` options — when it shuts down, so that a user's ``pool.close()``
afterwards returns at once and nothing is left for the garbage collector to warn about.
One the user holds open with ``async with`` is left to that block.
"""

from __future__ import annotations

import typing
from types import TracebackType
from typing import Self

from ._errors import SchedulerStateError
from ._locking.protocols import Resource
from ._logs import get_logger

__all__ = ("HeldOpenByBlocks", "Resources")

_logger = get_logger("cronlock")


class HeldOpenByBlocks:
    """Mixin for a :class:`~cronlock.Resource`: ``async with`` holds it open, and the
    outermost block closes it. Subclasses set ``self._entered = 0`` and define
    ``close()``; ``_on_enter()`` runs first on each entry (start a task, say)."""

    _entered: int

    async def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    @property
    def held_open(self) -> bool:
        """True inside ``async with``; a Scheduler then leaves closing it to that block."""
        return self._entered > 0

    async def _on_enter(self) -> None:
        """Called on each entry, before the block runs."""

    async def __aenter__(self) -> Self:
        await self._on_enter()
        self._entered += 1
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._entered -= 1
        if not self._entered:
            await self.close()


class Resources:
    """The closeable things given to one scheduler, each once, in the order given."""

    __slots__ = ("_given", "_kinds")

    def __init__(self) -> None:
        self._given: dict[int, Resource] = {}
        # A runtime Protocol check costs ~40 us; add_job calls add() for every new wiring
        # (jobs alike share one), so the answer is kept per class.
        self._kinds: dict[type, bool] = {}

    def add(self, thing: object) -> None:
        """Take charge of *thing* if it is a :class:`~cronlock.Resource` (else ignore it)."""
        if thing is None or id(thing) in self._given:
            return
        kind = type(thing)
        closeable = self._kinds.get(kind)
        if closeable is None:
            closeable = self._kinds[kind] = isinstance(thing, Resource)
        if closeable:
            self._given[id(thing)] = typing.cast(Resource, thing)

    def check_open(self) -> None:
        """Refuse to start with a resource that was closed (by an earlier shutdown, say)."""
        for thing in self._given.values():
            if thing.closed:
                raise SchedulerStateError(
                    f"{thing!r} is closed: a Scheduler closes the lockers and electors it "
                    "was given when it shuts down; to use one across a restart or between "
                    "schedulers, hold it open with 'async with'"
                )

    async def close(self) -> None:
        """Close every resource not held open by an ``async with`` of the user's."""
        for thing in self._given.values():
            if thing.held_open or thing.closed:
                continue
            try:
                await thing.close()
            except Exception:  # its own errors are the resource's; shutdown goes on
                _logger.exception("closing %r at shutdown failed", thing)
