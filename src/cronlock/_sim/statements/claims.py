"""The run ledger's claims, ends and reads of runs, in the simulated server.

Every statement of :mod:`cronlock.postgres._sql.claims` (the try-locks and unlocks, the
session-mode claim of many slots, the end of many runs both modes share), the reads of runs
of :mod:`cronlock.postgres._sql.runs` (catch-up, the latest runs, the last claimed slot,
history, the late outcomes), the two retry statements of :mod:`cronlock.postgres._sql.crashes`
a replica sends for its own failed attempts (mark a retry due, look for pending ones), and the
lock-only try-lock of :mod:`cronlock.postgres._sql.bare`.

Each handler does what PostgreSQL does with that text, in the order the SQL says it: every
per-row look-up reads the table as it was when the statement began (a statement's snapshot:
the rows a claim inserts are not seen by its own ``ran`` check), the locks are taken row by
row in element order, and the answers come one row per element, by *i*. A row no replica can
read (a timestamp outside :data:`LOW` .. :data:`HIGH`, stored here as ``datetime.min`` or
``datetime.max`` for ``-infinity`` / ``infinity``) is guarded as :func:`..runs.sane` and
:func:`..runs.odd_list` guard it. The helpers :func:`run_values`, :func:`latest`,
:func:`end_runs` and :func:`late_finish` are public so that the lease-mode handlers can share
them (their statements embed :func:`..runs.told_columns`, :func:`..claims.end_ctes` and
:func:`..runs.late_finish_sql`).
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from ...postgres._sql import bare, claims
from ...postgres._sql import runs as runs_sql
from ..db import HIGH, LOW, in_range
from ..rows import Row, rows

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = (
    "HIGH",
    "LOW",
    "RUN_COLUMNS",
    "end_runs",
    "in_range",
    "late_finish",
    "latest",
    "new_run",
    "odd",
    "pg_text",
    "register",
    "run_values",
)

_MIN = datetime.min.replace(tzinfo=UTC)  # how the model stores -infinity
_MAX = datetime.max.replace(tzinfo=UTC)  # and infinity

RUN_COLUMNS = runs_sql.RUN_COLUMNS
"""The columns of a run every read answers (:data:`..runs.RUN_COLUMNS`)."""
_TIMES = ("slot", "started_at", "finished_at")
_OTHERS = ("outcome", "error", "host", "pid", "attempt", "manual")
_NO_RUN: tuple[Any, ...] = (None,) * len(RUN_COLUMNS)
_P_COLUMNS = tuple(f"p_{c}" for c in RUN_COLUMNS)
_GONE_COLUMNS = ("gone_slot", "gone_holder", "gone_expired", "gone_since")
_CLAIM_COLUMNS = ("i", "ran", "paused", "got", "started_at", "undone", *_GONE_COLUMNS, *_P_COLUMNS)
_HISTORY_COLUMNS = runs_sql.HISTORY_COLUMNS
_UNDO_ERROR = "cancelled before the rerun began"  # what finish_many_sql writes for an undo

Kind = Literal["last", "ok", "failed"]

_Row = dict[str, Any]


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers."""
    add = statements.add
    add(claims.TRY_LOCK_SQL, _try_lock)
    add(claims.TRY_LOCK_ON_SQL, _try_lock_on)
    add(claims.UNLOCK_SQL, _unlock)
    add(claims.TRY_LOCK_MANY_SQL, _try_lock_many)
    add(claims.UNLOCK_MANY_SQL, _unlock_many)
    add(bare.TRY_LOCK_MANY_SQL, _bare_try_lock_many)
    # bare.UNLOCK_MANY_SQL is the same statement as claims.UNLOCK_MANY_SQL (answered above).
    add(claims.claim_many_sql(table), _claim_many, claim=True)
    add(claims.finish_many_sql(table), _finish_many)
    add(claims.undo_lost_sql(table), _undo_lost)
    add(runs_sql.late_finish_sql(table), late_finish)
    add(runs_sql.catch_up_sql(table), _catch_up)
    add(runs_sql.last_claimed_sql(table), _last_claimed)
    add(runs_sql.last_runs_sql(table), _last_runs)
    # Each set of kinds the library asks for (the fleet watch reads two, the others three).
    for kinds in (("last", "ok", "failed"), ("last", "ok")):
        add(runs_sql.last_runs_many_sql(table, kinds), _last_runs_many(kinds))
    add(runs_sql.history_sql(table), _history)
    add(runs_sql.runs_page_sql(table), _runs_page)


# -- values as PostgreSQL reads and writes them ------------------------------------------------


