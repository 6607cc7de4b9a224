"""Lease mode's statements (``_sql/leases.py``, and ``_sql/failover.lease_reassert_sql``):
a lease is the job's row of the leases table, live while its ``expires_at`` is after the
server's ``clock_timestamp()``; a released one expired at ``'-infinity'``.

Each handler follows its statement's SQL step by step, as PostgreSQL evaluates it: the CTEs
in order, each ``ON CONFLICT`` against the latest row (a statement here is atomic, so that
is the row in the table), SQL's NULLs where an argument may be NULL, and the answer's
columns in the statement's order. What the model leaves out:

- ``pg_try_advisory_xact_lock`` of a claim always succeeds: only a transaction in flight
  could hold the claim's key (a lease-mode statement is a transaction of its own, and the
  model runs statements one at a time), or a session lock of the very same 64-bit key (a
  hash of job, slot and attempt, which no other statement uses).
- Rows are returned in key order where the statement has no ``ORDER BY`` (the callers read
  them by ``i`` or by job); ``ORDER BY job`` sorts as the ``C`` collation does.
- ``attempts`` (jsonb) is stored as its JSON value (:func:`.crashes.kept_attempts`), as
  :mod:`.crashes` stores it; the reads render it as PostgreSQL prints jsonb.

The runs' part of an end, the late outcomes and the told run are :mod:`.claims`'s (the
statements embed the same ``_sql`` fragments as session mode's).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from ...postgres._sql.failover import lease_reassert_sql
from ...postgres._sql.leases import (
    lease_claim_many_sql,
    lease_crashed_sql,
    lease_finish_many_sql,
    lease_holders_sql,
    lease_late_finish_sql,
    lease_recover_sql,
    lease_undo_lost_sql,
    renew_sql,
)
from ..rows import Row, rows
from .claims import (
    RUN_COLUMNS,
    end_runs,
    in_range,
    late_finish,
    latest,
    new_run,
    run_values,
    undo_lost,
)
from .crashes import kept_attempts, last_sign_of_life, owner_gone, taken_over

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = ("NEG_INFINITY", "register")

_Row = dict[str, Any]

NEG_INFINITY = datetime.min.replace(tzinfo=UTC)
"""``'-infinity'``: the expiry (and, after an undo, the slot) of a released lease."""
_CLAIM_COLUMNS = (
    "i",
    "ran",
    "paused",
    "got",
    "started_at",
    "stray",
    "gone_slot",
    "gone_holder",
    "gone_expired",
    "gone_since",
    *(f"p_{c}" for c in RUN_COLUMNS),
)


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers: every statement of lease mode's ledger."""
    add = statements.add
    add(lease_claim_many_sql(table), _claim, claim=True)
    add(lease_finish_many_sql(table), _finish)
    add(renew_sql(table), _renew)
    add(lease_recover_sql(table), _recover)
    add(lease_crashed_sql(table), _crashed)
    add(lease_late_finish_sql(table), _late_finish)
    add(lease_holders_sql(table), _holders)
    add(lease_reassert_sql(table), _reassert)
    add(lease_undo_lost_sql(table), _undo_lost)


# -- SQL's values, in Python ----------------------------------------------------------------


def _eq(a: Any, b: Any) -> bool:
    """``a = b`` taken as a condition: NULL (either side ``None``) is not true."""
    return a is not None and b is not None and bool(a == b)


def _unnest(*arrays: Sequence[Any] | None) -> Iterator[tuple[Any, ...]]:
    """``unnest(a, b, ...)``: the arrays side by side, the shorter padded with NULLs (a
    NULL array is an empty one)."""
    return itertools.zip_longest(*(array or () for array in arrays))


def _order(job: str | None) -> tuple[bool, str]:
    """``ORDER BY job``: the ``C`` collation's order, NULLs last."""
    return (job is None, job or "")


def _after(now: datetime, seconds: float | None) -> datetime | None:
    """``clock_timestamp() + $n::float8 * interval '1 second'`` (NULL for a NULL *seconds*)."""
    return None if seconds is None else now + timedelta(seconds=seconds)


def _not_null(table: str, row: _Row, *columns: str) -> None:
    """Refuse a row with NULL in a ``NOT NULL`` column, as the server does."""
    for column in columns:
        if row.get(column) is None:
            raise asyncpg.NotNullViolationError(
                f'null value in column "{column}" of relation "{table}" violates not-null '
                "constraint"
            )


