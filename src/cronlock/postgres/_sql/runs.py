"""A run in the ledger: its columns, their timestamp guards and decoding, its start, and
the reads of runs (the latest-run builder every such read uses).

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

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ..._logs import get_logger
from ..._records import RunRecord

if TYPE_CHECKING:
    from .tables import LedgerTable

__all__ = (
    "CLAIMED_START",
    "HIGH",
    "HISTORY_COLUMNS",
    "LOW",
    "RUN",
    "RUN_COLUMNS",
    "R_RUN",
    "Latest",
    "Prefixed",
    "catch_up_sql",
    "decode_attempts",
    "decode_history",
    "decode_run",
    "history_sql",
    "last_claimed_sql",
    "last_runs_many_sql",
    "last_runs_sql",
    "late_finish_sql",
    "latest_run",
    "odd_list",
    "real_start",
    "report_odd",
    "run_list",
    "runs_page_sql",
    "sane",
    "skipped",
    "slot_in_range",
    "to_record",
    "told_columns",
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


HISTORY_COLUMNS = (*RUN_COLUMNS, "attempts")
"""The columns of the history reads (:func:`history_sql`, :func:`runs_page_sql`):
:data:`RUN_COLUMNS` and ``attempts``, the slot's earlier attempts as JSON text
(:func:`decode_history`). The other reads of runs leave them out: no claim, catch-up or
watch needs them."""
_HISTORY = f"{RUN}, r.attempts::text AS attempts"


def decode_history(row: Any, *, table: str, job: object) -> RunRecord | None:
    """A history read's *row* (:data:`HISTORY_COLUMNS`) as a record with its earlier
    attempts (:func:`decode_attempts`), or ``None`` as :func:`decode_run` says."""
    record = decode_run(row, table=table, job=job)
    text = row["attempts"]
    if record is None or text is None:
        return record
    earlier = decode_attempts(text, table=table, job=job, slot=record.slot)
    if record.manual:  # the slot's every attempt was the trigger's
        earlier = tuple(dataclasses.replace(a, manual=True) for a in earlier)
    return dataclasses.replace(record, attempts=earlier)


def decode_attempts(text: str, *, table: str, job: object, slot: datetime) -> tuple[RunRecord, ...]:
    """A row's ``attempts`` (JSON text, ``.crashes.KEPT_ATTEMPTS``) as records of *slot*,
    oldest first. What no replica can read (not JSON, not a list, an entry without a
    readable attempt, start or outcome) is left out and reported (:func:`report_odd`): the
    row itself is still shown."""
    try:
        items = json.loads(text)
    except ValueError:
        items = None
    if not isinstance(items, list):
        report_odd(table, job, f"attempts={text[:80]!r}", kept=True)
        return ()
    kept = []
    for item in items:
        record = _attempt(item, slot)
        if record is None:
            report_odd(table, job, f"attempts entry {str(item)[:80]!r}", kept=True)
        else:
            kept.append(record)
    return tuple(kept)


def _attempt(item: object, slot: datetime) -> RunRecord | None:
    """One entry of ``attempts`` as a record, or ``None`` if it cannot be read."""
    if not isinstance(item, dict):
        return None
    attempt, outcome, error = item.get("attempt"), item.get("outcome"), item.get("error")
    host, pid = item.get("host"), item.get("pid")
    started, finished = _instant(item.get("started_at")), _instant(item.get("finished_at"))
    if (
        type(attempt) is not int
        or not 1 <= attempt <= 32767
        or started is None
        or not (error is None or isinstance(error, str))
    ):
        return None
    return RunRecord(
        slot=slot,
        started_at=started,
        finished_at=finished,
        outcome=outcome if outcome in _OUTCOMES else "unfinished",
        error=error,
        owner=f"{host}:{pid}" if isinstance(host, str) and type(pid) is int else None,
        attempt=attempt,
    )


def _instant(value: object) -> datetime | None:
    """A JSON timestamp (``to_jsonb`` of a ``timestamptz``: ISO 8601 with its offset) as an
    aware UTC datetime; ``None`` when it is none (``infinity``, not text, no offset)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return None if parsed.tzinfo is None else parsed.astimezone(UTC)


CLAIMED_START = "greatest(clock_timestamp(), l.slot)"
"""The ``started_at`` a claim writes (in a statement whose claimed rows are ``l``)."""


def real_start(claimed: str, reported: str, finished: str) -> str:
    """The ``started_at`` an outcome writes: the start the replica *reported*, kept between
    the *claimed* start and the *finished* instant (a clock that is not the server's, a
    test's fake clock say, cannot make a run begin before its claim or after its end); the
    claimed start when none is reported (an undo)."""
    return f"least({finished}, greatest({claimed}, coalesce({reported}, {claimed})))"


