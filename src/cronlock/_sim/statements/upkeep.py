"""Statements of a locker's background duties, in the simulated server: the members
heartbeat and leave, job notes and first-seen reads, job definitions and their conflicts,
the fleet-control poll, the stored schedules a replica syncs (and its problems with them),
the fleet's secrets, the pruning of old rows, the foreign-holder look and the heartbeat of a
lock session (``SELECT 1``).

Each handler does what its statement (named by its builder in ``cronlock.postgres._sql``)
does, at one instant ``x.now``; a statement's CTEs read the snapshot before its own changes,
so a handler decides everything from the rows as they were, then writes. Where the real
statement has no ``ORDER BY`` the answer is in key order (the library does not depend on
it). Text is ordered by code point (``COLLATE "C"``): a database with another collation may
order mixed-case or non-ASCII job names otherwise.

Also here, for the other modules of this folder: the value helpers every handler uses
(:func:`seconds`, :func:`sane`, :func:`timestamp_text`, :func:`jsonb_text`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import asyncpg

from ...postgres._sql import control, definitions, schema, slots, stored, upkeep
from ..rows import Row, rows
from .claims import HIGH, LOW, in_range
from .session import status

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec
    from .registry import Statements

__all__ = (
    "HIGH",
    "LOW",
    "in_range",
    "jsonb_text",
    "jsonb_value",
    "register",
    "sane",
    "seconds",
    "timestamp_text",
    "unnest",
)

_MIN = datetime.min.replace(tzinfo=UTC)  # stands for -infinity (see the brief)
_MAX = datetime.max.replace(tzinfo=UTC)  # stands for infinity
_HOUR = timedelta(hours=1)
_TRIGGER_LATEST = timedelta(minutes=5)  # control._LATEST_TRIGGER


# -- values ---------------------------------------------------------------------------------


def seconds(value: float) -> timedelta:
    """``value::float8 * interval '1 second'``: PostgreSQL multiplies the microseconds and
    rounds half to even (``rint``), as Python's ``round`` does."""
    return timedelta(microseconds=round(1_000_000 * float(value)))


def sane(value: datetime | None) -> datetime | None:
    """``.runs.sane``: *value* when Python can hold it, else NULL."""
    return value if in_range(value) else None


def timestamp_text(value: datetime) -> str:
    """``value::text`` of a ``timestamptz`` in a UTC session (``2026-03-01 09:00:05.3+00``)."""
    if value <= _MIN:
        return "-infinity"
    if value >= _MAX:
        return "infinity"
    value = value.astimezone(UTC)
    text = f"{value.year:04d}-{value:%m-%d %H:%M:%S}"
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "+00"


def jsonb_value(value: Any) -> Any:
    """A ``jsonb`` column's value as Python's JSON value (a row may hold it as JSON text)."""
    return json.loads(value) if isinstance(value, str) else value


def jsonb_text(value: Any) -> str | None:
    """``value::text`` of a ``jsonb`` value: keys by length, then bytes; ``", "`` and ``": "``."""
    value = jsonb_value(value)
    if value is None:
        return None
    return _jsonb(value)