def _take_leases(
    x: Exec, proposed: Iterable[_Row], may_take: Callable[[_Row, _Row], bool]
) -> list[str]:
    """``INSERT INTO leases ... ON CONFLICT (job) DO UPDATE SET slot, holder, expires_at,
    attempt ... WHERE may_take(existing, proposed) RETURNING x.job``, the rows proposed in
    the order given: the jobs whose lease was inserted or updated, in that order. A job
    met again after its row was inserted or updated by this statement is an error."""
    leases = x.db.table("leases")
    touched: set[str] = set()
    taken: list[str] = []
    for row in proposed:
        _not_null("leases", row, "job", "slot", "holder", "expires_at", "attempt")
        job = row["job"]
        current = leases.get(job)
        if job in touched:
            # Two proposed rows of one job, the first inserted or updated already.
            raise asyncpg.CardinalityViolationError(
                "ON CONFLICT DO UPDATE command cannot affect row a second time"
            )
        if current is None:
            x.db.put("leases", job, dict(row))
        elif may_take(current, row):
            x.db.update(
                "leases", job, **{k: row[k] for k in ("slot", "holder", "expires_at", "attempt")}
            )
        else:
            continue
        touched.add(job)
        taken.append(job)
    return taken


# -- the claim, the takeover --------------------------------------------------------------


def _lapsed_of_another(lease: _Row, holder: Any, slot: datetime | None) -> bool:
    """The claims' ``g``: *lease* is another holder's, not released (its expiry is not
    ``-infinity``), for a slot before *slot*."""
    return (
        not _eq(lease["holder"], holder)
        and lease["expires_at"] > NEG_INFINITY
        and slot is not None
        and lease["slot"] < slot
    )