def pg_text(value: datetime) -> str:
    """``value::text`` of a ``timestamptz`` in a UTC session (DateStyle ISO)."""
    if value == _MIN:
        return "-infinity"
    if value == _MAX:
        return "infinity"
    value = value.astimezone(UTC)
    text = f"{value.year:04d}-{value:%m-%d %H:%M:%S}"
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "+00"


def odd(run: _Row, columns: Iterable[str] = _TIMES) -> str | None:
    """:func:`..runs.odd_list` of *run*: each of *columns* out of range with its raw text."""
    parts = [
        f"{c}={pg_text(run[c])}" for c in columns if run[c] is not None and not in_range(run[c])
    ]
    return ", ".join(parts) or None


def _sane(value: datetime | None) -> datetime | None:
    return value if in_range(value) else None


def run_values(run: _Row | None) -> tuple[Any, ...]:
    """*run* as :data:`..runs.RUN` selects it (each timestamp guarded, then ``odd``); all
    NULL for no run (a ``LEFT JOIN LATERAL`` that found none)."""
    if run is None:
        return _NO_RUN
    return (*(_sane(run[c]) for c in _TIMES), *(run[c] for c in _OTHERS), odd(run))


def new_run(
    job: str, slot: datetime, host: str, pid: int, started_at: datetime, **more: Any
) -> _Row:
    """A runs row with every column of its DDL, the defaults filled in."""
    row: _Row = {
        "job": job,
        "slot": slot,
        "host": host,
        "pid": pid,
        "started_at": started_at,
        "finished_at": None,
        "outcome": None,
        "error": None,
        "session": None,
        "attempt": 1,
        "manual": False,
        "holder": None,
        "attempts": None,
        "retry_at": None,
    }
    row.update(more)
    return row


def _job_runs(x: Exec, job: Any) -> list[_Row]:
    """The runs of *job* (a probe of the primary key by job)."""
    if job is None:
        return []
    return list(x.db.runs_of(job).values())


_KINDS: dict[str, Any] = {
    "last": lambda r: r["finished_at"] is not None,
    "ok": lambda r: r["outcome"] == "succeeded",
    # outcome <> 'succeeded': NULL (an unfinished run) is not a failure.
    "failed": lambda r: r["outcome"] is not None and r["outcome"] != "succeeded",
}


def latest(x: Exec, job: Any, kind: Kind, *, at_or_before: datetime | None = None) -> _Row | None:
    """:func:`..runs.latest_run`: *job*'s run of *kind* with the greatest slot in range
    (and at or before *at_or_before*, the claims' told run), or ``None``. Read newest
    first from the job's slots in order (:meth:`..db.Database.slots_of`), as the server
    reads its index backwards: the answer is near the end, and a job's runs grow by one a
    slot (a scan of them all was the model's dearest read)."""
    if job is None:
        return None
    test = _KINDS[kind]
    runs, slots = x.db.runs_of(job), x.db.slots_of(job)
    end = len(slots) if at_or_before is None else bisect.bisect_right(slots, at_or_before)
    for i in range(end - 1, -1, -1):
        run = runs[(job, slots[i])]
        if test(run):
            return run
    return None


def _padded(*arrays: Sequence[Any] | None) -> list[tuple[Any, ...]]:
    """``unnest`` of several arrays: as long as the longest, the others padded with NULL
    (a NULL array is empty)."""
    return list(itertools.zip_longest(*(a or () for a in arrays)))


def _greatest(*values: datetime | None) -> datetime | None:
    """``greatest``: NULLs ignored, NULL only when all are."""
    given = [v for v in values if v is not None]
    return max(given) if given else None


def _least(*values: datetime | None) -> datetime | None:
    """``least``: NULLs ignored, NULL only when all are."""
    given = [v for v in values if v is not None]
    return min(given) if given else None


def _real_start(
    claimed: datetime | None, reported: datetime | None, finished: datetime | None
) -> datetime | None:
    """:func:`..runs.real_start`."""
    return _least(finished, _greatest(claimed, reported if reported is not None else claimed))


