"""Jobs: a task bound to a schedule and options, plus its run history on this replica."""

from __future__ import annotations

import functools
import hashlib
import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ._durations import optional_seconds
from ._errors import ScheduleError
from ._locking import Locker
from ._records import DEFAULT_MISFIRE_GRACE, OVERLAPS, Overlap, RunContext, RunRecord
from ._schedule import Schedule
from ._tz import to_utc

if TYPE_CHECKING:
    from ._events import JobEvent
    from ._scheduler import Scheduler

__all__ = ("Job",)


def jitter_offset(name: str, slot: datetime, jitter: float) -> timedelta:
    """A delay in ``[0, jitter)`` that every replica derives the same way from (name, slot)."""
    digest = hashlib.blake2b(f"{name}\x00{slot.isoformat()}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64
    return timedelta(microseconds=int(fraction * jitter * 1_000_000))


def _context_parameter(func: Callable[..., object]) -> str | None:
    """The name of the parameter annotated ``RunContext``, if any."""
    annotations = getattr(func, "__annotations__", None)
    if isinstance(annotations, dict) and not any(
        a is RunContext or (isinstance(a, str) and "RunContext" in a) for a in annotations.values()
    ):
        # Resolving string annotations (get_type_hints) costs ~100 us a call: skip it
        # when no annotation could be RunContext, which is nearly every job.
        return None
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        hints = {}
        for name, param in inspect.signature(func).parameters.items():
            hints[name] = param.annotation
    for name, hint in hints.items():
        if name != "return" and (hint is RunContext or hint == "RunContext"):
            return name
    return None


@dataclass(eq=False, slots=True)
class Job:
    """A task registered with a :class:`~cronlock.Scheduler`.

    Read its state (``next_run``, ``last_run``, ``last_success``, ``running``,
    ``run_count``) and control it (``pause()``, ``resume()``, ``run_now()``). Created by
    ``Scheduler.add_job`` and the decorators, never directly.
    """

    name: str
    func: Callable[..., object]
    schedule: Schedule
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    timeout: float | None = None
    overlap: Overlap = "skip"
    jitter: float | None = None
    max_runs: int | None = None
    start_at: datetime | None = None
    stop_at: datetime | None = None
    misfire_grace: float | None = DEFAULT_MISFIRE_GRACE
    distributed: bool = True
    locker: Locker | None = None

    # State on this replica.
    next_run: datetime | None = field(default=None, init=False)
    """The next slot this replica will fire (aware UTC), or None when paused or exhausted."""
    # The hot path stores a plain tuple; RunRecord is built when someone reads it.
    _last_run: RunRecord | tuple[Any, ...] | None = field(default=None, init=False, repr=False)
    _last_success: RunRecord | tuple[Any, ...] | None = field(default=None, init=False, repr=False)
    run_count: int = field(default=0, init=False)
    """How many runs started on this replica."""
    paused: bool = field(default=False, init=False)
    """True between ``pause()`` and ``resume()``."""
    active: int = field(default=0, init=False, repr=False)
    _scheduler: Scheduler | None = field(default=None, init=False, repr=False)
    _context_param: str | None = field(default=None, init=False, repr=False)
    _is_async: bool = field(default=True, init=False, repr=False)
    generation: int = field(default=0, init=False, repr=False)
    history_checked: datetime | None = field(default=None, init=False, repr=False)
    # For anchor + k*interval schedules the slot after a slot is one addition away.
    _grid_step: timedelta | None = field(default=None, init=False, repr=False)
    task_name: str = field(default="", init=False, repr=False)
    schedule_text: str = field(default="", init=False, repr=False)
    # The locker's note_schedule(job, schedule, next_run), when it has one (status views).
    note: Callable[[str, str, datetime | None], None] | None = field(
        default=None, init=False, repr=False
    )

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name:
            raise ScheduleError(f"job name must be a non-empty string, got {name!r}")
        if not callable(self.func):
            raise ScheduleError(f"job {name!r}: task {self.func!r} is not callable")
        # hasattr, not isinstance(Schedule): a runtime Protocol check costs ~20 us a job.
        if not callable(getattr(self.schedule, "next_after", None)):
            raise ScheduleError(
                f"job {name!r}: schedule {self.schedule!r} has no next_after(); build one "
                "with cronlock.cron(), every(), daily(), weekly(), monthly() or once()"
            )
        if self.overlap not in OVERLAPS:
            raise ScheduleError(
                f"job {name!r}: overlap must be one of {', '.join(OVERLAPS)}, got {self.overlap!r}"
            )
        self.timeout = optional_seconds(self.timeout, field="timeout", job=name)
        self.jitter = optional_seconds(self.jitter, field="jitter", job=name, allow_zero=True)
        self.misfire_grace = optional_seconds(
            self.misfire_grace, field="misfire_grace", job=name, allow_zero=True
        )
        if self.max_runs is not None and (
            isinstance(self.max_runs, bool)
            or not isinstance(self.max_runs, int)
            or self.max_runs < 1
        ):
            raise ScheduleError(
                f"job {name!r}: max_runs must be a positive int, got {self.max_runs!r}"
            )
        if self.start_at is not None:
            self.start_at = to_utc(self.start_at, field=f"job {name!r}: start_at")
        if self.stop_at is not None:
            self.stop_at = to_utc(self.stop_at, field=f"job {name!r}: stop_at")
        if self.start_at and self.stop_at and self.stop_at < self.start_at:
            raise ScheduleError(
                f"job {name!r}: stop_at {self.stop_at.isoformat()} is before "
                f"start_at {self.start_at.isoformat()}"
            )
        if isinstance(self.tags, str):
            self.tags = frozenset((self.tags,))
        else:
            self.tags = frozenset(self.tags)
        target = self.func
        while isinstance(target, functools.partial):
            target = target.func
        self._is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
            getattr(target, "__call__", None)  # noqa: B004 - async callable objects
        )
        self._context_param = _context_parameter(self.func)
        self.task_name = f"cronlock-run:{name}"
        self.set_schedule(self.schedule)

    # -- history -------------------------------------------------------------------

    @property
    def last_run(self) -> RunRecord | None:
        """The most recent finished run (fleet-wide when the locker keeps a ledger)."""
        raw = self._last_run
        if isinstance(raw, tuple):
            record = RunRecord(*raw)
            if self._last_success is raw:
                self._last_success = record
            self._last_run = raw = record
        return raw

    @last_run.setter
    def last_run(self, record: RunRecord | None) -> None:
        self._last_run = record

    @property
    def last_success(self) -> RunRecord | None:
        """The most recent successful run (fleet-wide when the locker keeps a ledger)."""
        raw = self._last_success
        if isinstance(raw, tuple):
            self._last_success = raw = RunRecord(*raw)
        return raw

    @last_success.setter
    def last_success(self, record: RunRecord | None) -> None:
        self._last_success = record

    # -- schedule maths ------------------------------------------------------------

    def set_schedule(self, schedule: Schedule) -> None:
        """Replace the schedule (history stays) and refresh what is derived from it."""
        from ._interval import IntervalSchedule

        self.schedule = schedule
        self.schedule_text = str(schedule)
        self._grid_step = schedule.interval if type(schedule) is IntervalSchedule else None

    def following(self, slot: datetime) -> datetime | None:
        """The slot after *slot*, itself a slot of this job (the run loop's hot path)."""
        step = self._grid_step
        if step is None:
            return self.slot_after(slot)
        nxt = slot + step
        if self.stop_at is not None and nxt > self.stop_at:
            return None
        return nxt

    def slot_after(self, after: datetime) -> datetime | None:
        """The job's first slot strictly after *after*, honouring start_at and stop_at."""
        if self.start_at is not None and after < self.start_at:
            after = self.start_at - timedelta(microseconds=1)
        slot = self.schedule.next_after(after)
        if slot is None or (self.stop_at is not None and slot > self.stop_at):
            return None
        return slot

    def fire_time(self, slot: datetime) -> datetime:
        """When *slot* fires: the slot itself, delayed by the deterministic jitter."""
        if self.jitter:
            return slot + jitter_offset(self.name, slot, self.jitter)
        return slot

    def next_runs(self, n: int, *, after: datetime | None = None) -> list[datetime]:
        """The next *n* slots after *after* (default: the next run, inclusive)."""
        out: list[datetime] = []
        if after is None:
            if self.next_run is None:
                if self._scheduler is None or self.paused:
                    return out
                after = self._scheduler.clock.now()
            else:
                out.append(self.next_run)
                after = self.next_run
        current: datetime | None = after
        while len(out) < n and current is not None:
            current = self.slot_after(current)
            if current is not None:
                out.append(current)
        return out[:n]

    # -- state and control -----------------------------------------------------------

    @property
    def running(self) -> bool:
        """True while at least one run of this job is in flight on this replica."""
        return self.active > 0

    @property
    def coordinated(self) -> bool:
        """True when runs go through the elector and locker (if the scheduler has them)."""
        return self.distributed

    def pause(self) -> None:
        """Stop firing this job until :meth:`resume`; a run in flight goes on."""
        self._require_scheduler().pause_job(self)

    def resume(self) -> None:
        """Fire again from the next slot after now; slots missed while paused are not run."""
        self._require_scheduler().resume_job(self)

    async def run_now(self) -> JobEvent:
        """Run the job once now, without shifting its schedule; return the final event.

        The run goes through the same overlap, lock and timeout handling as a scheduled
        one; its slot is the instant of the request.
        """
        return await self._require_scheduler().run_job_now(self)

    def _require_scheduler(self) -> Scheduler:
        if self._scheduler is None:
            from ._errors import SchedulerStateError

            raise SchedulerStateError(f"job {self.name!r} is not registered with a scheduler")
        return self._scheduler

    # -- invoking the task ---------------------------------------------------------

    def call(self, slot: datetime, started: datetime) -> Awaitable[object]:
        """Start the task for one run; plain functions go to a worker thread."""
        kwargs = dict(self.kwargs) if self.kwargs else {}
        if self._context_param is not None:
            kwargs[self._context_param] = RunContext(self.name, slot, started, self.run_count)
        if self._is_async:
            return typing.cast(Awaitable[object], self.func(*self.args, **kwargs))
        return _in_thread(functools.partial(self.func, *self.args, **kwargs))


_threads = 0


def threads_in_flight() -> int:
    """How many plain-function runs are executing in worker threads right now."""
    return _threads


async def _in_thread(call: Callable[[], object]) -> object:
    import anyio.to_thread

    global _threads
    _threads += 1
    try:
        # A thread cannot be cancelled: on timeout or shutdown the run is abandoned and
        # the thread finishes in the background.
        return await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
    finally:
        _threads -= 1


def default_name(func: Callable[..., object]) -> str:
    """``module.qualname`` of a function (what ``name=None`` means)."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    module = getattr(target, "__module__", None) or "<unknown>"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def normalise_tags(tags: str | Iterable[str] | None) -> frozenset[str]:
    """Accept one tag or an iterable of them."""
    if tags is None:
        return frozenset()
    if isinstance(tags, str):
        return frozenset((tags,))
    return frozenset(tags)
