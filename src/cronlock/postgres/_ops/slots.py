"""``python -m cronlock history JOB --slots``: every slot of a job in a window and its fate,
from the ledger alone (DESIGN.md §3a).

The job's slots are rebuilt from the ``spec`` its replicas note (its schedule, jitter,
``misfire_grace``, ``start_at``, ``stop_at``: ``_core/slots/fate.job_spec``), from the instant
it was first noted on. Each slot's fate is read in this order: a run in the runs table (it
``ran``, or ``ran_late`` when it began later than its fire time allows: a slot owed across
an outage, a busy job, a fleet down); else the record a replica made of it (``coalesced``,
``missed``, ``skipped``, with the reason); else ``missed``, no replica having claimed it or
said why. A slot still within its grace with neither is left out: it may yet run.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..._errors import CronlockError, ScheduleError
from ..._fates import LATE_AFTER, Fate, started_late
from ..._records import DEFAULT_MISFIRE_GRACE, PAUSED_BEFORE_START
from ..._schedules.schedule import Schedule
from ..._stored.json import schedule_from_json
from .._sql.slots import job_spec_sql, slot_records_sql, slot_runs_sql
from .._sql.tables import LedgerTable

__all__ = ("MAX_SLOTS", "SlotEntry", "SlotsUnknown", "next_slot_of", "read_slots")

MAX_SLOTS = 100_000
"""Slots one answer lists at most (a window with more is refused: narrow it)."""

_OPEN_MARGIN = 10.0
"""Seconds past its grace (and jitter) a slot with no run and no record is still taken to
be on its way (a claim in flight, a replica's record not written yet)."""


@dataclass(frozen=True, slots=True)
class SlotEntry:
    """One slot of a job and its fate."""

    slot: datetime
    fate: Fate
    reason: str
    into: datetime | None = None
    outcome: str | None = None
    """The run's outcome (``succeeded``, ``failed``, ..., ``unfinished``) when it ran."""
    started_at: datetime | None = None
    by: str | None = None
    """Who ran it (``host:pid``) or recorded its fate (a replica's holder name)."""

    def as_json(self) -> dict[str, Any]:
        """The entry as ``--json`` prints it."""
        return {
            "slot": _iso(self.slot),
            "fate": self.fate,
            "reason": self.reason,
            "into": None if self.into is None else _iso(self.into),
            "outcome": self.outcome,
            "started_at": None if self.started_at is None else _iso(self.started_at),
            "by": self.by,
        }


@dataclass(frozen=True, slots=True)
class _Spec:
    schedule: Schedule
    jitter: float | None
    grace: float | None
    start_at: datetime | None
    stop_at: datetime | None


class SlotsUnknown(CronlockError):
    """The ledger cannot rebuild the job's slots (no spec noted)."""


async def read_slots(
    conn: Any,
    table: LedgerTable,
    job: str,
    since: datetime | timedelta | None,
    until: datetime | timedelta | None,
) -> tuple[list[SlotEntry], int] | None:
    """The slots of *job* from *since* to *until* (both included; an instant, or a span
    before the server's now; defaults: the last day, up to the server's now), oldest
    first, and how many were left out as still open; ``None`` when the ledger never noted
    *job*."""
    row = await conn.fetchrow(job_spec_sql(table), job)
    if row is None:
        return None
    now: datetime = row["now"]
    if isinstance(until, timedelta):
        until = now - until
    if isinstance(since, timedelta):
        since = now - since
    until = now if until is None or until > now else until
    since = until - timedelta(days=1) if since is None else since
    if since > until:
        raise CronlockError(f"--since {_iso(since)} is after --until {_iso(until)}")
    spec = _spec(job, row["spec"], row["schedule"])
    runs = {
        r["slot"]: r
        for r in await conn.fetch(slot_runs_sql(table), job, since, until)
        if not r["manual"]
    }
    records = list(await conn.fetch(slot_records_sql(table), job, since, until))
    # From when the job was noted (its first runs may come before its first note) on.
    known = [t for t in (row["first_seen"], *runs, *(r["slot"] for r in records)) if t]
    slots = set(runs)
    slots.update(_slots(spec, max(since, min(known)) if known else since, until))
    entries: list[SlotEntry] = []
    still_open = 0
    for slot in sorted(slots):
        run = runs.get(slot)
        record = next((r for r in records if r["slot"] <= slot <= r["last_slot"]), None)
        if run is not None:
            entries.append(_ran(slot, run, record, spec.jitter))
        elif record is not None:
            fate, reason, into = record["fate"], record["reason"], record["into_slot"]
            entries.append(SlotEntry(slot, fate, reason, into, by=record["holder"]))
        elif _open(slot, spec, now):
            still_open += 1
        else:
            entries.append(SlotEntry(slot, "missed", "no replica claimed it, nor said why"))
    return entries, still_open


@functools.lru_cache(maxsize=256)
def next_slot_of(spec: str | None) -> Callable[[datetime], datetime | None] | None:
    """The slot after an instant, for jobs whose slots *spec* (the jobs table's ``spec``)
    describes; ``None`` when it does not (no spec, or one this cronlock cannot read).
    Made once per spec: a fleet's jobs share a few."""
    if spec is None:
        return None
    try:
        rebuilt = _spec("", spec, "")
    except CronlockError:
        return None

    def following(after: datetime) -> datetime | None:
        start_at, stop_at = rebuilt.start_at, rebuilt.stop_at
        if start_at is not None and after < start_at:
            after = start_at - timedelta(microseconds=1)
        try:
            slot = rebuilt.schedule.next_after(after)
        except Exception:  # a schedule that fails says nothing
            return None
        return None if slot is None or (stop_at is not None and slot > stop_at) else slot

    return following


def _spec(job: str, text: str | None, schedule: str) -> _Spec:
    if text is None:
        raise SlotsUnknown(
            f"the ledger cannot rebuild the slots of {job!r} ({schedule}): no replica of "
            "this cronlock has noted how (a custom schedule, once() at start, or replicas "
            "of an older cronlock); 'history' without --slots lists its runs"
        )
    try:
        data = json.loads(text)
        return _Spec(
            schedule_from_json(data["schedule"]),
            _seconds(data.get("jitter")),
            _seconds(data.get("misfire_grace")),
            _instant(data.get("start_at")),
            _instant(data.get("stop_at")),
        )
    except (KeyError, TypeError, ValueError, ScheduleError) as exc:
        raise SlotsUnknown(
            f"the ledger's note of how to rebuild the slots of {job!r} cannot be read "
            f"({exc}): {text[:200]!r}"
        ) from None


def _slots(spec: _Spec, since: datetime, until: datetime) -> list[datetime]:
    found: list[datetime] = []
    start_at, stop_at = spec.start_at, spec.stop_at
    after = since - timedelta(microseconds=1)
    if start_at is not None and after < start_at:
        after = start_at - timedelta(microseconds=1)
    while True:
        slot = spec.schedule.next_after(after)
        if slot is None or slot > until or (stop_at is not None and slot > stop_at):
            return found
        if len(found) >= MAX_SLOTS:
            raise CronlockError(
                f"more than {MAX_SLOTS:,} slots from {_iso(since)} to {_iso(until)}: "
                "narrow the window with --since and --until"
            )
        found.append(slot)
        after = slot


def _ran(slot: datetime, run: Any, record: Any, jitter: float | None) -> SlotEntry:
    outcome = run["outcome"] or "unfinished"
    by = f"{run['host']}:{run['pid']}"
    started: datetime = run["started_at"]
    if outcome == "cancelled" and run["error"] == PAUSED_BEFORE_START:
        reason = "paused before its slot began"
        return SlotEntry(slot, "skipped", reason, None, outcome, started, by)
    if not started_late(slot, started, jitter):
        return SlotEntry(slot, "ran", "", None, outcome, started, by)
    late = (started - slot).total_seconds()
    reason = f"began {late:.1f}s after its slot"
    if record is not None and record["fate"] != "skipped":
        reason = f"{record['reason']}; {reason}"
    return SlotEntry(slot, "ran_late", reason, None, outcome, started, by)


def _open(slot: datetime, spec: _Spec, now: datetime) -> bool:
    """Whether *slot*, with neither run nor record, may still run (or be recorded)."""
    grace = DEFAULT_MISFIRE_GRACE if spec.grace is None else spec.grace
    allowed = grace + (spec.jitter or 0.0) + LATE_AFTER + _OPEN_MARGIN
    return (now - slot).total_seconds() <= allowed


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number of seconds: {value!r}")
    return float(value)


def _instant(value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"not an instant: {value!r}")
    return datetime.fromisoformat(value).astimezone(UTC)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()