# -- the latest run: one builder for every read of a job's latest finished run, success or
# failure (the claims' told columns, catch-up, the fleet watch, the status verbs, the
# dashboard's roster) ----------------------------------------------------------------------

Latest = Literal["last", "ok", "failed"]
"""Which latest run: ``"last"`` finished, ``"ok"`` succeeded, ``"failed"`` did not succeed
(the labels the reads answer with, in their ``kind`` column)."""

_LATEST: dict[str, str] = {
    "last": "{a}.finished_at IS NOT NULL",
    "ok": "{a}.outcome = 'succeeded'",
    "failed": "{a}.outcome <> 'succeeded'",
}


def latest_run(
    runs: str,
    job: str,
    kind: Latest,
    *,
    columns: str = RUN,
    alias: str = "r",
    also: str | None = None,
) -> str:
    """The subquery that reads job *job*'s latest run of *kind* (``"last"`` finished, ``"ok"``
    succeeded, ``"failed"`` not succeeded) from the quoted runs table *runs*, as *columns*
    (:data:`RUN` unless given), the table aliased *alias*: one backward probe of the primary
    key. *job* is an SQL expression (``$1``, ``u.job``); *also* a further condition (the
    claims' "at or before this slot"). A row whose slot Python cannot hold is none of them
    (:func:`slot_in_range`): one odd row must not hide the job's real latest run. Every
    read of a latest run is built here, so they cannot disagree on what "latest" means."""
    a = alias
    where = [f"{a}.job = {job}", _LATEST[kind].format(a=a)]
    if also is not None:
        where.append(also)
    where.append(slot_in_range(f"{a}.slot"))
    return (
        f"SELECT {columns} FROM {runs} {a} WHERE {' AND '.join(where)} "
        f"ORDER BY {a}.slot DESC LIMIT 1"
    )


def last_runs_sql(table: LedgerTable) -> str:
    """``$1`` job: rows ('last', latest finished run) and ('ok', latest success), and
    ('failed', latest failure); a row whose slot is out of range is none of them."""
    kinds: tuple[Latest, ...] = ("last", "ok", "failed")
    return "\n            UNION ALL\n            ".join(
        f"({latest_run(table.runs, '$1', kind, columns=f'{kind!r} AS kind, {RUN}')})"
        for kind in kinds
    )


def last_runs_many_sql(
    table: LedgerTable, kinds: Sequence[Latest] = ("last", "ok", "failed")
) -> str:
    """Array ``$1`` jobs: for each, a row ``(job, kind, run)`` per kind of *kinds* that it
    has: ``'last'`` its latest finished run, ``'ok'`` its latest success, ``'failed'`` its
    latest failure; an index probe per job and kind (what :func:`last_runs_sql` reads of one
    job, for many in one statement)."""
    runs = table.runs
    return " UNION ALL ".join(
        f"""SELECT u.job, '{kind}' AS kind, r.* FROM unnest($1::text[]) AS u(job)
            CROSS JOIN LATERAL ({latest_run(runs, "u.job", kind, alias="x")}) r"""
        for kind in kinds
    )


def told_columns(runs: str) -> str:
    """The end of a claim statement, the same in both modes: the ``p_*`` columns, and the
    ``FROM c`` they come with: for a refused row, the job's latest finished run at or
    before that slot (one backward step on the primary key, skipped for granted rows: its
    gate refers to the outer row alone). Its timestamps are guarded: a row no replica can
    read must not fail every claim of the batch."""
    told = ", ".join(f"p.{column} AS p_{column}" for column in RUN_COLUMNS)
    latest = latest_run(runs, "c.job", "last", also="c.started_at IS NULL AND r.slot <= c.slot")
    return f"""{told}
        FROM c
        LEFT JOIN LATERAL ({latest}) p ON true"""


