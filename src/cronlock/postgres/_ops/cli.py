"""``python -m cronlock migrate|status|history|pause|resume|trigger``: the run ledger and
fleet control from the command line (``schedules``: :mod:`._cli_schedules`).

The arguments are declared in :mod:`cronlock._cli.ledger`, which needs no asyncpg.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import sys
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TextIO

from ..._dsn import answered, connect_failure, target_of
from ..._errors import (
    CronlockError,
    JobConflictError,
    JobLookupError,
    LedgerUnreadable,
    LockerMisconfigured,
    LockError,
    ScheduleRejectedError,
)
from ..._fates import FATES
from ..._names import unknown_job
from ..._records import RunRecord
from ..._terminal import printable
from .._conn.errors import backend_failure, ledger_missing, permission_denied
from .._sql.control import pause_sql, resume_sql, trigger_sql
from .._sql.fleet import jobs_sql
from .._sql.grants import Role, missing_privileges
from .._sql.schema import CURRENT_USER_SQL, ledger_state, migrate
from .._sql.tables import DEFAULT_TABLE, LedgerTable
from .control import refuse_unknown, retire_job
from .fleet import (
    STATUSES,
    FleetJob,
    Status,
    job_status,
    read_jobs,
    read_paused,
    read_runs,
    server_now,
)
from .rejected import refuse_rejected
from .slots import SlotsUnknown, read_slots

__all__ = ("run_verb",)


def run_verb(args: argparse.Namespace) -> int:
    """Run one of the ledger verbs; errors are raised as :class:`CronlockError`."""
    table = LedgerTable(args.table or DEFAULT_TABLE, args.schema)
    if args.verb == "history" and args.n < 1:
        raise CronlockError(f"-n must be at least 1, got {args.n}")
    if args.verb == "status":
        args.states = _states(args.state or [])
    if args.verb == "schedules":
        from .cli_schedules import run_schedules

        return asyncio.run(_guarded(args, table, run_schedules(args, table)))
    return asyncio.run(_guarded(args, table, _run(args, table)))


def _role_of(args: argparse.Namespace) -> Role | None:
    """Whose grants (:mod:`.._sql.grants`) the verb needs; ``None``: the ledger owner's."""
    if args.verb == "migrate":
        return None
    if args.verb in ("status", "history") or (args.verb == "schedules" and args.action == "list"):
        return "reader"
    return "operator"


async def _guarded(args: argparse.Namespace, table: LedgerTable, verb: Awaitable[int]) -> int:
    """Run *verb*; an error that says the ledger cannot be used (a privilege, a missing
    ledger, a server gone) becomes one :class:`LedgerUnreadable` line, exit status 3."""
    try:
        return await verb
    except Exception as exc:
        if isinstance(exc, LedgerUnreadable) or not (
            isinstance(exc, CronlockError) or backend_failure(exc)
        ):
            raise
        problem = await _unusable(args, table, exc)
        if problem is None:
            raise
        raise LedgerUnreadable(problem) from None


async def _unusable(args: argparse.Namespace, table: LedgerTable, exc: BaseException) -> str | None:
    """Why *exc* says the ledger cannot be used, or ``None`` (an input refused, say)."""
    for cause in (exc, exc.__cause__):
        if isinstance(cause, LockerMisconfigured):
            return str(cause)  # names the fix (a privilege to grant, the migration to run)
    if permission_denied(exc):
        return await _denied(args, table, exc)
    if ledger_missing(exc):
        return (
            f"the run ledger {table.runs} is missing or older than this cronlock ({exc}); "
            "create or upgrade it with 'python -m cronlock migrate --dsn ...'"
        )
    if isinstance(exc, LockError) or backend_failure(exc):
        return f"the server failed or went away: {exc}"
    return None


async def _denied(args: argparse.Namespace, table: LedgerTable, exc: BaseException) -> str:
    """A privilege error, with the grants of the verb's role that the role lacks (read on a
    connection of its own: the verb's may be gone)."""
    cause = exc if exc.__cause__ is None else exc.__cause__
    said = f"the server refused: {cause}"
    role = _role_of(args)
    if role is None:
        return said
    try:
        conn = await _connect(args.dsn, args.dsn_source)
        try:
            user = await conn.fetchval(CURRENT_USER_SQL)
            missing = await missing_privileges(conn, table, role)
        finally:
            await conn.close()
    except Exception:  # the server went away meanwhile: what it said is all we know
        return said
    if not missing:
        return said
    return (
        f"{said}; {args.verb} needs the {role}'s grants, and role {user} lacks "
        f"{'; '.join(missing)}: grant them ('python -m cronlock grants' prints each role's)"
    )