def _jsonb(value: Any) -> str:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_jsonb(value[k])}" for k in keys)
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_jsonb(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def unnest(*arrays: Sequence[Any] | None) -> list[tuple[Any, ...]]:
    """``unnest(a, b, ...)``: the rows of the arrays side by side, the shorter padded with
    NULLs (a NULL array is an empty one)."""
    return list(itertools.zip_longest(*(a or () for a in arrays)))


def _status(verb: str, count: int) -> str:
    # An INSERT's status also names an oid (always 0).
    return status(verb, count) if verb != "INSERT" else status(verb, 0) + f" {count}"


# -- registry -------------------------------------------------------------------------------


def register(statements: Statements, table: LedgerTable) -> None:
    """Add this module's handlers."""
    add = statements.add
    add(upkeep.HEARTBEAT_SQL, lambda x, a: rows(["?column?"], (1,)))
    add(upkeep.heartbeat_sql(table), _heartbeat)
    add(upkeep.leave_sql(table), _leave)
    add(upkeep.note_sql(table), _note)
    add(upkeep.prune_sql(table), _prune)
    add(slots.record_slots_sql(table), _record_slots)
    add(slots.prune_slots_sql(table), _prune_slots)
    add(upkeep.holders_sql(table), _holders)
    add(upkeep.read_secret_sql(table), _read_secret)
    add(upkeep.make_secret_sql(table), _make_secret)
    add(schema.first_seen_sql(table), _first_seen)
    add(definitions.define_sql(table), _define)
    add(definitions.stale_definitions_sql(table), _stale_definitions)
    add(definitions.conflicts_sql(table), _conflicts)
    add(control.poll_sql(table), _poll)
    add(stored.schedule_changes_sql(table), _schedule_changes)
    add(stored.schedule_top_sql(table), _schedule_top)
    add(stored.schedule_window_sql(table), _schedule_window)
    add(stored.schedule_page_sql(table), _schedule_page)
    add(stored.schedule_problem_sql(table), _schedule_problem)
    add(stored.rejected_sql(table), _rejected)


# -- members ----------------------------------------------------------------------------------


def _heartbeat(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``heartbeat_sql``: upsert this member (naming its session and the server's start
    where *own*: session mode), delete rows expired an hour, answer the other live members
    of the fleet (read from the snapshot before those changes)."""
    holder, fleet, ttl, own = args
    now = x.now
    session = x.pid if own else None
    started = x.server.started if own else None
    members = x.db.table("members")
    others = sorted(
        h
        for h, m in members.items()
        if m["fleet"] == fleet and m["expires_at"] > now and h != holder
    )
    # An hour-expired row of this holder is updated by the upsert, not deleted: the
    # DELETE finds it already changed by the same command and skips it.
    for h in [h for h, m in members.items() if m["expires_at"] < now - _HOUR and h != holder]:
        x.db.delete("members", h)
    expires = now + seconds(ttl)
    mine = members.get(holder)
    if mine is None:
        x.db.put(
            "members",
            holder,
            {
                "holder": holder,
                "fleet": fleet,
                "expires_at": expires,
                "since": now,
                "session": session,
                "server_started": started,
            },
        )
    else:
        # A beat that finds its last one over half a time to live ago starts `since` again.
        gap = mine["expires_at"] < now + seconds(float(ttl) / 2)
        since = now if gap else mine["since"]
        x.db.update(
            "members",
            holder,
            fleet=fleet,
            expires_at=expires,
            since=since,
            session=session,
            server_started=started,
        )
    return rows(["holder"], *((h,) for h in others))


def _leave(x: Exec, args: tuple[Any, ...]) -> str:
    """``leave_sql``: delete this member's definitions and its members row."""
    (holder,) = args
    for key in [k for k in x.db.table("definitions") if k[1] == holder]:
        x.db.delete("definitions", key)
    gone = x.db.delete("members", holder) if holder is not None else None
    return _status("DELETE", 0 if gone is None else 1)


# -- job notes --------------------------------------------------------------------------------


def _tags(text: str | None) -> list[str | None]:
    """``ARRAY(SELECT jsonb_array_elements_text(text::jsonb))`` (NULL: an empty array)."""
    if text is None:
        return []
    value = json.loads(text)
    if not isinstance(value, list):
        raise asyncpg.InvalidParameterValueError("cannot extract elements from a scalar")
    return [v if isinstance(v, str) or v is None else _jsonb(v) for v in value]


def _greatest(*values: Any) -> Any:
    """``greatest(...)``: NULLs are ignored; NULL when all are."""
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _note(x: Exec, args: tuple[Any, ...]) -> str:
    """``note_sql``: upsert job notes; a row already up to date is left alone."""
    jobs, schedules, next_runs, who, graces, dues, margin, tags, specs = args
    now = x.now
    written = 0
    done: set[str] = set()
    for job, schedule, next_run, grace, due, tag_text, spec_text in unnest(
        jobs, schedules, next_runs, graces, dues, tags, specs
    ):
        spec = None if spec_text is None else json.loads(spec_text)
        if job is None or schedule is None:
            raise asyncpg.NotNullViolationError(
                'null value in column "job" or "schedule" violates not-null constraint'
            )
        new_until = (
            None
            if grace is None or margin is None
            else _greatest(next_run, now) + seconds(float(grace) + float(margin))
        )
        new_tags = _tags(tag_text)
        old = x.db.get("jobs", job)
        if old is None:
            x.db.put(
                "jobs",
                job,
                {
                    "job": job,
                    "schedule": schedule,
                    "next_run": next_run,
                    "updated_at": now,
                    "updated_by": who,
                    "grace": grace,
                    "due": due,
                    "grace_until": new_until,
                    "first_seen": now,
                    "tags": new_tags,
                    "retired_at": None,
                    "retired_by": None,
                    "spec": spec,
                },
            )
            written += 1
            done.add(job)
            continue
        if job in done:
            raise asyncpg.CardinalityViolationError(
                "ON CONFLICT DO UPDATE command cannot affect row a second time"
            )
        done.add(job)
        kept = (
            old["grace"] is not None
            and old["grace"] > (float("-inf") if grace is None else grace)
            and old["grace_until"] is not None
            and old["grace_until"] > now
        )
        if kept:
            grace_set, until_set = old["grace"], old["grace_until"]
        elif old["grace"] is not None and grace is not None and old["grace"] == grace:
            grace_set, until_set = grace, _greatest(old["grace_until"], new_until)
        else:
            grace_set, until_set = grace, new_until
        changed = (
            old["schedule"] != schedule
            or old["retired_at"] is not None
            or old["next_run"] != next_run
            or old["grace"] != grace_set
            or old["grace_until"] != until_set
            or old["due"] != due
            or old["tags"] != new_tags
            or (spec is not None and old.get("spec") != spec)
        )
        if not changed:
            continue
        x.db.update(
            "jobs",
            job,
            schedule=schedule,
            next_run=next_run,
            updated_at=now,
            updated_by=who,
            grace=grace_set,
            grace_until=until_set,
            due=due,
            tags=new_tags,
            retired_at=None,
            retired_by=None,
            spec=old.get("spec") if spec is None else spec,
        )
        written += 1
    return _status("INSERT", written)


def _first_seen(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``schema.first_seen_sql``: the first-seen instants of the jobs ``$1`` noted."""
    wanted = set(args[0] or ())
    found = [
        (job, row["first_seen"])
        for job, row in sorted(x.db.table("jobs").items())
        if job in wanted and in_range(row["first_seen"])
    ]
    return rows(["job", "first_seen"], *found)


# -- pruning --------------------------------------------------------------------------------


def _prune(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``prune_sql``: delete up to ``$2`` runs older than ``$1`` seconds that are neither
    their job's latest run nor its latest success."""
    retention, limit = args
    cutoff = x.now - seconds(retention)
    runs = x.db.table("runs")
    latest: dict[str, datetime] = {}
    latest_ok: dict[str, datetime] = {}
    for (job, slot), row in runs.items():
        if job not in latest or slot > latest[job]:
            latest[job] = slot
        if row["outcome"] == "succeeded" and (job not in latest_ok or slot > latest_ok[job]):
            latest_ok[job] = slot
    doomed = [
        key
        for key, row in sorted(runs.items())
        if key[1] < cutoff
        and latest[key[0]] > key[1]
        and (row["outcome"] != "succeeded" or latest_ok[key[0]] > key[1])
    ]
    if limit is not None:
        doomed = doomed[: max(int(limit), 0)]
    for key in doomed:
        x.db.delete("runs", key)
    return rows(["count"], (len(doomed),))


# -- slots' fates -----------------------------------------------------------------------------


def _record_slots(x: Exec, args: tuple[Any, ...]) -> str:
    """``record_slots_sql``: insert fate records; a range whose first slot has one stays."""
    jobs, firsts, lasts, fates, reasons, intos, holder = args
    written = 0
    for job, first, last, fate, reason, into in unnest(jobs, firsts, lasts, fates, reasons, intos):
        if job is None or first is None or last is None or fate is None or reason is None:
            raise asyncpg.NotNullViolationError(
                'null value in column of relation "slots" violates not-null constraint'
            )
        if x.db.get("slots", (job, first)) is not None:
            continue
        row = {"job": job, "slot": first, "last_slot": last, "fate": fate, "reason": reason,
               "into_slot": into, "holder": holder, "recorded_at": x.now}  # fmt: skip
        x.db.put("slots", (job, first), row)
        written += 1
    return _status("INSERT", written)


def _prune_slots(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``prune_slots_sql``: delete up to ``$2`` records whose last slot is older than ``$1``
    seconds ago."""
    retention, limit = args
    cutoff = x.now - seconds(retention)
    doomed = [key for key, row in sorted(x.db.table("slots").items()) if row["last_slot"] < cutoff]
    doomed = doomed[: max(int(limit), 0)]
    for key in doomed:
        x.db.delete("slots", key)
    return rows(["count"], (len(doomed),))


# -- definitions ------------------------------------------------------------------------------


def _define(x: Exec, args: tuple[Any, ...]) -> str:
    """``define_sql``: upsert this replica's definitions (rows up to date left alone)."""
    holder, jobs, texts = args
    written = 0
    done: set[str] = set()
    for job, definition in unnest(jobs, texts):
        if job is None or holder is None or definition is None:
            raise asyncpg.NotNullViolationError("null value violates not-null constraint")
        old = x.db.get("definitions", (job, holder))
        if old is not None and job in done:
            raise asyncpg.CardinalityViolationError(
                "ON CONFLICT DO UPDATE command cannot affect row a second time"
            )
        done.add(job)
        if old is not None and old["definition"] == definition:
            continue
        row = {"job": job, "holder": holder, "definition": definition, "noted_at": x.now}
        x.db.put("definitions", (job, holder), row)
        written += 1
    return _status("INSERT", written)


def _stale_definitions(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``stale_definitions_sql``: delete up to ``$2`` rows of replicas no member for
    ``STALE_AFTER`` seconds (written before that), but ``$1``'s own."""
    holder, limit = args
    stale = x.now - seconds(definitions.STALE_AFTER)
    members = x.db.table("members")
    defs = x.db.table("definitions")
    holders = sorted({h for _, h in defs})
    gone = [
        h
        for h in holders
        if h != holder and not (h in members and members[h]["expires_at"] > stale)
    ]
    doomed: list[tuple[str, str]] = []
    for h in gone:
        mine = [key for key in sorted(defs) if key[1] == h and defs[key]["noted_at"] < stale]
        doomed += mine[: int(limit)]
    doomed = doomed[: int(limit)]
    for key in doomed:
        x.db.delete("definitions", key)
    return rows(["count"], (len(doomed),))


def _conflicts(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``conflicts_sql``: the other live replicas' definitions of this replica's jobs that
    differ from its own, among those that may have changed in the last ``$2`` seconds."""
    holder, window, known, limit = args
    now = x.now
    after = now - seconds(window)
    live = {
        h: m["since"]
        for h, m in x.db.table("members").items()
        if m["expires_at"] > now and h != holder
    }
    defs = x.db.table("definitions")
    known_jobs = set(known or ())
    mine_new = {job for (job, h), d in defs.items() if h == holder and d["noted_at"] > after}
    pairs: set[tuple[str, str, str]] = set()
    for (job, h), d in defs.items():
        if h not in live:
            continue
        if d["noted_at"] > after or live[h] > after or job in mine_new or job in known_jobs:
            pairs.add((job, h, d["definition"]))
    found = []
    for job, h, definition in pairs:
        mine = defs.get((job, holder))
        if mine is not None and mine["definition"] != definition:
            found.append((job, h, definition, mine["definition"]))
    found.sort(key=lambda r: (r[0], r[1]))
    return rows(["job", "holder", "definition", "mine"], *found[: int(limit)])


# -- fleet control ----------------------------------------------------------------------------


def _poll(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``control.poll_sql``: paused jobs and pending triggers (``$1``: a trigger's life)."""
    (life,) = args
    now = x.now
    latest = now + _TRIGGER_LATEST
    runs = x.db.table("runs")
    answer = []
    for job, c in sorted(x.db.table("control").items()):
        slot = c["trigger_slot"]
        if c["paused_at"] is None and slot is None:
            continue
        pending = (
            slot
            if slot is not None
            and slot > now - seconds(life)
            and slot <= latest
            and (job, slot) not in runs
            else None
        )
        odd = timestamp_text(slot) if slot is not None and (slot > latest or slot < LOW) else None
        answer.append((job, c["paused_at"] is not None, pending, odd))
    return rows(["job", "paused", "trigger_slot", "odd"], *answer)


# -- stored schedules -------------------------------------------------------------------------

_STORED = ("name", "revision", "removed", "task", "schedule", "kwargs", "options", "updated_at")
_STORED_COLUMNS = (*_STORED, "problems", "paused", "rejected")


def _paused(x: Exec, name: str) -> bool:
    c = x.db.get("control", name)
    return c is not None and c["paused_at"] is not None


def _stored_row(
    s: dict[str, Any], problems: str | None, paused: bool, rejected: bool
) -> tuple[Any, ...]:
    return (
        s["name"],
        s["revision"],
        s["removed"],
        s["task"],
        jsonb_text(s["schedule"]),
        jsonb_text(s["kwargs"]),
        jsonb_text(s["options"]),
        sane(s["updated_at"]),
        problems,
        paused,
        rejected,
    )


def _as_stored(x: Exec, s: dict[str, Any]) -> tuple[Any, ...]:
    """A row of a sync's read (``stored._COLUMNS``, pause, ``false AS rejected``)."""
    current = s["problem_revision"] == s["revision"] and s["problems"] is not None
    problems = jsonb_text(s["problems"]) if current else None
    return _stored_row(s, problems, _paused(x, s["name"]), False)


def _schedule_changes(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``schedule_changes_sql``: the first ``$2`` changes after revision ``$1``."""
    since, limit = args
    found = [
        s
        for s in x.db.table("schedules").values()
        if s["revision"] > since and (not s["removed"] or since > 0)
    ]
    found.sort(key=lambda s: (s["revision"], s["name"]))
    if limit is not None:
        found = found[: int(limit)]
    return rows(_STORED_COLUMNS, *(_as_stored(x, s) for s in found))


def _schedule_top(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``schedule_top_sql``: the latest revision (NULL: none)."""
    revisions = [s["revision"] for s in x.db.table("schedules").values()]
    return rows(["max"], (max(revisions) if revisions else None,))


def _schedule_window(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``schedule_window_sql``: the name ``$2`` names after ``$1``."""
    after, skip = args
    names = sorted(n for n in x.db.table("schedules") if after is not None and n > after)
    skip = int(skip)
    return rows(["name"], (names[skip],)) if 0 <= skip < len(names) else []


def _schedule_page(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``schedule_page_sql``: the changes in (``$1``, ``$2``] named in (``$3``, ``$4``]."""
    since, upto, after, to = args
    found = [
        s
        for name, s in sorted(x.db.table("schedules").items())
        if after is not None
        and name > after
        and (to is None or name <= to)
        and since < s["revision"] <= upto
        and (not s["removed"] or since > 0)
    ]
    return rows(_STORED_COLUMNS, *(_as_stored(x, s) for s in found))


def _schedule_problem(x: Exec, args: tuple[Any, ...]) -> str:
    """``schedule_problem_sql``: note a replica's problem with a revision."""
    name, revision, problem, who = args
    s = x.db.get("schedules", name)
    if s is None or s["revision"] != revision:
        return _status("UPDATE", 0)
    if who is None:  # jsonb_build_object with a NULL key fails
        raise asyncpg.NullValueNotAllowedError("argument 1: key must not be null")
    base = jsonb_value(s["problems"]) if s["problem_revision"] == revision else None
    if base is None:
        base = {}
    if not isinstance(base, dict):
        raise asyncpg.InvalidParameterValueError("invalid concatenation of jsonb objects")
    x.db.update("schedules", name, problems={**base, who: problem}, problem_revision=revision)
    return _status("UPDATE", 1)


def _rejected(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``stored.rejected_sql``: the schedules every live member reported a problem with."""
    now = x.now
    holders = [h for h, m in x.db.table("members").items() if m["expires_at"] > now]
    found = []
    for name, s in sorted(x.db.table("schedules").items()):
        problems = jsonb_value(s["problems"])
        if s["removed"] or s["problem_revision"] != s["revision"]:
            continue
        if not (isinstance(problems, dict) and holders and all(h in problems for h in holders)):
            continue
        live = {k: v for k, v in problems.items() if k in holders}
        found.append(_stored_row(s, jsonb_text(live), _paused(x, name), True))
    return rows(_STORED_COLUMNS, *found)


# -- secrets ----------------------------------------------------------------------------------


def _read_secret(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``read_secret_sql``: the secret's value (no row: none made yet)."""
    row = x.db.get("secrets", args[0])
    return [] if row is None else rows(["value"], (row["value"],))


def _make_secret(x: Exec, args: tuple[Any, ...]) -> str:
    """``make_secret_sql``: make the secret unless it exists."""
    name, value = args
    if x.db.get("secrets", name) is not None:
        return _status("INSERT", 0)
    if name is None or value is None:
        raise asyncpg.NotNullViolationError("null value violates not-null constraint")
    x.db.put("secrets", name, {"name": name, "value": bytes(value), "created_at": x.now})
    return _status("INSERT", 1)


# -- the foreign holder ------------------------------------------------------------------------


def _holders(x: Exec, args: tuple[Any, ...]) -> list[Row]:
    """``holders_sql``: the other sessions holding key ``$1`` that run no slot of job
    ``$2`` (no unfinished run of theirs), while no live lease of the job stands. The
    simulated sessions have no address (a local socket) and no role name."""
    key, job = args
    now = x.now
    lease = x.db.get("leases", job)
    if lease is not None and lease["expires_at"] > now:
        return []
    running = {
        r["session"]
        for (j, _), r in x.db.unfinished().items()  # (runs whose finished_at is NULL)
        if j == job and r["session"] is not None
    }
    held = x.server.locks.get(key)
    if held is None:
        return []
    pid = held[0]
    session = x.server.sessions.get(pid)
    if session is None or pid == x.pid or pid in running:
        return []
    return rows(["pid", "app", "addr", "role"], (pid, session.application_name or "", None, ""))
