"""The fleet at a glance: every job the ledger knows, its tags and its status, in one read.

What the dashboard's summary, filter and ordering need of each of thousands of jobs, and
no more: the facts :func:`._fleet.status_of` judges (its overdue grace and due slot, the
outcome of its latest finished run, the slot of its latest success). Two statements,
whatever the number of jobs (``_sql/fleet.py``): ``roster_sql``, one probe of the runs'
primary key a noted job, which settles most of them (those come back as names grouped by
outcome), then ``asked_sql`` for the rest (a job that may be overdue, is running or is
unreadable, and the jobs that have runs but no note); the lock holders
(:func:`._fleet.held_locks`); the jobs in conflict (:func:`._fleet.read_conflicts`); and
the stored schedules every live replica rejected (:func:`.rejected.read_rejected`, one
statement). The runs of a page of jobs are then read in full by :func:`._fleet.read_jobs`,
for those jobs only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._sql.fleet import asked_sql, roster_sql
from .._sql.tables import LedgerTable
from .fleet import (
    LockHolder,
    Status,
    absent,
    held_locks,
    overdue_slot,
    read_conflicts,
    status_of,
)
from .rejected import read_rejected

__all__ = ("Roster", "read_roster")


@dataclass(frozen=True, slots=True)
class Roster:
    """The fleet at a glance: every job's status, who holds which lock, and which jobs have
    the tags asked for."""

    statuses: dict[str, Status]
    """Every job the ledger knows, in no order, and its status."""
    tagged: frozenset[str] | None
    """The jobs with every tag asked for (``None``: none was asked for)."""
    holders: dict[str, tuple[LockHolder, ...]]
    """Who holds the lock of each job held right now (:func:`._fleet.held_locks`)."""
    conflicts: frozenset[str] = frozenset()
    """The jobs live replicas define otherwise (:func:`._fleet.read_conflicts`)."""
    rejected: frozenset[str] = frozenset()
    """The stored schedules every live replica rejected (:func:`.rejected.read_rejected`)."""


async def read_roster(
    conn: Any,
    table: LedgerTable,
    paused: frozenset[str],
    now: datetime,
    *,
    tags: Sequence[str] = (),
) -> Roster:
    """Every job the ledger knows, each judged at *now* (server time) with *paused* (the
    jobs paused fleet-wide), and which of them have every one of *tags*: the same
    statements however many jobs (see the module).

    Run it in one snapshot (a repeatable-read transaction: its statements must see the
    same notes and runs) with JIT off (``SET LOCAL jit = off``): its plan's estimates are
    those of thousands of index probes, which JIT compiles for longer than they take.
    """
    # name: [grace, due, next slot, its latest finished run's outcome, its latest
    # success's slot, how its slots are rebuilt]
    facts: dict[str, list[Any]] = {}
    asked: list[str] = []
    gaps: list[tuple[str | None, str | None]] = []
    plain: list[tuple[str, list[str]]] = []  # (outcome, names): see roster_sql
    tagged: set[str] = set()
    rows = await conn.fetch(roster_sql(table), now, list(tags))
    for row in rows:
        name, has_tags, grace, due, nxt, last, below, mine, gap, done, outcome, slot = row[:12]
        retired, spec, settled, names = row[12:]
        if names is not None:
            plain.append((settled, names))
            if has_tags and tags:
                tagged.update(names)
            continue
        if retired:  # left out; the runs-only jobs after it are not
            if last or gap:
                gaps.append((name, below))
            continue
        facts[name] = known = [grace, due, nxt, None, None, spec]
        if has_tags:
            tagged.add(name)
        if last or gap:  # the last note's runs are not probed; or a gap
            gaps.append((name, below))
            asked.append(name)
        elif mine and done:
            known[3] = outcome
            if outcome == "succeeded":
                known[4] = slot
            elif overdue_slot(grace, due, nxt, None, now, spec) is not None:
                asked.append(name)  # overdue unless a success since: which one is it?
        elif mine:  # running, or unreadable
            asked.append(name)
    if not rows:
        gaps.append((None, None))  # no note: every job of the runs table
    after, before = zip(*gaps, strict=True)
    for name, noted, outcome, success in await conn.fetch(
        asked_sql(table), asked, list(after), list(before)
    ):
        if noted:
            facts[name][3:5] = outcome, success
        else:
            facts[name] = [None, None, None, outcome, success, None]
            if not tags:  # no note, no tags
                tagged.add(name)
    everyone = list(facts)
    for _, names in plain:
        everyone.extend(names)
    held = await held_locks(conn, everyone, table)
    conflicts = await read_conflicts(conn, table)
    few = held.keys() | paused | conflicts
    statuses: dict[str, Status] = {}
    for outcome, names in plain:
        # Not overdue (see roster_sql): paused and held decide the rest, and they are the
        # same for all but a few of the names.
        statuses.update(dict.fromkeys(names, _judge(False, outcome, False, False)))
        for name in few.intersection(names):
            statuses[name] = _judge(
                name in paused, outcome, False, name in held, conflict=name in conflicts
            )
    for name, (grace, due, nxt, outcome, success, spec) in facts.items():
        overdue = overdue_slot(grace, due, nxt, success, now, spec) is not None
        gone = absent(nxt, now)
        statuses[name] = _judge(
            name in paused, outcome, overdue, name in held, gone, conflict=name in conflicts
        )
    # Rejected everywhere: no replica runs it, whatever its runs say (noted or not).
    rejected = frozenset(await read_rejected(conn, table))
    for name in rejected:
        statuses[name] = status_of(
            paused=name in paused, overdue=False, last_outcome=None, held=False, rejected=True
        )
    return Roster(statuses, None if not tags else frozenset(tagged), held, conflicts, rejected)


def _judge(
    paused: bool,
    outcome: str | None,
    overdue: bool,
    held: bool,
    gone: bool = False,
    *,
    conflict: bool = False,
) -> Status:
    return status_of(
        paused=paused,
        overdue=overdue,
        last_outcome=outcome,
        held=held,
        absent=gone,
        conflict=conflict,
    )