def _states(given: Sequence[str]) -> frozenset[Status]:
    """The states ``--state`` names (comma-separated, repeatable); empty: every state."""
    wanted: set[Status] = set()
    for name in (part.strip() for text in given for part in text.split(",")):
        if name not in STATUSES:
            close = difflib.get_close_matches(name, STATUSES, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise CronlockError(
                f"unknown state for --state: {name!r}{hint}; valid: {', '.join(STATUSES)}"
            )
        wanted.add(name)
    return frozenset(wanted)


async def _run(args: argparse.Namespace, table: LedgerTable) -> int:
    conn = await _connect(args.dsn, args.dsn_source)
    try:
        if args.verb == "migrate":
            return await _migrate(conn, table)
        state = await ledger_state(conn, table)
        if state == "missing":
            raise LedgerUnreadable(
                f"no run ledger {table.runs} in this database; create it with "
                f"'python -m cronlock migrate --dsn ...' or start a PostgresLocker"
            )
        if state == "old":
            raise LedgerUnreadable(
                f"the run ledger {table.runs} was made by an older cronlock; upgrade it with "
                f"'python -m cronlock migrate --dsn ...' or start a PostgresLocker"
            )
        if args.verb == "status":
            return await _status(
                conn,
                table,
                args.jobs,
                args.states,
                check=args.check,
                allow_absent=args.allow_absent,
            )
        if args.verb == "retire":
            return await _retire(conn, table, args.job, force=args.force)
        if args.verb in ("pause", "resume", "trigger"):
            return await _control(conn, table, args.verb, args.job, force=args.force)
        if args.slots:
            return await _slots(conn, table, args)
        return await _history(conn, table, args.job, args.n)
    finally:
        await conn.close()


async def _connect(dsn: str | None, source: str) -> Any:
    import asyncpg  # at the first connect, as everywhere in cronlock.postgres

    try:
        # No named prepared statements: the command line works through a transaction pooler.
        # No DSN: asyncpg reads libpq's environment (PGHOST, PGUSER, PGPASSWORD, ...).
        return await asyncpg.connect(dsn, timeout=10, statement_cache_size=0)
    except Exception as exc:  # bad syntax, refused, auth, unknown database: one clear line
        reason = connect_failure(dsn, exc)  # never the password a parse error may quote
        # A server or network's answer: exit status 3; a DSN asyncpg refused: 2 (usage).
        kind = LedgerUnreadable if target_of(dsn).clean and answered(exc) else CronlockError
        raise kind(f"cannot connect to PostgreSQL with {source}: {reason}") from None


async def _migrate(conn: Any, table: LedgerTable) -> int:
    try:
        done = await migrate(conn, table)
    except Exception as exc:
        raise LedgerUnreadable(f"could not create the run ledger {table.runs}: {exc}") from None
    _print(f"run ledger {table.runs} and {table.jobs}: {done or 'already there'}")
    return 0


def _when(value: datetime | None) -> str:
    if value is None:
        return "-"
    if value.tzinfo is None:  # how asyncpg reads a timestamptz of +-infinity: naive
        return "infinity" if value.year == 9999 else "-infinity"
    try:
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    except (ValueError, OverflowError):  # an aware instant UTC cannot hold (year 0)
        return value.isoformat()


def _took(started: datetime, finished: datetime | None) -> str:
    if finished is None:
        return "-"
    try:
        return f"{(finished - started).total_seconds():.3f}s"
    except (TypeError, OverflowError):  # +-infinity at one end (see _when)
        return "?"


def _judge(job: FleetJob, now: datetime, *, paused: bool) -> Status:
    """:func:`job_status`, for any row: a due slot that cannot be compared with *now*
    (``infinity``, read as a naive datetime) is not judged, like a job whose replicas
    never said (the health probe must not fail on one odd row)."""
    try:
        return job_status(job, now, paused=paused)
    except (TypeError, ValueError, OverflowError):
        return job_status(replace(job, grace=None, due=None), now, paused=paused)


def _outcome(record: RunRecord, *, tried: bool = False) -> str:
    """A run's outcome, with the attempt when the run was a retry or the rerun of a crashed
    one, or when *tried* (its slot was tried more than once), and ``manual`` when a
    fleet-wide trigger asked for it."""
    notes = [f"attempt {record.attempt}"] if record.attempt > 1 or tried else []
    notes += ["manual"] if record.manual else []
    return f"{record.outcome} ({', '.join(notes)})" if notes else record.outcome


def _print(*values: object, file: TextIO | None = None) -> None:
    """print(), with whatever a terminal would act on escaped (:mod:`cronlock._terminal`):
    every line shows ledger text (job names, errors, hosts, application names)."""
    print(printable(" ".join(str(value) for value in values)), file=file)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    rows = [[printable(cell) for cell in row] for row in rows]  # escaped, then measured
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        _print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


async def _control(conn: Any, table: LedgerTable, verb: str, job: str, *, force: bool) -> int:
    if not force:
        try:
            if verb == "trigger":  # no replica would take it (FleetControl's rule too)
                await refuse_rejected(conn, table, job)
            await refuse_unknown(conn, table, job)  # FleetControl's rule and message
        except (JobLookupError, ScheduleRejectedError) as exc:
            _print(exc, file=sys.stderr)
            _print(f"(nothing done; pass --force to {verb} it anyway)", file=sys.stderr)
            return 1
    sql = {"pause": pause_sql, "resume": resume_sql, "trigger": trigger_sql}[verb](table)
    who = "cli:" + (await conn.fetchval(CURRENT_USER_SQL))
    if verb == "resume":
        await conn.execute(sql, job)
    else:
        await conn.execute(sql, job, who)
    done = {
        "pause": "paused on every replica (until 'resume')",
        "resume": "resumed on every replica, from its next slot",
        "trigger": "triggered: one replica runs it within about a second",
    }[verb]
    _print(f"{job}: {done}")
    return 0


_FAILS_CHECK: frozenset[Status] = frozenset({"overdue", "absent", "rejected"})
"""The states ``status --check`` fails on (absent unless ``--allow-absent``). Not
conflict: a rolling deploy that changes a job shows it while old and new replicas
overlap (the alert ``CronlockJobConflict`` fires once it lasts); a job in conflict fails
the check when it would fail it without the conflict (it is overdue, say)."""


async def _retire(conn: Any, table: LedgerTable, job: str, *, force: bool) -> int:
    who = "cli:" + (await conn.fetchval(CURRENT_USER_SQL))
    try:
        await retire_job(conn, table, job, who, force=force)
    except (JobLookupError, JobConflictError) as exc:
        _print(exc, file=sys.stderr)
        return 1
    _print(f"{job}: retired: left out of status and the dashboard until a replica runs it again")
    return 0


async def _status(
    conn: Any,
    table: LedgerTable,
    only: Sequence[str],
    states: frozenset[Status],
    *,
    check: bool,
    allow_absent: bool = False,
) -> int:
    # A job is known once a replica noted its schedule or claimed a slot of it.
    jobs = await read_jobs(conn, table, list(only) if only else None)
    unknown: list[str] = []
    known: list[str] = [job.name for job in jobs]
    if only:
        known = [row["job"] for row in await conn.fetch(jobs_sql(table))]
        known += [job.name for job in jobs if job.rejected]  # perhaps never noted
        unknown = [name for name in dict.fromkeys(only) if name not in known]
    paused = await read_paused(conn, table) if jobs else set()
    now = await server_now(conn)
    # The dashboard's rule (job_status), so the page and the command line never disagree.
    judged = [(job, _judge(job, now, paused=job.name in paused)) for job in jobs]
    # --check judges every job asked for, whatever --state shows: its meaning stays one rule.
    failing = _FAILS_CHECK - ({"absent"} if allow_absent else set())
    # A job in conflict (not paused: that comes first) is judged as it would be without.
    beneath = [
        (job, _judge(replace(job, conflict=False), now, paused=False) if s == "conflict" else s)
        for job, s in judged
    ]
    bad = [(job.name, state) for job, state in beneath if state in failing]
    shown = [(job, state) for job, state in judged if not states or state in states]
    filtered = ""
    if states:
        wanted = ", ".join(state for state in STATUSES if state in states)
        filtered = f", {len(shown)} {wanted}"
    _print(f"run ledger {table.runs}: {len(jobs)} job(s){filtered}; times in UTC")
    lines = []
    for job, state in shown:
        ok, failed = job.last_success, job.last_failure
        failure = "-" if failed is None else f"{_when(failed.slot)} {_outcome(failed)}"
        lines.append(
            [
                job.name,
                state,
                job.schedule or "-",
                "-" if ok is None else _when(ok.slot),
                failure,
                _when(job.next_run),
                ", ".join(h.describe() for h in job.holders) or "-",
            ]
        )
    if lines:
        header = ["JOB", "STATE", "SCHEDULE", "LAST SUCCESS", "LAST FAILURE", "NEXT SLOT"]
        _table([*header, "LOCK HELD BY"], lines)
    await _stored_problems(conn, table, only)
    status = _unknown(unknown, known)
    if check and bad:
        for state in STATUSES:
            named = [name for name, said in bad if said == state]
            if named:
                _print(f"{state}: {', '.join(named)}")
        return 1
    return status


async def _stored_problems(conn: Any, table: LedgerTable, only: Sequence[str]) -> None:
    """Say which stored schedules a replica could not register (``schedules list`` has
    the rest of them)."""
    from .._sql.stored import decode_stored, list_schedules_sql

    rows = await conn.fetch(list_schedules_sql(table))
    found = [s for row in rows if (s := decode_stored(row, table=table.schedules)) is not None]
    for stored in found:
        if stored.problem is not None and (not only or stored.name in only):
            _print(f"stored schedule {stored.name} (revision {stored.revision}): {stored.problem}")


def _unknown(names: Sequence[str], known: Iterable[str]) -> int:
    """Say on stderr which of *names* the ledger does not know; 1 if any, else 0."""
    for name in names:
        _print(unknown_job(name, known), file=sys.stderr)
    return 1 if names else 0


async def _slots(conn: Any, table: LedgerTable, args: argparse.Namespace) -> int:
    """``history JOB --slots``: each slot of the window and its fate (:mod:`.slots`)."""
    try:
        found = await read_slots(conn, table, args.job, args.since, args.until)
    except SlotsUnknown as exc:  # the job is known, its slots are not: as an unknown job
        _print(f"cronlock: {exc}", file=sys.stderr)
        return 1
    if found is None:
        known = {row["job"] for row in await conn.fetch(jobs_sql(table))}
        return _unknown([args.job], known)
    entries, still_open = found
    if args.json:
        print(json.dumps([entry.as_json() for entry in entries], indent=1))
        return 0
    counts = {fate: sum(1 for e in entries if e.fate == fate) for fate in FATES}
    summary = ", ".join(f"{n} {fate.replace('_', ' ')}" for fate, n in counts.items())
    pending = f"; {still_open} more may still run" if still_open else ""
    _print(f"{len(entries)} slot(s) of {args.job!r}, oldest first: {summary}{pending}")
    _table(
        ["SLOT", "FATE", "OUTCOME", "STARTED", "BY", "WHY"],
        [
            [
                _when(e.slot),
                e.fate if e.into is None else f"{e.fate} into {_when(e.into)}",
                e.outcome or "-",
                _when(e.started_at),
                e.by or "-",
                e.reason,
            ]
            for e in entries
        ],
    )
    return 0


async def _history(conn: Any, table: LedgerTable, job: str, limit: int) -> int:
    records = await read_runs(conn, table, job, limit)
    if not records:
        known = {row["job"] for row in await conn.fetch(jobs_sql(table))}
        if job not in known:
            return _unknown([job], known)
        _print(f"no runs of {job!r} in {table.runs} yet")  # its schedule is noted
        return 0
    _print(f"last {len(records)} run(s) of {job!r}, newest first; times in UTC")
    lines = []
    for record in records:
        # A retried slot's every attempt, one line each, its latest first (newest first).
        tried = bool(record.attempts)
        for r in (record, *reversed(record.attempts)):
            took = _took(r.started_at, r.finished_at)
            outcome = _outcome(r, tried=tried)
            lines.append(
                [_when(r.slot), outcome, _when(r.started_at), took, r.owner or "-", r.error or ""]
            )
    _table(["SLOT", "OUTCOME", "STARTED", "TOOK", "OWNER", "ERROR"], lines)
    return 0
