"""A run in the ledger: its columns, their timestamp guards and decoding, and its start.

Reading the shared ledger defensively: a row no replica can use is skipped and reported.

Every replica reads rows that others wrote: other versions of cronlock, an operator's
``UPDATE``, a restore, a tool. PostgreSQL's ``timestamptz`` spans 4713 BC to 294276 AD and
has ``infinity``; Python's ``datetime`` spans the years 1 to 9999 and has none. asyncpg
raises ``OverflowError`` for a timestamp outside it, which fails the whole statement (every
job of a claim batch, every job of the catch-up read, the fleet watch), and decodes
``infinity`` as a *naive* ``datetime.max``, which no aware datetime can be compared with.

So every timestamp a replica reads is guarded where it is selected, in the SQL
(:func:`sane`: NULL unless within :data:`LOW` .. :data:`HIGH`), and a run's select list
(:data:`RUN`) carries one more column, ``odd``, that names what was out of range and its
raw text. :func:`decode_run` skips such a row and logs a WARNING naming the table, the job,
the column and the value, once per (table, job); :func:`skipped` counts them. A read that
picks a job's *latest* row leaves out rows whose slot is out of range (:func:`slot_in_range`),
so that one odd row cannot hide the job's real latest run.

When a run began, as the ledger records it: a claim is often made ahead of its slot (the
claim-ahead window), so the instant of the claim is not the run's start. The claim writes
the later of its own time and the slot (:data:`CLAIMED_START`: the body never begins before
its slot), and the run's outcome replaces that with the instant its body really began, as
the replica's clock read it (:func:`real_start`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..._logs import get_logger
from ..._records import RunRecord

__all__ = (
    "CLAIMED_START",
    "HIGH",
    "LOW",
    "RUN",
    "RUN_COLUMNS",
    "R_RUN",
    "decode_run",
    "odd_list",
    "real_start",
    "report_odd",
    "run_list",
    "sane",
    "skipped",
    "slot_in_range",
    "to_record",
)

_logger = get_logger("cronlock.postgres")

LOW = "'0001-01-02 00:00:00+00'::timestamptz"
"""The earliest timestamp a replica reads (a day of margin: any time zone's offset)."""
HIGH = "'9999-12-30 00:00:00+00'::timestamptz"
"""The latest timestamp a replica reads (arithmetic on it must not overflow either)."""

_OUTCOMES = frozenset({"succeeded", "failed", "timed_out", "cancelled", "lock_lost", "crashed"})
_TIMES = ("slot", "started_at", "finished_at")
_OTHERS = ("outcome", "error", "host", "pid", "attempt", "manual")


def sane(column: str, name: str) -> str:
    """*column*'s value as *name* when Python can hold it, else NULL."""
    return f"CASE WHEN {column} BETWEEN {LOW} AND {HIGH} THEN {column} END AS {name}"


def slot_in_range(column: str) -> str:
    """The condition that *column* (a slot, a key) is one Python can hold."""
    return f"{column} BETWEEN {LOW} AND {HIGH}"


def odd_list(columns: Iterable[tuple[str, str]]) -> str:
    """The text naming each of *columns* (``(expression, label)``) out of range, with its
    raw value; NULL when none is."""
    parts = ", ".join(
        f"CASE WHEN NOT {column} BETWEEN {LOW} AND {HIGH} THEN '{label}=' || {column}::text END"
        for column, label in columns
    )
    return f"nullif(concat_ws(', ', {parts}), '')"


def run_list(prefix: str = "") -> str:
    """The select list of a run, its columns read as *prefix* + name: :data:`RUN_COLUMNS`,
    each timestamp guarded. Order a read by the table's column (``r.slot``), never by the
    bare name, which means the guarded output column."""
    times = [sane(f"{prefix}{column}", column) for column in _TIMES]
    others = [f"{prefix}{column}" for column in _OTHERS]
    odd = odd_list((f"{prefix}{column}", column) for column in _TIMES)
    return ", ".join([*times, *others, f"{odd} AS odd"])


RUN_COLUMNS = (*_TIMES, *_OTHERS, "odd")
"""The columns of a run that :func:`decode_run` reads: every read of runs selects these."""
RUN = run_list()
""":data:`RUN_COLUMNS` as a select list (the runs table's columns, unqualified)."""
R_RUN = run_list("r.")
""":data:`RUN_COLUMNS` of the runs table aliased ``r`` (for ``RETURNING``)."""

_skipped: Counter[str] = Counter()
_told: set[tuple[str, str]] = set()


def skipped(table: str) -> int:
    """How many rows of *table* this process found unreadable (:func:`report_odd`)."""
    return _skipped[table]


def report_odd(table: str, job: object, odd: str, *, kept: bool = False) -> None:
    """Count a row of *table* about *job* that has an unreadable value (*odd*), and say so
    at WARNING the first time. The row is skipped, or with *kept* read with those values
    unknown (a job's schedule note)."""
    _skipped[table] += 1
    key = (table, str(job))
    if key in _told:
        return
    _told.add(key)
    _logger.warning(
        "job %r: a row of %s holds a value this replica cannot read (%s): %s; fix or "
        "delete it (said once per job and table)",
        job,
        table,
        odd,
        "read as unknown" if kept else "the row is skipped",
    )


def to_record(row: Any) -> RunRecord:
    """A ledger row (:data:`RUN_COLUMNS`) as a record.

    A row without an outcome is ``"unfinished"``: still running, its replica died moments
    ago, or it was released without an outcome (then *finished_at* is set).
    """
    outcome = row["outcome"]
    return RunRecord(
        slot=row["slot"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        outcome=outcome if outcome in _OUTCOMES else "unfinished",
        error=row["error"],
        owner=f"{row['host']}:{row['pid']}",
        attempt=row["attempt"],
        manual=row["manual"],
    )


def decode_run(row: Any, *, table: str, job: object) -> RunRecord | None:
    """*row* as a record, or ``None`` (reported, :func:`report_odd`) when a timestamp of it
    is out of range."""
    odd = row["odd"]
    if odd is not None:
        report_odd(table, job, odd)
        return None
    return to_record(row)


CLAIMED_START = "greatest(clock_timestamp(), l.slot)"
"""The ``started_at`` a claim writes (in a statement whose claimed rows are ``l``)."""


def real_start(claimed: str, reported: str, finished: str) -> str:
    """The ``started_at`` an outcome writes: the start the replica *reported*, kept between
    the *claimed* start and the *finished* instant (a clock that is not the server's, a
    test's fake clock say, cannot make a run begin before its claim or after its end); the
    claimed start when none is reported (an undo)."""
    return f"least({finished}, greatest({claimed}, coalesce({reported}, {claimed})))"
