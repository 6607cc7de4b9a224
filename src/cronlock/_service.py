"""One shape for a background task owned by one object: started once, stopped once.

A service starts its task with :meth:`Service.start` (again: nothing happens) when
:meth:`Service._wanted` says it has work, and :meth:`Service.stop` cancels it and waits
until it is done (a task is never left behind). The PostgreSQL backend's loops (upkeep,
membership, the fleet watch, lease renewal) are services; their owner stops them in the
reverse of the order they started.
"""

from __future__ import annotations

import abc
import asyncio

from ._cancel import cancel_and_wait, task_name

__all__ = ("Service",)


class Service(abc.ABC):
    """A background task of its owner's, named ``cronlock-<kind>`` (:attr:`kind`)."""

    kind: str
    """What the task is called (:func:`cronlock._cancel.task_name`)."""
    _task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """Whether the task was started and not stopped."""
        return self._task is not None

    def start(self) -> None:
        """Start the task, unless it runs already or there is nothing to do."""
        if self._task is None and self._wanted():
            loop = asyncio.get_running_loop()
            self._starting(loop.time())
            self._task = loop.create_task(self._serve(), name=task_name(self.kind))

    async def stop(self) -> None:
        """Cancel the task and wait until it is done."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    def _wanted(self) -> bool:
        """Whether there is work for the task yet."""
        return True

    def _starting(self, now: float) -> None:  # noqa: B027 (a hook most services leave empty)
        """The task starts at loop time *now*."""

    @abc.abstractmethod
    async def _serve(self) -> None:
        """The task: runs until cancelled."""