def catch_up_sql(table: LedgerTable) -> str:
    """What start-up catch-up needs of many jobs, in one statement.

    Array ``$1`` jobs. Per job: ``claimed``, the latest slot any replica claimed; its
    latest finished run and its latest success (``l_*`` and ``s_*`` columns, NULL when
    none). Three look-ups on the primary key per job. Rows whose slot Python cannot hold
    are none of these; ``odd_slot`` names the job's latest such row (two more probes), for
    the caller to report.
    """
    runs = table.runs
    cols = RUN_COLUMNS
    last = ", ".join(f"l.{c} AS l_{c}" for c in cols)
    ok = ", ".join(f"s.{c} AS s_{c}" for c in cols)
    sane_slot = slot_in_range("r.slot")
    return f"""
        SELECT u.job, m.slot AS claimed, {last}, {ok}, {odd_list([("o.slot", "slot")])} AS odd_slot
        FROM unnest($1::text[]) AS u(job)
        LEFT JOIN LATERAL (
            SELECT r.slot FROM {runs} r WHERE r.job = u.job AND {sane_slot}
            ORDER BY r.slot DESC LIMIT 1
        ) m ON true
        LEFT JOIN LATERAL ({latest_run(runs, "u.job", "last")}) l ON true
        LEFT JOIN LATERAL ({latest_run(runs, "u.job", "ok")}) s ON true
        LEFT JOIN LATERAL (
            (SELECT r.slot FROM {runs} r WHERE r.job = u.job AND r.slot > {HIGH} LIMIT 1)
            UNION ALL
            (SELECT r.slot FROM {runs} r WHERE r.job = u.job AND r.slot < {LOW} LIMIT 1)
            LIMIT 1
        ) o ON true"""


class Prefixed:
    """The columns of an answer's *row* named *prefix* + name, read as a ledger row (for
    :func:`decode_run`)."""

    __slots__ = ("_prefix", "_row")

    def __init__(self, row: Any, prefix: str) -> None:
        self._row = row
        self._prefix = prefix

    def __getitem__(self, name: str) -> Any:
        return self._row[self._prefix + name]


# -- other reads and writes of runs ----------------------------------------------------------


def last_claimed_sql(table: LedgerTable) -> str:
    """``$1`` job: the latest slot any replica claimed."""
    return f"SELECT max(slot) FROM {table.runs} WHERE job = $1 AND {slot_in_range('slot')}"


def history_sql(table: LedgerTable) -> str:
    """``$1`` job, ``$2`` limit: the latest runs, newest first, one row per slot
    (:data:`HISTORY_COLUMNS`: its earlier attempts too)."""
    return f"""
            SELECT {_HISTORY} FROM {table.runs} r WHERE job = $1
            ORDER BY r.slot DESC LIMIT $2"""


def runs_page_sql(table: LedgerTable) -> str:
    """``$1`` job, ``$2`` limit, ``$3`` a slot (NULL: none): the latest runs of slots before
    ``$3``, newest first (the next page of :func:`history_sql`, the same columns)."""
    return f"""
        SELECT {_HISTORY}
        FROM {table.runs} r
        WHERE job = $1 AND ($3::timestamptz IS NULL OR r.slot < $3::timestamptz)
        ORDER BY r.slot DESC LIMIT $2"""


def late_finish_sql(table: LedgerTable) -> str:
    """Record outcomes of runs whose session died (no lock to release any more).

    Arrays: ``$1`` jobs, ``$2`` slots, ``$3`` outcomes, ``$4`` errors, ``$5`` times,
    ``$6`` attempts, ``$9`` when the runs began; ``$7`` host, ``$8`` pid: only this
    process's own claims are written. Another replica may have marked such a run
    ``"crashed"`` meanwhile (its session was gone): the real outcome replaces that,
    unless a rerun took the slot over (the row is then another attempt's). Answers each
    row written (*job*, *slot*) and whether it was still unfinished (*unmarked*: no other
    replica marked it crashed, and so none reported it, nor reruns it on that word); the
    rows are locked first (``FOR UPDATE``), so a mark committed meanwhile is seen.
    """
    return f"""
            WITH u AS (
                SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[],
                                     $5::timestamptz[], $6::smallint[], $9::timestamptz[])
                     AS u(job, slot, outcome, error, finished_at, attempt, started)
            ), was AS MATERIALIZED (
                SELECT r.job, r.slot, r.finished_at IS NULL AS open
                FROM {table.runs} r JOIN u ON r.job = u.job AND r.slot = u.slot
                WHERE r.attempt = u.attempt AND r.host = $7::text AND r.pid = $8::integer
                  AND (r.finished_at IS NULL OR r.outcome = 'crashed')
                FOR UPDATE OF r
            )
            UPDATE {table.runs} AS r
            SET finished_at = u.finished_at, outcome = u.outcome, error = u.error,
                started_at = {real_start("r.started_at", "u.started", "u.finished_at")}
            FROM u JOIN was ON was.job = u.job AND was.slot = u.slot
            WHERE r.job = u.job AND r.slot = u.slot AND r.attempt = u.attempt
              AND r.host = $7::text AND r.pid = $8::integer
              AND (r.finished_at IS NULL OR r.outcome = 'crashed')
            RETURNING r.job, r.slot, was.open AS unmarked"""
