"""A replica's side of stored schedules: the tasks they may name, and the sync that turns
the store's changes into jobs.

At start the scheduler reads everything stored (one call), registers a job per schedule
whose task it has, and then reads the changes since the last revision it saw every
``sync_every`` seconds (one call, however many schedules). A schedule it cannot register
(no such task here, kwargs that do not fit the task, a name a code-defined job has) is
rejected on its own: a WARNING and a :class:`~cronlock.ScheduleRejected` once per
revision, a problem noted in the store, and the other schedules go on. So is a row the
store could not read or that breaks a limit (:mod:`.decode`, :mod:`.limits`: written by
hand), and one whose slots are closer than this replica's ``stored_min_interval``; a job
of an earlier revision of it is dropped.
"""

from __future__ import annotations

import asyncio
import difflib
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from .._cancel import cancel_and_wait, task_name
from .._clock import Clock
from .._errors import CronlockError, LockError
from .._events import EventBus, ScheduleRejected
from .._logs import get_logger
from .._pacing import Pacer
from .._schedules.schedule import Schedule
from .limits import DEFAULT_MIN_INTERVAL, check_rate, shown
from .schedule import ScheduleStore, StoredSchedule

__all__ = ("StoredSync",)

_logger = get_logger("cronlock")
_F = TypeVar("_F", bound=Callable[..., object])
_RATED = 4096  # schedules remembered as checked


class Registry(Protocol):
    """The scheduler's verbs the sync uses."""

    @property
    def _jobs(self) -> Mapping[str, Any]: ...

    def add_job(self, func: Callable[..., object], schedule: Schedule, **options: Any) -> Any: ...

    def update(self, name: str, schedule: Schedule) -> Any: ...

    def remove(self, job: str) -> None: ...