def _jsonb_text(value: Any) -> str:
    """``value::text`` of a ``jsonb`` (its keys ordered as jsonb orders them: shorter
    first, then bytewise)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, datetime):  # to_jsonb of a timestamptz
        return json.dumps(value.astimezone(UTC).isoformat())
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return (
            "{"
            + ", ".join(
                f"{json.dumps(k, ensure_ascii=False)}: {_jsonb_text(value[k])}" for k in keys
            )
            + "}"
        )
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_jsonb_text(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {value!r}")


def _attempts_text(value: Any) -> str | None:
    """``r.attempts::text``: text as it is (a handler stored jsonb's text), else rendered."""
    if value is None or isinstance(value, str):
        return value
    return _jsonb_text(value)


# -- locks -----------------------------------------------------------------------------------


def _lock(x: Exec, key: int | None) -> bool | None:
    """``pg_try_advisory_lock(key)`` (strict: NULL for a NULL key)."""
    return None if key is None else x.try_lock(key)


def _release(x: Exec, key: int | None) -> bool | None:
    """``pg_advisory_unlock(key)`` (strict: NULL for a NULL key)."""
    return None if key is None else x.unlock(key)


def _try_lock(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return rows(["pg_try_advisory_lock"], (_lock(x, args[0]),))


def _try_lock_on(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    key, pid = args
    # pg_backend_pid() = NULL is NULL: no lock taken, as for another backend.
    return rows(["case"], (_lock(x, key) if pid is not None and pid == x.pid else None,))


def _unlock(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return rows(["pg_advisory_unlock"], (_release(x, args[0]),))


def _try_lock_many(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return rows(["i", "got"], *((i, _lock(x, key)) for i, key in enumerate(args[0] or (), 1)))


def _unlock_many(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return rows(
        ["i", "released"], *((i, _release(x, key)) for i, key in enumerate(args[0] or (), 1))
    )


def _bare_try_lock_many(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    names = ["i", "started_at", "ran", "got", "paused", "stray", "p_slot"]
    answers = []
    for i, key in enumerate(args[0] or (), 1):
        got = _lock(x, key)
        answers.append((i, x.now if got else None, False, got, False, False, None))
    return rows(names, *answers)


# -- the claim of many slots (session mode) -----------------------------------------------------


def _claim_many(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """:func:`..claims.claim_many_sql`: ``u`` (claim_inputs), ``l`` (the try-locks), ``ins``
    (ON CONFLICT DO NOTHING), ``c``, then the projection (the unlock of a lost insert, the
    told run of a refused row)."""
    keys, jobs, slots, host, pid, holder = args
    runs, control = x.db.table("runs"), x.db.table("control")
    # u: every look-up sees the table as it was when the statement began.
    inputs = []
    for i, (key, job, slot) in enumerate(_padded(keys, jobs, slots), 1):
        ran = job is not None and slot is not None and (job, slot) in runs
        pc = control.get(job) if job is not None else None
        paused = manual = False
        if pc is not None:
            trigger = pc["trigger_slot"]
            # IS [NOT] DISTINCT FROM: NULL is distinct from a slot.
            same = trigger == slot if trigger is not None and slot is not None else trigger is slot
            paused = pc["paused_at"] is not None and not same
            manual = same
        inputs.append((i, key, job, slot, ran, paused, manual))
    # l: the lock tried row by row, unless the slot ran or the job is paused.
    locked = [
        (i, key, job, slot, ran, paused, manual, False if ran or paused else _lock(x, key))
        for i, key, job, slot, ran, paused, manual in inputs
    ]
    # ins: each granted row inserted unless its (job, slot) is there (also one inserted by
    # an earlier row of this statement: DO NOTHING sees those).
    inserted: dict[tuple[Any, Any], datetime] = {}
    for _, _, job, slot, _, _, manual, got in locked:
        if not got or (job, slot) in runs:
            continue
        _not_null(job=job, slot=slot, host=host, pid=pid)
        started = _greatest(x.now, slot)
        assert started is not None
        run = new_run(job, slot, host, pid, started, session=x.pid, manual=manual, holder=holder)
        x.db.put("runs", (job, slot), run)
        inserted[(job, slot)] = started
    answers = []
    for i, key, job, slot, ran, paused, _, got in locked:
        started_at = inserted.get((job, slot))  # c: l LEFT JOIN ins ON job, slot
        undone = _release(x, key) if got and started_at is None else None
        told = None
        gone: tuple[Any, ...] = (None,) * len(_GONE_COLUMNS)
        if started_at is None and slot is not None:
            # The told run: the inserted rows are unfinished, so none of them is it.
            told = latest(x, job, "last", at_or_before=slot)
        elif started_at is not None:
            gone = _gone_holder(x, job, slot, holder, inserted)
        answers.append((i, ran, paused, got, started_at, undone, *gone, *run_values(told)))
    return rows(_CLAIM_COLUMNS, *answers)


def _gone_holder(
    x: Exec, job: Any, slot: datetime, holder: Any, inserted: dict[tuple[Any, Any], datetime]
) -> tuple[Any, ...]:
    """``claims._gone_holder`` for a granted claim of *job*'s *slot* by *holder*: the job's
    latest run before it in the statement's snapshot (not *inserted* by it), if another
    holder's that did not end, as (slot or the last slot recorded since, holder, now, the
    same slot); NULLs otherwise."""
    nothing = (None,) * len(_GONE_COLUMNS)
    runs, slots = x.db.runs_of(job), x.db.slots_of(job)
    for i in range(bisect.bisect_left(slots, slot) - 1, -1, -1):
        if (job, slots[i]) not in inserted:
            prev = runs[(job, slots[i])]
            break
    else:
        return nothing
    owner = prev["holder"]
    if owner is None or holder is None or owner == holder or not in_range(prev["slot"]):
        return nothing
    if prev["finished_at"] is not None and prev["outcome"] not in ("crashed", "lock_lost"):
        return nothing
    told = [
        min(record["last_slot"], slot)
        for (name, first), record in x.db.table("slots").items()
        if name == job and prev["slot"] < first < slot
    ]
    held = max([prev["slot"], *told])
    return (held, owner, x.now, held)


def _not_null(**values: Any) -> None:
    """The NOT NULL columns of runs: a NULL is the error PostgreSQL answers."""
    for name, value in values.items():
        if value is None:
            import asyncpg

            raise asyncpg.NotNullViolationError(
                f'null value in column "{name}" of relation "runs" violates not-null constraint'
            )


# -- the end of many runs (both modes) ------------------------------------------------------------


def end_runs(
    x: Exec,
    ends: Sequence[tuple[Any, Any, Any, Any, Any, Any]],
    host: Any,
    pid: Any,
) -> int:
    """:func:`..claims.end_ctes` (``t``, ``del``, ``upd``) for *ends*, each ``(job, slot,
    outcome, error, undo, started)`` (the CTE ``u``'s columns); return how many rows were
    deleted or updated. An undo of a first attempt by this host and pid deletes the claim;
    an undo of a later attempt by them records it ``cancelled``; an outcome is recorded
    whoever claimed; an undo of another's claim changes nothing."""
    runs = x.db.table("runs")
    found = []  # t: each end's unfinished row, as the statement began
    for job, slot, outcome, error, undo, started in ends:
        run = runs.get((job, slot)) if job is not None and slot is not None else None
        if run is not None and run["finished_at"] is None:
            found.append(((job, slot), dict(run), outcome, error, undo, started))
    mine = host is not None and pid is not None
    changed: set[tuple[Any, Any]] = set()
    for key, run, _, _, undo, _ in found:  # del
        same = mine and run["host"] == host and run["pid"] == pid
        if undo is True and same and run["attempt"] == 1 and key not in changed:
            x.db.delete("runs", key)
            changed.add(key)
    for key, run, outcome, error, undo, started in found:  # upd: a row once, whatever joins
        same = mine and run["host"] == host and run["pid"] == pid
        # NOT t.undo OR (same AND attempt > 1): a NULL undo counts only by the second part.
        if key in changed or not (undo is False or (same and run["attempt"] > 1)):
            continue
        x.db.update(
            "runs",
            key,
            finished_at=x.now,
            started_at=_real_start(run["started_at"], started, x.now),
            outcome="cancelled" if undo is True else outcome,
            error=_UNDO_ERROR if undo is True else error,
        )
        changed.add(key)
    return len(changed)


def undo_lost(
    x: Exec, jobs: Sequence[str] | None, slots: Sequence[datetime] | None, host: str, pid: int,
    *, other_session: bool,
) -> list[tuple[str, datetime]]:  # fmt: skip
    """The ``DELETE`` of :func:`..claims.undo_lost_sql` (and its lease form): this process's
    unfinished first attempts among (*jobs*, *slots*), with *other_session*: claimed on
    another session than this one (NULL counts as another). Returns the keys deleted."""
    gone: list[tuple[str, datetime]] = []
    for key in itertools.zip_longest(jobs or (), slots or ()):
        run = x.db.get("runs", key)
        if (
            run is None
            or key in gone
            or run["finished_at"] is not None
            or run["attempt"] != 1
            or run["host"] != host
            or run["pid"] != pid
            or (other_session and run["session"] == x.pid)
        ):
            continue
        x.db.delete("runs", key)
        gone.append(key)
    return gone


def _undo_lost(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """:func:`..claims.undo_lost_sql`: delete lost claims of this process; how many."""
    jobs, slots, host, pid = args
    return rows(["undone"], (len(undo_lost(x, jobs, slots, host, pid, other_session=True)),))


def _finish_many(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """:func:`..claims.finish_many_sql`: the rows changed, then every key unlocked."""
    jobs, slots, outcomes, errors, keys, undos, host, pid, starteds = args
    u = _padded(jobs, slots, outcomes, errors, keys, undos, starteds)
    end_runs(x, [(j, s, o, e, un, st) for j, s, o, e, _, un, st in u], host, pid)
    return rows(["i", "released"], *((i, _release(x, e[4])) for i, e in enumerate(u, 1)))


def late_finish(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """:func:`..runs.late_finish_sql`: the rows it updated, (job, slot, unmarked)."""
    jobs, slots, outcomes, errors, finished, attempts, host, pid, starteds = args
    runs = x.db.table("runs")
    changed: dict[tuple[Any, Any], bool] = {}
    for job, slot, outcome, error, finished_at, attempt, started in _padded(
        jobs, slots, outcomes, errors, finished, attempts, starteds
    ):
        key = (job, slot)
        run = runs.get(key) if job is not None and slot is not None else None
        if run is None or key in changed or host is None or pid is None:
            continue
        if run["attempt"] != attempt or run["host"] != host or run["pid"] != pid:
            continue
        if not (run["finished_at"] is None or run["outcome"] == "crashed"):
            continue
        unmarked = run["finished_at"] is None
        x.db.update(
            "runs",
            key,
            finished_at=finished_at,
            outcome=outcome,
            error=error,
            started_at=_real_start(run["started_at"], started, finished_at),
        )
        changed[key] = unmarked
    return rows(["job", "slot", "unmarked"], *((*key, open_) for key, open_ in changed.items()))


# -- reads of runs -------------------------------------------------------------------------------


def _catch_up(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """:func:`..runs.catch_up_sql`: per job, its latest claimed slot, latest finished run,
    latest success, and an out-of-range slot of it (named for the caller to report)."""
    names = ["job", "claimed"]
    names += [f"l_{c}" for c in RUN_COLUMNS] + [f"s_{c}" for c in RUN_COLUMNS] + ["odd_slot"]
    answers = []
    for job in args[0] or ():
        mine = _job_runs(x, job)
        claimed = max((r["slot"] for r in mine if in_range(r["slot"])), default=None)
        # The probes of the key above HIGH, then below LOW, each the first in key order.
        above = sorted(r["slot"] for r in mine if r["slot"] > HIGH)
        below = sorted(r["slot"] for r in mine if r["slot"] < LOW)
        out = (above or below or [None])[0]
        odd_slot = None if out is None else f"slot={pg_text(out)}"
        last, ok = latest(x, job, "last"), latest(x, job, "ok")
        answers.append((job, claimed, *run_values(last), *run_values(ok), odd_slot))
    return rows(names, *answers)


def _last_claimed(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    mine = _job_runs(x, args[0])
    return rows(["max"], (max((r["slot"] for r in mine if in_range(r["slot"])), default=None),))


def _last_runs(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """:func:`..runs.last_runs_sql`: a row per kind the job has."""
    kinds: tuple[Kind, ...] = ("last", "ok", "failed")
    found = [(kind, latest(x, args[0], kind)) for kind in kinds]
    return rows(
        ["kind", *RUN_COLUMNS], *((kind, *run_values(r)) for kind, r in found if r is not None)
    )


def _last_runs_many(kinds: Sequence[Kind]) -> Any:
    """:func:`..runs.last_runs_many_sql` of *kinds*: per kind, per job, its row if any."""

    def handler(x: Exec, args: tuple[Any, ...]) -> list[Row]:
        answers = []
        for kind in kinds:
            for job in args[0] or ():
                run = latest(x, job, kind)
                if run is not None:
                    answers.append((job, kind, *run_values(run)))
        return rows(["job", "kind", *RUN_COLUMNS], *answers)

    return handler


def _page(x: Exec, job: Any, limit: Any, before: datetime | None) -> list[Row]:
    """A job's runs newest first (no range filter: an odd row is shown, guarded)."""
    mine = [r for r in _job_runs(x, job) if before is None or r["slot"] < before]
    mine.sort(key=lambda r: r["slot"], reverse=True)
    if limit is not None:
        mine = mine[: int(limit)]
    return rows(_HISTORY_COLUMNS, *((*run_values(r), _attempts_text(r["attempts"])) for r in mine))


def _history(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return _page(x, args[0], args[1], None)


def _runs_page(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    return _page(x, args[0], args[1], args[2])


# -- a failed attempt's retry ----------------------------------------------------------------------
