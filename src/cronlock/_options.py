"""The options every job registration accepts (``Scheduler.add_job`` and the decorators)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict

from ._durations import Seconds
from ._locking import Locker
from ._records import Overlap

__all__ = ("OPTION_NAMES", "JobOptions")


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


OPTION_NAMES = frozenset(JobOptions.__annotations__)
