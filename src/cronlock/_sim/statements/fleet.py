"""The operators' reads of the fleet, in the simulated server: what ``python -m cronlock
status`` (``postgres/_ops/cli.py``, ``_ops/fleet.py``) sends to judge every job.

The job notes and runs the status reads (``_sql/fleet.jobs_sql``, ``named_jobs_sql``), the
jobs in conflict (``_sql/definitions.conflicted_sql``), the sessions holding advisory
locks (``_sql/fleet.HOLDERS_SQL``), the paused jobs (``_sql/control.paused_sql``), the
stored schedules it lists (``_sql/stored.list_schedules_sql``), and the catalog probes it
makes first (``_sql/schema``: whether a table exists, whether it may be read). Its other
statements are answered elsewhere: the latest runs (:mod:`.claims`), the lease holders
(:mod:`.leases`), the secret and the rejected schedules (:mod:`.upkeep`), the server's
clock and the ledger's state (:mod:`.session`).

In the model the ledger's tables are the only tables, all of them exist and are current,
and its one role may read them all. A session has no client address (as over a Unix
socket) and no start time kept (``backend_start``: NULL; the library does not read it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...postgres._sql import control, definitions, fleet, schema, stored
from ..rows import Row, rows
from .upkeep import HIGH, LOW, jsonb_text, jsonb_value, sane, timestamp_text
from .upkeep import _paused as paused_fleet_wide
from .upkeep import _stored_row as stored_row

if TYPE_CHECKING:
    from datetime import datetime

    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = ("register",)

_JOB_COLUMNS = (
    *("job", "schedule", "tags", "next_run", "updated_at", "grace", "due", "odd"),
    "spec",
)
_STORED_COLUMNS = (
    *("name", "revision", "removed", "task", "schedule", "kwargs", "options", "updated_at"),
    *("problems", "paused", "rejected"),
)


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers."""
    add = statements.add
    tables = {
        getattr(table, name)
        for name in (
            *("runs", "jobs", "control", "leases", "members", "secrets", "schedules"),
            "definitions",
        )
    }

    def exists(name: object) -> bool:
        # to_regclass(name) IS NOT NULL: only the ledger's tables exist in the model.
        return name in tables

    add(schema.TABLE_EXISTS_SQL, lambda x, a: rows(["?column?"], (exists(a[0]),)))
    # Its two columns are both named "?column?" by the server; a Row holds a name once, and
    # the library reads them by position.
    add(
        schema.TABLES_EXIST_SQL,
        lambda x, a: rows(["?column?", "?column?2"], (exists(a[0]), exists(a[1]))),
    )
    # Readable: the model's one role may read every table.
    add(
        schema.READABLE_TABLE_SQL,
        lambda x, a: rows(["case", "?column?"], (exists(a[0]), exists(a[1]))),
    )
    add(fleet.jobs_sql(table), _jobs)
    add(fleet.named_jobs_sql(table), _named_jobs)
    add(definitions.conflicted_sql(table), _conflicted)
    add(definitions.conflicted_sql(table, named=True), _conflicted)
    add(fleet.HOLDERS_SQL, _lock_holders)
    add(control.paused_sql(table), _paused)
    add(stored.list_schedules_sql(table), _list_schedules)


# -- job notes ----------------------------------------------------------------------------------


def _odd(note: dict[str, Any] | None) -> str | None:
    """``odd_list``: each of the note's instants out of range, with its text; NULL: none."""
    if note is None:
        return None
    parts = [
        f"{column}={timestamp_text(value)}"
        for column in ("next_run", "updated_at", "due")
        if (value := note[column]) is not None and not LOW <= value <= HIGH
    ]
    return ", ".join(parts) or None


def _job_row(name: str, note: dict[str, Any] | None) -> tuple[Any, ...]:
    """A row of ``jobs_sql``: the job's note (all NULL without one), its instants guarded."""
    if note is None:
        return (name, None, None, None, None, None, None, None, None)
    return (
        name,
        note["schedule"],
        None if note["tags"] is None else list(note["tags"]),
        sane(note["next_run"]),
        sane(note["updated_at"]),
        note["grace"],
        sane(note["due"]),
        _odd(note),
        None if note.get("spec") is None else jsonb_text(note["spec"]),
    )


def _jobs(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``jobs_sql``: every job with a note or a run (a note's retirement leaves it out,
    runs or not), by name."""
    notes = x.db.table("jobs")
    names = set(notes) | {job for job, _ in x.db.table("runs")}
    found = []
    for name in sorted(names):
        note = notes.get(name)
        if note is not None and note["retired_at"] is not None:
            continue
        found.append(_job_row(name, note))
    return rows(_JOB_COLUMNS, *found)


def _named_jobs(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``named_jobs_sql``: each name of ``$1`` (repeats too) with a note or a run, but for
    a retired note, in the order given."""
    notes = x.db.table("jobs")
    ran = {job for job, _ in x.db.table("runs")}
    found = []
    for name in args[0] or ():
        note = notes.get(name)
        if note is None and name not in ran:
            continue
        if note is not None and note["retired_at"] is not None:
            continue
        found.append(_job_row(name, note))
    return rows(_JOB_COLUMNS, *found)


# -- conflicts, holders, pauses -------------------------------------------------------------------


def _conflicted(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``conflicted_sql``: the jobs (of ``$1``, when named) whose live replicas' definitions
    differ, and how many live replicas define each."""
    now = x.now
    named = None if not args else set(args[0] or ())
    live = {h for h, m in x.db.table("members").items() if m["expires_at"] > now}
    given: dict[str, list[str]] = {}
    for (job, holder), d in x.db.table("definitions").items():
        if holder in live and (named is None or job in named):
            given.setdefault(job, []).append(d["definition"])
    return rows(
        ["job", "writers"],
        *((job, len(texts)) for job, texts in sorted(given.items()) if len(set(texts)) > 1),
    )


def _lock_holders(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``HOLDERS_SQL``: every advisory lock held, with its session's pid and name."""
    server = x.server
    found = []
    for key, (pid, _count) in sorted(server.locks.items()):
        session = server.sessions.get(pid)
        name = "" if session is None else session.application_name
        found.append((key, pid, name, None, None))
    return rows(["key", "pid", "application_name", "addr", "backend_start"], *found)


def _paused(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``paused_sql``: the jobs paused fleet-wide, by name."""
    control_rows = x.db.table("control")
    return rows(
        ["job"], *((job,) for job in sorted(control_rows) if control_rows[job]["paused_at"])
    )


# -- stored schedules ------------------------------------------------------------------------------


def _list_schedules(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``list_schedules_sql``: every stored schedule but the tombstones, by name, with the
    problems its live reporters have with its revision and whether all of them do."""
    now: datetime = x.now
    holders = [h for h, m in x.db.table("members").items() if m["expires_at"] > now]
    found = []
    for name, s in sorted(x.db.table("schedules").items()):
        if s["removed"]:
            continue
        problems = jsonb_value(s["problems"])
        current = s["problem_revision"] is not None and s["problem_revision"] == s["revision"]
        shown: str | None = None
        if current and problems is not None and not isinstance(problems, dict):
            shown = jsonb_text(problems)  # not an object: passed on as it is
        elif current and isinstance(problems, dict):
            live = {k: v for k, v in problems.items() if k in holders}
            shown = jsonb_text(live) if live else None
        rejected = (
            current
            and isinstance(problems, dict)
            and bool(holders)
            and all(h in problems for h in holders)
        )
        found.append(stored_row(s, shown, paused_fleet_wide(x, name), rejected))
    return rows(_STORED_COLUMNS, *found)
