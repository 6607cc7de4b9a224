"""What the dashboard shows of a job and of a run, as the pages and the JSON API see it.

Built from :mod:`cronlock.postgres._ops.fleet` reads. Everything here is plain data: the
templates escape it, the API serialises it. Nothing carries a DSN, a job's arguments or a
traceback: a run's error is the one-line summary the ledger keeps, cut again here to one
line in case another writer stored more.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._records import RunRecord
from ..postgres._ops.fleet import FleetJob, Status, job_status
from ._words import describe

__all__ = (
    "Chart",
    "ChartPoint",
    "JobView",
    "RunView",
    "Status",
    "chart",
    "error_line",
    "job_view",
    "run_json",
    "run_view",
    "when",
)

_ERROR_LIMIT = 300


def when(value: datetime | None) -> str | None:
    """An instant as ISO 8601 UTC for the API, ``None`` kept."""
    return None if value is None else value.isoformat()


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def error_line(text: str | None) -> str | None:
    """The first line of a run's error, at most a few hundred characters."""
    if not text:
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:_ERROR_LIMIT] or None


def _cut(text: str | None) -> bool:
    """Whether :func:`error_line` shows less than the whole first line of *text* (what
    the reads fetch of an error is longer than what is shown, so this tells it too)."""
    if not text or not text.strip():
        return False
    return len(text.strip().splitlines()[0]) > _ERROR_LIMIT


@dataclass(frozen=True, slots=True)
class RunView:
    """One run as shown: slot, outcome, how long and how late, where, and why it failed."""

    slot: datetime | None
    """``None`` when the ledger's value is not a readable instant (shown "invalid")."""
    outcome: str
    started_at: datetime | None
    """``None`` when the ledger's value is not a readable instant (shown "invalid")."""
    finished_at: datetime | None
    duration: float | None
    lateness: float
    replica: str | None
    attempt: int
    error: str | None
    manual: bool = False
    """Asked for by a fleet-wide trigger (shown "manual")."""
    error_truncated: bool = False
    """The error's first line is longer than :attr:`error` (shown "truncated")."""
    attempts: tuple[RunView, ...] = ()
    """The slot's earlier attempts, oldest first (a retried slot's failed tries, a crashed
    run before its rerun): shown under the run, one row each."""


def run_view(record: RunRecord) -> RunView:
    """A ledger record as shown (lateness: how long after its slot the run started).

    Its instants may be ``None`` (the dashboard's reads make unreadable ones so,
    :mod:`._reads`): what follows from them is then unknown, shown "-", never an error.
    """
    slot: datetime | None = record.slot
    started: datetime | None = record.started_at
    late = _seconds(slot, started)
    return RunView(
        slot=slot,
        outcome=record.outcome,
        started_at=started,
        finished_at=record.finished_at,
        duration=_seconds(started, record.finished_at),
        lateness=0.0 if late is None else max(0.0, late),
        replica=record.owner,
        attempt=record.attempt,
        error=error_line(record.error),
        manual=record.manual,
        error_truncated=_cut(record.error),
        attempts=tuple(run_view(earlier) for earlier in record.attempts),
    )


def run_json(run: RunView) -> dict[str, Any]:
    """A run for the JSON API."""
    return {
        "slot": when(run.slot),
        "outcome": run.outcome,
        "started_at": when(run.started_at),
        "finished_at": when(run.finished_at),
        "duration_seconds": run.duration,
        "lateness_seconds": round(run.lateness, 3),
        "replica": run.replica,
        "attempt": run.attempt,
        "error": run.error,
        "manual": run.manual,
        "error_truncated": run.error_truncated,
        "attempts": [run_json(earlier) for earlier in run.attempts],
    }


@dataclass(frozen=True, slots=True)
class JobView:
    """One job of the fleet as the list and the job page show it."""

    name: str
    status: Status
    schedule: str
    """The schedule in words (or as noted, when it has no simpler wording)."""
    zone: str
    upcoming: tuple[datetime, ...]
    last_run: RunView | None
    last_success: RunView | None
    last_failure: RunView | None
    overdue_since: datetime | None
    """The late slot, when the job is overdue."""
    paused: bool
    holders: tuple[str, ...]
    """Who holds its lock now, one line each (backend pid, application name, address)."""
    tags: tuple[str, ...] = ()
    """Its tags, as its replicas noted them."""

    def json(self) -> dict[str, Any]:
        """The job for the JSON API."""

        def run(value: RunView | None) -> dict[str, Any] | None:
            return None if value is None else run_json(value)

        return {
            "name": self.name,
            "tags": list(self.tags),
            "status": self.status,
            "schedule": self.schedule,
            "zone": self.zone,
            "next_slots": [when(slot) for slot in self.upcoming],
            "last_run": run(self.last_run),
            "last_success": run(self.last_success),
            "last_failure": run(self.last_failure),
            "overdue_since": when(self.overdue_since),
            "paused": self.paused,
            "lock_holders": list(self.holders),
        }


def job_view(job: FleetJob, now: datetime, *, paused: bool, upcoming: int = 3) -> JobView:
    """How *job* looks at *now* (the database server's time, which overdue is judged by),
    with its next *upcoming* slots."""
    described = describe(job.schedule, job.next_run, upcoming, now=now)  # never raises
    late = job.overdue_since(now)
    status = job_status(job, now, paused=paused)

    def view(record: RunRecord | None) -> RunView | None:
        return None if record is None else run_view(record)

    return JobView(
        name=job.name,
        status=status,
        schedule=described.words,
        zone=described.zone,
        upcoming=described.upcoming,
        last_run=view(job.last_run),
        last_success=view(job.last_success),
        last_failure=view(job.last_failure),
        overdue_since=late,
        paused=paused,
        holders=tuple(h.describe() for h in job.holders),
        tags=job.tags,
    )


@dataclass(frozen=True, slots=True)
class ChartPoint:
    """One run on the chart: x, the bar's height (duration) and the dot's (lateness)."""

    x: float
    duration_y: float
    lateness_y: float
    label: str
    failed: bool


@dataclass(frozen=True, slots=True)
class Chart:
    """A small chart of durations (bars) and start lateness (dots), oldest run left."""

    width: int
    height: int
    bar: float
    points: tuple[ChartPoint, ...]
    max_duration: float
    max_lateness: float


def _slot_label(slot: datetime | None) -> str:
    return "invalid slot" if slot is None else f"{slot:%Y-%m-%d %H:%M:%S} UTC"


def chart(runs: list[RunView], width: int = 600, height: int = 120) -> Chart:
    """The chart of *runs* (newest first, as the ledger pages them), each axis scaled to
    its own maximum."""
    finished = list(reversed(runs))
    top_d = max((r.duration or 0.0 for r in finished), default=0.0) or 1.0
    top_l = max((r.lateness for r in finished), default=0.0) or 1.0
    step = width / max(len(finished), 1)
    points = tuple(
        ChartPoint(
            x=round(i * step, 2),
            duration_y=round(height * (r.duration or 0.0) / top_d, 2),
            lateness_y=round(height * r.lateness / top_l, 2),
            label=f"{_slot_label(r.slot)}: {r.outcome}, "
            f"took {r.duration if r.duration is not None else '-'} s, "
            f"started {r.lateness:.3f} s late",
            failed=r.outcome != "succeeded",
        )
        for i, r in enumerate(finished)
    )
    return Chart(width, height, round(max(step - 2, 1.0), 2), points, top_d, top_l)
