"""One rule for naming a job, everywhere: a :class:`~cronlock.Job` or its name is accepted,
and a name nobody knows is refused with the same message (with a did-you-mean for a close
name) by the scheduler, :class:`cronlock.postgres.FleetControl` and the command line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from ._core.job import Job
from ._errors import JobLookupError

__all__ = ("job_named", "unknown_job")


def unknown_job(name: str, known: Iterable[str]) -> str:
    """``unknown job: NAME``, with ``(did you mean OTHER?)`` when a known name is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown job: {name}{hint}"


def job_named(jobs: Mapping[str, Job], job: Job | str, *, field: str = "job") -> Job:
    """The registered job *job* names (a name, or the :class:`~cronlock.Job` itself).

    Raises :class:`~cronlock.JobLookupError` for a name not registered (the message of
    :func:`unknown_job`) and for a job registered with another scheduler, or removed;
    :class:`TypeError` for anything else.
    """
    if isinstance(job, Job):
        if jobs.get(job.name) is not job:
            raise JobLookupError(f"job {job.name!r} is not registered with this scheduler")
        return job
    if not isinstance(job, str):
        raise TypeError(f"{field} must be a Job or a job's name, got {job!r}")
    found = jobs.get(job)
    if found is None:
        raise JobLookupError(unknown_job(job, jobs))
    return found
