"""``python -m cronlock migrate|status|history|pause|resume|trigger``: the run ledger and
fleet control from the command line.

The arguments are declared in :mod:`cronlock._cli_ledger`, which needs no asyncpg.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg

from .._errors import CronlockError
from .._keys import job_lock_key
from ._control import control_sql
from ._ledger import DEFAULT_TABLE, LedgerTable, ledger_state, migrate, to_record

__all__ = ("run_verb",)

# A bigint advisory key k is stored in pg_locks as classid = k >> 32, objid = k & 0xffffffff
# (objsubid = 1); advisory locks are per database, hence the database filter.
_HOLDERS_SQL = """
SELECT (l.classid::int8 << 32) | l.objid::int8 AS key, a.pid, a.application_name,
       host(a.client_addr) AS addr, a.backend_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((l.classid::int8 << 32) | l.objid::int8) = ANY($1::int8[])
"""


def run_verb(args: argparse.Namespace) -> int:
    """Run one of the ledger verbs; errors are raised as :class:`CronlockError`."""
    table = LedgerTable(args.table or DEFAULT_TABLE, args.schema)
    if args.verb == "history" and args.n < 1:
        raise CronlockError(f"-n must be at least 1, got {args.n}")
    return asyncio.run(_run(args, table))


async def _run(args: argparse.Namespace, table: LedgerTable) -> int:
    conn = await _connect(args.dsn)
    try:
        if args.verb == "migrate":
            return await _migrate(conn, table)
        state = await ledger_state(conn, table)
        if state == "missing":
            raise CronlockError(
                f"no run ledger {table.runs} in this database; create it with "
                f"'python -m cronlock migrate --dsn ...' or start a PostgresLocker"
            )
        if state == "old":
            raise CronlockError(
                f"the run ledger {table.runs} was made by an older cronlock; upgrade it with "
                f"'python -m cronlock migrate --dsn ...' or start a PostgresLocker"
            )
        if args.verb == "status":
            return await _status(conn, table, args.jobs, check=args.check)
        if args.verb in ("pause", "resume", "trigger"):
            return await _control(conn, table, args.verb, args.job, force=args.force)
        return await _history(conn, table, args.job, args.n)
    finally:
        await conn.close()


async def _connect(dsn: str) -> Any:
    try:
        return await asyncpg.connect(dsn, timeout=10)
    except Exception as exc:  # bad syntax, refused, auth, unknown database: one clear line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CronlockError(f"cannot connect to PostgreSQL with --dsn: {reason}") from None


async def _migrate(conn: Any, table: LedgerTable) -> int:
    try:
        done = await migrate(conn, table)
    except Exception as exc:
        raise CronlockError(f"could not create the run ledger {table.runs}: {exc}") from None
    print(f"run ledger {table.runs} and {table.jobs}: {done or 'already there'}")
    return 0


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _outcome(row: Any) -> str:
    """A ledger row's outcome as stored (one this version does not know is shown as it is;
    none is ``unfinished``), with the attempt when the run was the rerun of a crashed one."""
    text = row["outcome"] or "unfinished"
    return text if row["attempt"] == 1 else f"{text} (attempt {row['attempt']})"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for line in (header, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def _overdue(row: Any, ok: Any, now: datetime) -> bool:
    """Whether the job of *row* is overdue: the slot its replicas said it is due by (its
    first slot after its latest success) fell due more than its grace ago, and no run of
    it or of a later slot succeeded since. A job whose replicas never said (an older
    cronlock, or paused) is not judged."""
    grace, due = row["grace"], row["due"]
    if grace is None or due is None or (ok is not None and ok["slot"] >= due):
        return False
    return bool((now - due).total_seconds() > grace)


async def _control(conn: Any, table: LedgerTable, verb: str, job: str, *, force: bool) -> int:
    known = {row["job"] for row in await conn.fetch(table.jobs_sql)}
    if job not in known and not force:
        _unknown([job], known)
        print(f"(nothing done; pass --force to {verb} it anyway)", file=sys.stderr)
        return 1
    sql = control_sql(table)[verb]
    who = "cli:" + (await conn.fetchval("SELECT current_user"))
    if verb == "resume":
        await conn.execute(sql, job)
    else:
        await conn.execute(sql, job, who)
    done = {
        "pause": "paused on every replica (until 'resume')",
        "resume": "resumed on every replica, from its next slot",
        "trigger": "triggered: one replica runs it within about a second",
    }[verb]
    print(f"{job}: {done}")
    return 0


async def _status(conn: Any, table: LedgerTable, only: Sequence[str], *, check: bool) -> int:
    jobs = await conn.fetch(table.jobs_sql)
    # A job is known once a replica noted its schedule or claimed a slot of it.
    known = {row["job"]: row for row in jobs}
    unknown: list[str] = []
    if only:
        wanted = list(dict.fromkeys(only))
        unknown = [name for name in wanted if name not in known]
        jobs = [known[name] for name in wanted if name in known]
    names = [row["job"] for row in jobs]
    holders: dict[int, list[Any]] = {}
    for row in await conn.fetch(_HOLDERS_SQL, [job_lock_key(name) for name in names]):
        holders.setdefault(row["key"], []).append(row)
    print(f"run ledger {table.runs}: {len(names)} job(s); times in UTC")
    if not names:
        return _unknown(unknown, known)
    paused = {row["job"] for row in await conn.fetch(control_sql(table)["paused"])}
    now = await conn.fetchval("SELECT clock_timestamp()")
    overdue: list[str] = []
    lines = []
    for row in jobs:
        found = {r["kind"]: r for r in await conn.fetch(table.last_runs_sql, row["job"])}
        ok, failed = found.get("ok"), found.get("failed")
        failure = "-" if failed is None else f"{_when(failed['slot'])} {_outcome(failed)}"
        if row["job"] in paused:
            state = "paused"
        elif _overdue(row, ok, now):
            state = "OVERDUE"
            overdue.append(row["job"])
        else:
            state = "ok" if row["grace"] is not None else "-"
        held = holders.get(job_lock_key(row["job"]), [])
        who = ", ".join(
            f"pid {h['pid']} {h['application_name'] or '?'}"
            + (f" {h['addr']}" if h["addr"] else "")
            for h in held
        )
        lines.append(
            [
                row["job"],
                state,
                row["schedule"] or "-",
                "-" if ok is None else _when(ok["slot"]),
                failure,
                _when(row["next_run"]),
                who or "-",
            ]
        )
    header = ["JOB", "STATE", "SCHEDULE", "LAST SUCCESS", "LAST FAILURE", "NEXT SLOT"]
    _table([*header, "LOCK HELD BY"], lines)
    status = _unknown(unknown, known)
    if check and overdue:
        print(f"overdue: {', '.join(overdue)}")
        return 1
    return status


def _unknown(names: Sequence[str], known: Iterable[str]) -> int:
    """Say on stderr which of *names* the ledger does not know; 1 if any, else 0."""
    for name in names:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"unknown job: {name}{hint}", file=sys.stderr)
    return 1 if names else 0


async def _history(conn: Any, table: LedgerTable, job: str, limit: int) -> int:
    rows = await conn.fetch(table.history_sql, job, limit)
    records = [to_record(row) for row in rows]
    if not records:
        known = {row["job"] for row in await conn.fetch(table.jobs_sql)}
        if job not in known:
            return _unknown([job], known)
        print(f"no runs of {job!r} in {table.runs} yet")  # its schedule is noted
        return 0
    print(f"last {len(records)} run(s) of {job!r}, newest first; times in UTC")
    lines = []
    for row, r in zip(rows, records, strict=True):
        took = (
            "-"
            if r.finished_at is None
            else f"{(r.finished_at - r.started_at).total_seconds():.3f}s"
        )
        lines.append(
            [
                _when(r.slot),
                _outcome(row),
                _when(r.started_at),
                took,
                r.owner or "-",
                r.error or "",
            ]
        )
    _table(["SLOT", "OUTCOME", "STARTED", "TOOK", "OWNER", "ERROR"], lines)
    return 0
