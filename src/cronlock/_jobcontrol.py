"""The scheduler's verbs on one job (a mixin of :class:`~cronlock.Scheduler`): look up,
remove, reschedule, pause, resume, run now. Each takes a :class:`~cronlock.Job` or its
name, through one resolver (:func:`._names.job_named`)."""

from __future__ import annotations

import asyncio
from zoneinfo import ZoneInfo

from ._clock import Clock
from ._core.job import Job
from ._core.runloop import RunLoop
from ._errors import SchedulerStateError
from ._events import JobEvent
from ._keys import job_lock_key
from ._names import job_named
from ._schedules.schedule import Schedule, bind_zone, check_interval, check_jitter

__all__ = ("JobControl",)


class JobControl:
    """The scheduler's verbs on one job, each given a :class:`~cronlock.Job` or its name.

    A name no job of this scheduler has is refused with :class:`~cronlock.JobLookupError`
    (``unknown job: NAME (did you mean OTHER?)``), as is a job of another scheduler.
    """

    _jobs: dict[str, Job]
    _keys: dict[int, str]
    _loop: RunLoop | None
    _clock: Clock
    _tz: ZoneInfo

    def get_job(self, name: str | Job) -> Job:
        """The job called *name*; raises :class:`~cronlock.JobLookupError` if none."""
        return job_named(self._jobs, name, field="name")

    def remove(self, job: str | Job) -> None:
        """Unregister a job; a run of it in flight goes on to its end."""
        found = job_named(self._jobs, job)
        if self._loop is not None:
            self._loop.unschedule(found)
        found._forget_plan()
        del self._jobs[found.name]
        if found._wiring.locker is not None and found._wiring.fnv_keys:  # it has a key here
            del self._keys[job_lock_key(found.name)]
        found._scheduler = None

    def remove_by_tags(self, *tags: str) -> list[Job]:
        """Unregister every job carrying any of *tags*; return them."""
        wanted = set(tags)
        removed = [job for job in self._jobs.values() if job.tags & wanted]
        for job in removed:
            self.remove(job)
        return removed

    def update(self, name: str | Job, schedule: Schedule) -> Job:
        """Give job *name* a new schedule, keeping its history and options."""
        job = job_named(self._jobs, name, field="name")
        check_interval(job.name, schedule)
        job.set_schedule(check_jitter(job.name, bind_zone(schedule, self._tz), job.jitter))
        if self._loop is not None and not job.paused:
            self._loop.schedule(job, self._clock.now())
        return job

    def pause_job(self, job: str | Job) -> None:
        """Stop firing *job* (same as ``job.pause()``)."""
        found = job_named(self._jobs, job)
        found._halt()
        if self._loop is not None:
            self._loop.unschedule(found)

    def resume_job(self, job: str | Job) -> None:
        """Fire *job* again from its next slot after now (same as ``job.resume()``)."""
        found = job_named(self._jobs, job)
        if not found.paused:
            return
        found._unhalt()
        if self._loop is not None:
            self._loop.schedule(found, self._clock.now())

    async def run_job_now(self, job: str | Job) -> JobEvent:
        """Run *job* once now, here (same as ``await job.run_now()``); return its final
        event. Not marked manual in a ledger: a fleet-wide trigger
        (:meth:`cronlock.postgres.FleetControl.trigger`) is."""
        found = job_named(self._jobs, job)
        if self._loop is None:
            raise SchedulerStateError(f"job {found.name!r}: run_now() needs a started scheduler")
        waiter: asyncio.Future[JobEvent] = asyncio.get_running_loop().create_future()
        self._loop.dispatch(found, self._clock.now(), waiter)
        return await waiter
