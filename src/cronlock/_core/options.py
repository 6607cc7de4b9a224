"""The options every job registration accepts (``Scheduler.add_job`` and the decorators)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

from .._durations import Seconds
from .._errors import ScheduleError
from .._locking.protocols import Locker
from .._records import Overlap

__all__ = ("OPTION_NAMES", "JobOptions", "check_option_names")


class JobOptions(TypedDict, total=False):
    """Options accepted by :meth:`Scheduler.add_job` and every decorator."""

    name: str | None
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    tags: str | Iterable[str] | None
    timeout: Seconds | None
    overlap: Overlap
    jitter: Seconds | None
    max_runs: int | None
    start_at: datetime | None
    stop_at: datetime | None
    misfire_grace: Seconds | None
    distributed: bool
    locker: Locker | None
    recover: bool
    alert_after: Seconds | None
    retries: int
    retry_delay: Seconds


OPTION_NAMES = frozenset(JobOptions.__annotations__)


def check_option_names(job: str, options: Iterable[str]) -> None:
    """Raise :class:`~cronlock.ScheduleError` naming *job* and any unknown option given."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise ScheduleError(
            f"job {job!r}: unknown option(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(sorted(OPTION_NAMES))}"
        )