def _claim(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_claim_many_sql``: ``$1`` keys, ``$2`` jobs, ``$3`` slots, ``$4`` host,
    ``$5`` pid, ``$6`` holder, ``$7`` lease seconds."""
    keys, jobs, slots, host, pid, holder, seconds = args
    now, runs, control = x.now, x.db.table("runs"), x.db.table("control")
    # u (claim_inputs): ran, paused, manual; l: free (the xact lock, always granted here).
    claims = []
    for i, (_, job, slot) in enumerate(_unnest(keys, jobs, slots), 1):
        pc = control.get(job)
        # IS [NOT] DISTINCT FROM: Python's == and != on None say the same.
        paused = pc is not None and pc["paused_at"] is not None and pc["trigger_slot"] != slot
        manual = pc is not None and pc["trigger_slot"] == slot
        ran = (job, slot) in runs
        claims.append((i, job, slot, ran, paused, manual))
    # The leases as the statement's snapshot shows them (the final SELECT's g reads them).
    leases = x.db.table("leases")
    seen = {job: leases[job] for _, job, *_ in claims if job in leases}
    # lease: the free rows in job order; a conflict updates only an expired lease or this
    # holder's, and only for another slot.
    expires = _after(now, seconds)
    proposed = (
        {"job": job, "slot": slot, "holder": holder, "expires_at": expires, "attempt": 1}
        for _, job, slot, ran, paused, _ in sorted(claims, key=lambda c: _order(c[1]))
        if not (ran or paused)
    )
    taken = set(
        _take_leases(
            x,
            proposed,
            lambda old, new: (
                (old["expires_at"] <= now or _eq(old["holder"], new["holder"]))
                and old["slot"] != new["slot"]
            ),
        )
    )
    # ins: every l row whose job's lease was taken (joined on the job alone: a ran or
    # paused row of that job too), in job order, ON CONFLICT (job, slot) DO NOTHING.
    started: dict[tuple[Any, Any], datetime] = {}
    for _, job, slot, _, _, manual in sorted(claims, key=lambda c: _order(c[1])):
        if job not in taken or (job, slot) in runs:
            continue
        run = new_run(job, slot, host, pid, max(now, slot), manual=manual, holder=holder)
        _not_null("runs", run, "host", "pid")
        x.db.put("runs", (job, slot), run)
        started[(job, slot)] = run["started_at"]
    answers = []
    for i, job, slot, ran, paused, _ in claims:
        got = job in taken
        at = started.get((job, slot))
        # The told run (only for a row not inserted; this statement's inserts unfinished).
        told = (
            latest(x, job, "last", at_or_before=slot) if at is None and slot is not None else None
        )
        # g: the lease of another holder this granted claim took over, expired unreleased.
        w = seen.get(job) if at is not None else None
        if w is not None and not _lapsed_of_another(w, holder, slot):
            w = None
        gone: tuple[Any, ...] = (None,) * 4
        if w is not None:
            since = _after(w["expires_at"], -seconds if seconds is not None else None)
            gone = (w["slot"], w["holder"], w["expires_at"], since)
        answers.append((i, ran, paused, got, at, got and at is None, *gone, *run_values(told)))
    return rows(_CLAIM_COLUMNS, *answers)


def _recover(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_recover_sql``: ``$1`` key, ``$2`` job, ``$3`` slot, ``$4`` host, ``$5`` pid,
    ``$6`` holder, ``$7`` lease seconds, ``$8`` the attempt claimed."""
    _, job, slot, host, pid, holder, seconds, attempt = args
    now = x.now
    pc = x.db.get("control", job)
    paused = pc is not None and pc["paused_at"] is not None
    taken: list[str] = []
    if not paused:
        proposed = {
            "job": job,
            "slot": slot,
            "holder": holder,
            "expires_at": _after(now, seconds),
            "attempt": attempt,
        }
        taken = _take_leases(x, [proposed], lambda old, new: old["expires_at"] <= now)
    started = None
    run = x.db.get("runs", (job, slot))
    if run is not None and taken and attempt is not None and taken_over(run, attempt):
        x.db.update(
            "runs",
            (job, slot),
            host=host,
            pid=pid,
            session=None,
            holder=holder,
            attempts=kept_attempts(run),
            started_at=now,
            finished_at=None,
            outcome=None,
            error=None,
            attempt=attempt,
            retry_at=None,
        )
        _not_null("runs", x.db.table("runs")[(job, slot)], "host", "pid", "attempt")
        started = now
    got = bool(taken)
    return rows(
        ["ran", "paused", "got", "started_at", "stray"],
        (False, paused, got, started, got and started is None),
    )


# -- renewals, ends, releases ---------------------------------------------------------------


def _renew(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``renew_sql``: ``$1`` jobs, ``$2`` slots, ``$3`` holder, ``$4`` lease seconds."""
    jobs, slots, holder, seconds = args
    leases, now = x.db.table("leases"), x.now
    wanted = set()
    for job, slot in _unnest(jobs, slots):
        lease = leases.get(job)
        if (
            lease is not None
            and _eq(lease["slot"], slot)
            and _eq(lease["holder"], holder)
            and lease["expires_at"] > now
        ):
            wanted.add(job)
    renewed = sorted(wanted)
    for job in renewed:
        x.db.update("leases", job, expires_at=_after(now, seconds))
        _not_null("leases", leases[job], "expires_at")
    return rows(["job"], *((job,) for job in renewed))


def _finish(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_finish_many_sql``: ``$1``-``$9`` as ``claims.finish_many_sql`` (``$5`` keys
    unused), ``$10`` holder. Answers (i, released)."""
    jobs, slots, outcomes, errors, _, undos, host, pid, starteds, holder = args
    ends = list(_unnest(jobs, slots, outcomes, errors, undos, starteds))
    leases, runs = x.db.table("leases"), x.db.table("runs")
    # lk: this holder's leases of the (job, slot) of an end, expired or not.
    locked = {
        job
        for job, slot, *_ in ends
        if (lease := leases.get(job)) is not None
        and _eq(lease["slot"], slot)
        and _eq(lease["holder"], holder)
    }
    # t, del, upd (the ends shared with session mode); del's jobs: rows gone after it.
    there = {(job, slot) for job, slot, *_ in ends if (job, slot) in runs}
    end_runs(x, ends, host, pid)
    deleted = {job for job, slot in there if (job, slot) not in runs}
    # rel: the lease of an undone claim is released for no slot, so that the slot given
    # back can be claimed again (a claim takes no lease whose latest slot is its own).
    for job in sorted(locked):
        changes: dict[str, Any] = {"expires_at": NEG_INFINITY}
        if job in deleted:
            changes["slot"] = NEG_INFINITY
        x.db.update("leases", job, **changes)
    return rows(["i", "released"], *((i, end[0] in locked) for i, end in enumerate(ends, 1)))


def _late_finish(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_late_finish_sql``: ``runs.late_finish_sql``'s ``$1``-``$9`` (the runs'
    late outcomes), and the release of their leases while ``$10``'s (expired or not);
    answers the runs it wrote, as ``late_finish_sql`` does."""
    *late, holder = args
    written = late_finish(x, tuple(late))
    leases = x.db.table("leases")
    for job, slot in _unnest(late[0], late[1]):
        lease = leases.get(job)
        if lease is not None and _eq(lease["slot"], slot) and _eq(lease["holder"], holder):
            x.db.update("leases", job, expires_at=NEG_INFINITY)
    return written


# -- crashes, the holders, a failover ------------------------------------------------------


def _crashed(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_crashed_sql``: ``$1`` host, ``$2`` pid (only checked for NULL), ``$3``
    holder, ``$4`` the members' time to live in seconds."""
    host, pid, holder, ttl = args
    if host is None or pid is None:
        return []
    leases, now = x.db.table("leases"), x.now
    marked = []
    for key, run in sorted(x.db.unfinished().items()):
        if run["finished_at"] is not None or run["session"] is not None:
            continue
        lease = leases.get(run["job"])
        if (
            lease is not None
            and lease["slot"] == run["slot"]
            and (lease["expires_at"] > now or _eq(lease["holder"], holder))
        ):
            continue
        if not owner_gone(x, run, holder, ttl):
            continue
        why = (
            "its lease expired"
            if run["holder"] is None
            else "its lease expired and its membership is gone"
        )
        new = x.db.update(
            "runs",
            key,
            outcome="crashed",
            finished_at=last_sign_of_life(x, run, ttl),
            error=f"its replica ({run['host']}:{run['pid']}) died mid-run: {why}",
        )
        marked.append((new["job"], *run_values(new)))
    return rows(["job", *RUN_COLUMNS], *marked)


def _holders(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_holders_sql``: every unexpired lease (job, holder, slot, host, pid)."""
    runs, now = x.db.table("runs"), x.now
    found = []
    for job, lease in x.db.table("leases").items():
        if lease["expires_at"] > now:
            run = runs.get((job, lease["slot"]))
            found.append(
                (
                    job,
                    lease["holder"],
                    lease["slot"] if in_range(lease["slot"]) else None,
                    None if run is None else run["host"],
                    None if run is None else run["pid"],
                )
            )
    return rows(["job", "holder", "slot", "host", "pid"], *found)


def _reassert(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``failover.lease_reassert_sql``: ``$1`` holder, ``$2`` jobs, ``$3`` slots, ``$4``
    attempts in flight here, ``$5`` lease seconds, ``$6``-``$8`` the runs that ended here."""
    holder, jobs, slots, attempts, seconds, ended_jobs, ended_slots, ended_attempts = args
    now = x.now
    held = list(_unnest(jobs, slots, attempts))
    in_flight = {job for job, _, _ in held if job is not None}
    ended = set(_unnest(ended_jobs, ended_slots, ended_attempts))
    # freed: this holder's live leases of the very runs that ended here, when not in
    # flight here.
    freed = [
        job
        for job, lease in list(x.db.table("leases").items())
        if _eq(lease["holder"], holder)
        and lease["expires_at"] > now
        and job not in in_flight
        and (job, lease["slot"], lease["attempt"]) in ended
    ]
    for job in freed:
        x.db.update("leases", job, expires_at=NEG_INFINITY)
    expires = _after(now, seconds)
    kept = _take_leases(
        x,
        (
            {"job": job, "slot": slot, "holder": holder, "expires_at": expires, "attempt": attempt}
            for job, slot, attempt in sorted(held, key=lambda h: _order(h[0]))
        ),
        lambda old, new: _eq(old["holder"], new["holder"]) or old["expires_at"] <= now,
    )
    return rows(["released", "kept"], (len(freed), kept))


def _undo_lost(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``lease_undo_lost_sql``: delete lost claims of this process, and release the leases
    this holder has for those very slots; how many claims."""
    jobs, slots, host, pid, holder = args
    gone = undo_lost(x, jobs, slots, host, pid, other_session=False)
    for job, slot in gone:
        lease = x.db.get("leases", job)
        if lease is not None and lease["slot"] == slot and lease["holder"] == holder:
            x.db.update("leases", job, expires_at=NEG_INFINITY, slot=NEG_INFINITY)
    return rows(["undone"], (len(gone),))