class StoredSync:
    """Keeps a scheduler's jobs of stored schedules in step with *store*."""

    def __init__(
        self,
        registry: Registry,
        tasks: Mapping[str, Callable[..., object]],
        store: ScheduleStore,
        clock: Clock,
        bus: EventBus,
        every: float,
        min_interval: float = DEFAULT_MIN_INTERVAL,
    ) -> None:
        self._registry = registry
        self._tasks = tasks
        self._store = store
        self._clock = clock
        self._bus = bus
        self._every = timedelta(seconds=every)
        self._min_interval = min_interval
        self._revision = 0
        self.applied: dict[str, StoredSchedule] = {}
        """The stored schedules registered here as jobs, by name."""
        self._rejected: dict[str, StoredSchedule] = {}  # wanting a task: tried again with it
        self._noted: dict[str, tuple[int, str]] = {}  # the problem said of each, and when
        self._task: asyncio.Task[None] | None = None
        self.syncs = 0
        self.added: list[tuple[Any, datetime | None]] | None = None
        """When a list (the scheduler's start sets one): the jobs registered, each with
        the first slot planned for it then (caught up once the start's read is applied)."""
        # The schedules that passed check_rate here: tenants' schedules are a few objects
        # (decoded once each), and a cron's shortest gap is sampled, not free.
        self._rated: set[Schedule] = set()

    async def sync(self) -> None:
        """Read the store's changes since the last sync and apply them, in slices (other
        tasks run in between: a sync of 100,000 changes never holds the loop for long)."""
        revision, changes = await self._store.stored_changes(self._revision)
        self.syncs += 1
        pacer = Pacer(items=len(changes))
        for name, _, stored in changes:
            await pacer.pause()
            self._rejected.pop(name, None)
            if stored is None:
                self._noted.pop(name, None)
                self._drop(name)
            else:
                await self._applied_safely(stored)
        for stored in list(self._rejected.values()):  # a task registered since, say
            await pacer.pause()
            if stored.task in self._tasks and stored.name in self._rejected:
                del self._rejected[stored.name]
                await self._applied_safely(stored)
        pacer.done()
        self._revision = max(self._revision, revision)

    async def _applied_safely(self, stored: StoredSchedule) -> None:
        """Apply one change; whatever goes wrong stays with that schedule (the sync goes on,
        and the next read starts after this revision)."""
        try:
            await self._apply(stored)
        except Exception as exc:
            _logger.exception("stored schedule %s: applying it failed", shown(stored.name))
            await self._reject(stored, f"applying it failed: {exc!r}")

    def _drop(self, name: str) -> None:
        if self.applied.pop(name, None) is not None and name in self._registry._jobs:
            self._registry.remove(name)  # (unless the application removed it itself)

    async def _apply(self, stored: StoredSchedule) -> None:
        if stored.unreadable is not None:  # no job of it: an earlier revision's goes too
            self._drop(stored.name)
            await self._reject(stored, stored.unreadable)
            return
        old = self.applied.get(stored.name)
        if old is not None and (old.task, old.kwargs, old.options) == (
            stored.task,
            stored.kwargs,
            stored.options,
        ):
            # Only the schedule changed: the job keeps its history, pause and run in flight.
            if old.schedule != stored.schedule:
                try:
                    self._check_rate(stored)
                    self._registry.update(stored.name, stored.schedule)
                except CronlockError as exc:
                    self._drop(stored.name)
                    await self._reject(stored, str(exc))
                    return
            self.applied[stored.name] = stored
            return
        self._drop(stored.name)
        task = self._tasks.get(stored.task)
        if task is None:
            close = difflib.get_close_matches(stored.task, list(self._tasks), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            await self._reject(stored, f"no task {stored.task!r} on this replica{hint}")
            self._rejected[stored.name] = stored  # tried again once the task is registered
            return
        if stored.name in self._registry._jobs:
            await self._reject(stored, f"a job defined in code is named {stored.name!r}")
            return
        try:
            self._check_rate(stored)  # (and that it can plan)
            job = self._registry.add_job(
                task, stored.schedule, name=stored.name, kwargs=stored.kwargs, **stored.options
            )
        except (CronlockError, TypeError, ValueError, ArithmeticError) as exc:
            await self._reject(stored, str(exc))
            return
        self.applied[stored.name] = stored
        if self.added is not None:
            self.added.append((job, job._next_run))

    def _check_rate(self, stored: StoredSchedule) -> None:
        """:func:`.limits.check_rate` at this replica's minimum interval, and that the
        schedule can plan a slot from now (raises as ``add_job`` would), once a schedule."""
        schedule = stored.schedule
        if schedule not in self._rated:
            check_rate(stored.name, schedule, self._min_interval)
            schedule.next_after(self._clock.now())  # a schedule that cannot plan
            if len(self._rated) >= _RATED:
                self._rated.clear()
            self._rated.add(schedule)

    async def _reject(self, stored: StoredSchedule, reason: str) -> None:
        if self._noted.get(stored.name) == (stored.revision, reason):
            return  # said once for this revision; the sync tries it again quietly
        self._noted[stored.name] = (stored.revision, reason)
        _logger.warning(
            "stored schedule %s (revision %d) is not run here: %s",
            shown(stored.name),
            stored.revision,
            reason,
        )
        self._bus.emit(ScheduleRejected(stored.name, stored.task, stored.revision, reason))
        try:
            await self._store.report_problem(stored.name, stored.revision, reason)
        except LockError as exc:
            _logger.debug("noting the problem of %r failed: %s", stored.name, exc)

    def start(self) -> None:
        """Start syncing every ``sync_every`` seconds."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=task_name("stored-schedules")
            )

    async def stop(self) -> None:
        """Stop syncing and wait until the task is done."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await self._clock.sleep_until(self._clock.now() + self._every)
            try:
                await self.sync()
            except LockError as exc:  # the locker logs outages itself; the next sync retries
                _logger.debug("reading stored schedules failed: %s", exc)
            except Exception:
                _logger.exception("syncing stored schedules failed unexpectedly")
