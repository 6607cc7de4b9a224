"""The simulated server's background statements agree with PostgreSQL's: members, job notes,
definitions, the fleet-control poll, stored schedules' reads, secrets, pruning, the crash
check and the takeover, pending retries, and the write-back after a new primary.

Each test puts the same rows in a real ledger (a throwaway schema) and in a simulated
server, runs the real statement with asyncpg and the handler with the same arguments at
the same instant (the real server's ``clock_timestamp()`` just before), and compares the
answers and then every table of the ledger. Instants within a few seconds of the statement
read as ``NOW`` on both sides. The simulated sessions have the real backends' pids, so a
run's ``session`` means the same backend on both sides; :data:`DEAD` is a pid no backend
has.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock._sim.server import Exec, Session, SimServer
from cronlock._sim.statements.all import statements_for
from cronlock._sim.world import World
from cronlock.postgres._sql import (
    control,
    crashes,
    definitions,
    failover,
    schema,
    slots,
    stored,
    upkeep,
)
from cronlock.postgres._sql.tables import LedgerTable

from .realserver import throwaway_ledger

pytestmark = pytest.mark.postgres

_NEAR = timedelta(seconds=5)
_CLOSE = timedelta(milliseconds=200)
DEAD = 2_000_000_000
"""A backend pid that no session has."""
TTL = upkeep.MEMBER_TTL
S = timedelta(seconds=1)
MS = timedelta(milliseconds=1)

# Each table: its key columns and its columns (the DDL's), with the defaults a test leaves out.
_TABLES: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "runs": (
        ("job", "slot"),
        {
            "job": None, "slot": None, "host": "h1", "pid": 1, "started_at": None,
            "finished_at": None, "outcome": None, "error": None, "session": None,
            "attempt": 1, "manual": False, "holder": None, "attempts": None, "retry_at": None,
        },
    ),
    "jobs": (
        ("job",),
        {
            "job": None, "schedule": "every 10s", "next_run": None, "updated_at": None,
            "updated_by": None, "grace": None, "due": None, "grace_until": None,
            "first_seen": None, "tags": None, "retired_at": None, "retired_by": None,
            "spec": None,
        },
    ),
    "members": (
        ("holder",),
        {
            "holder": None,
            "fleet": "f",
            "expires_at": None,
            "since": None,
            "session": None,
            "server_started": None,
        },
    ),
    "definitions": (
        ("job", "holder"),
        {"job": None, "holder": None, "definition": "d", "noted_at": None},
    ),
    "control": (
        ("job",),
        {
            "job": None, "paused_at": None, "paused_by": None, "trigger_slot": None,
            "triggered_by": None, "updated_at": None,
        },
    ),
    "leases": (
        ("job",),
        {"job": None, "slot": None, "holder": "x", "expires_at": None, "attempt": 1},
    ),
    "secrets": (("name",), {"name": None, "value": b"", "created_at": None}),
    "slots": (
        ("job", "slot"),
        {
            "job": None, "slot": None, "last_slot": None, "fate": "missed", "reason": "r",
            "into_slot": None, "holder": None, "recorded_at": None,
        },
    ),
    "schedules": (
        ("name",),
        {
            "name": None, "revision": 1, "removed": False, "task": "t", "schedule": {},
            "kwargs": {}, "options": {}, "updated_at": None, "updated_by": None,
            "problems": None, "problem_revision": None,
        },
    ),
}  # fmt: skip
_JSONB = {
    ("runs", "attempts"),
    ("jobs", "spec"),
    *(("schedules", c) for c in ("schedule", "kwargs", "options", "problems")),
}
_NOW_DEFAULTS = {
    *("started_at", "updated_at", "noted_at", "created_at", "since", "first_seen"),
    "recorded_at",
}


class Pair:
    """A real ledger and a simulated one; ``a`` sends the statements under test, ``b`` is
    another replica's backend (alive on both sides, with the same pid)."""

    def __init__(self, table: LedgerTable, a: Any, b: Any) -> None:
        self.table = table
        self.a, self.b = a, b
        world = World(1)
        self.server = SimServer(world, statements_for(table))
        world.server = self.server
        self.sa = Session(int(a.get_server_pid()), "a")
        self.sb = Session(int(b.get_server_pid()), "b")
        self.server.sessions.update({self.sa.pid: self.sa, self.sb.pid: self.sb})
        self.now = datetime.now(UTC)
        self.base = self.now.replace(microsecond=0)
        self.keys: set[int] = set()

    # -- the same rows on both sides ------------------------------------------------------

    async def put(self, into: str, /, **values: Any) -> dict[str, Any]:
        """A row of table *into* with *values* (the rest: defaults; an instant left out
        that the DDL defaults to the clock: :attr:`base`) on both sides."""
        key_columns, defaults = _TABLES[into]
        row = {**defaults, **values}
        for column in _NOW_DEFAULTS & row.keys() - values.keys():
            row[column] = self.base
        columns = list(row)
        marks = ", ".join(
            f"${n}::text::jsonb" if (into, c) in _JSONB else f"${n}"
            for n, c in enumerate(columns, 1)
        )
        quoted = getattr(self.table, into)
        await self.a.execute(
            f"INSERT INTO {quoted} ({', '.join(columns)}) VALUES ({marks})",
            *(
                json.dumps(row[c]) if (into, c) in _JSONB and row[c] is not None else row[c]
                for c in columns
            ),
        )
        key = tuple(row[c] for c in key_columns)
        db = self.server.db
        db.begin(self.now)
        db.put(into, key[0] if len(key) == 1 else key, row)
        db.commit()
        return row

    # -- a statement on both sides ----------------------------------------------------------

    async def run(self, sql: str, *args: Any, execute: bool = False) -> tuple[Any, Any]:
        """Run *sql* on both sides; the two answers, normalised."""
        self.now = await self.a.fetchval("SELECT clock_timestamp()")
        real: Any = await (self.a.execute if execute else self.a.fetch)(sql, *args)
        handler = self.server.statements.lookup(sql)
        x = Exec(self.server, self.sa)
        x.now = self.now
        db = self.server.db
        db.begin(self.now)
        try:
            sim = handler(x, args)
        except BaseException:
            db.rollback()
            raise
        db.commit()
        if execute:
            return real, sim
        return self._answer(real), self._answer(sim)

    async def agree(self, sql: str, *args: Any, execute: bool = False) -> Any:
        """Run *sql* on both sides; assert that the answers and every table agree; the
        (normalised) answer."""
        real, sim = await self.run(sql, *args, execute=execute)
        assert _same(sim, real), (sim, real)
        for name in _TABLES:
            mine, theirs = self.sim_rows(name), await self.real_rows(name)
            assert _same(mine, theirs), (name, mine, theirs)
        assert await self.real_locks() == self.sim_locks()
        return real

    def _value(self, column: str, value: Any, *, jsonb: bool = False) -> Any:
        if isinstance(value, datetime):
            return "NOW" if abs(value - self.now) <= _NEAR else value
        if jsonb and isinstance(value, str):
            return json.loads(value)
        return (
            {self.sa.pid: "A", self.sb.pid: "B"}.get(value, value) if column == "session" else value
        )

    def _answer(self, records: list[Any]) -> list[dict[str, Any]]:
        """*records* as dicts, in an order of their own (most statements have no ``ORDER
        BY``; those that do cut at a limit, which the rows kept show)."""
        answer = [{k: self._value(k, v) for k, v in dict(r.items()).items()} for r in records]
        return sorted(answer, key=_order)

    async def real_rows(self, name: str) -> list[dict[str, Any]]:
        keys = ", ".join(_TABLES[name][0])
        found = await self.a.fetch(f"SELECT * FROM {getattr(self.table, name)} ORDER BY {keys}")
        return [
            {k: self._value(k, v, jsonb=(name, k) in _JSONB) for k, v in dict(r.items()).items()}
            for r in found
        ]

    def sim_rows(self, name: str) -> list[dict[str, Any]]:
        columns = list(_TABLES[name][1])
        table = self.server.db.table(name)
        return [
            {c: self._value(c, table[k][c], jsonb=(name, c) in _JSONB) for c in columns}
            for k in sorted(table)
        ]

    # -- advisory locks ---------------------------------------------------------------------

    async def lock(self, key: int, on: str) -> None:
        """Session *on* takes lock *key* on both sides."""
        self.keys.add(key)
        conn, session = (self.a, self.sa) if on == "a" else (self.b, self.sb)
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
        assert self.server.try_lock(session, key)

    async def real_locks(self) -> set[tuple[int, str]]:
        found = await self.a.fetch(
            "SELECT (classid::int8 << 32) | objid::int8 AS key, pid FROM pg_locks "
            "WHERE locktype = 'advisory' AND objsubid = 1 AND granted"
        )
        who = {self.sa.pid: "a", self.sb.pid: "b"}
        return {(r["key"], who.get(r["pid"], "?")) for r in found if r["key"] in self.keys}

    def sim_locks(self) -> set[tuple[int, str]]:
        who = {self.sa.pid: "a", self.sb.pid: "b"}
        return {(k, who[pid]) for k, (pid, _) in self.server.locks.items() if k in self.keys}


def _order(row: dict[str, Any]) -> str:
    """A row's place among the answers: its values but the instants (which differ by the
    milliseconds between the real statement and the simulated one)."""
    return repr([v for v in row.values() if not isinstance(v, datetime)])


def _same(a: Any, b: Any) -> bool:
    """*a* equals *b*, instants within :data:`_CLOSE` of each other (an instant the
    statement computed from its clock)."""
    if isinstance(a, datetime) and isinstance(b, datetime):
        return abs(a - b) <= _CLOSE
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with throwaway_ledger("agree_upkeep") as (table, (a, b)):
        pair = Pair(table, a, b)
        pair.server.started = await a.fetchval("SELECT pg_postmaster_start_time()")
        yield pair


# -- members -----------------------------------------------------------------------------------


async def test_heartbeat_answers_the_live_members_of_its_fleet(pair: Pair) -> None:
    t = pair.base
    await pair.put("members", holder="live", expires_at=t + 30 * S)
    await pair.put("members", holder="expired", expires_at=t - 30 * S)
    await pair.put("members", holder="other-fleet", fleet="g", expires_at=t + 30 * S)
    await pair.put("members", holder="long-gone", expires_at=t - 2 * timedelta(hours=1))
    await pair.put("members", holder="me", expires_at=t + 40 * S, since=t - 100 * S)
    sql = upkeep.heartbeat_sql(pair.table)
    # A beat within half a time to live keeps `since`; the hour-expired row is deleted.
    assert await pair.agree(sql, "me", "f", TTL, False) == [{"holder": "live"}]
    # A beat after a gap starts `since` again.
    await pair.put("members", holder="gap", expires_at=t + 5 * S, since=t - 100 * S)
    await pair.agree(sql, "gap", "f", TTL, False)
    # A new member's row; in session mode, naming its session and the server's start.
    await pair.agree(sql, "new", "g", TTL, False)
    await pair.agree(sql, "session-mode", "g", TTL, True)
    [named] = await pair.a.fetch(
        f"SELECT session, server_started = pg_postmaster_start_time() AS same"
        f" FROM {pair.table.members} WHERE holder = 'session-mode'"
    )
    assert (named["session"], named["same"]) == (pair.sa.pid, True)


async def test_heartbeat_of_a_member_expired_an_hour_renews_it(pair: Pair) -> None:
    t = pair.base
    await pair.put("members", holder="me", expires_at=t - 2 * timedelta(hours=1))
    assert await pair.agree(upkeep.heartbeat_sql(pair.table), "me", "f", TTL, False) == []


async def test_leave_deletes_the_member_and_its_definitions(pair: Pair) -> None:
    await pair.put("members", holder="me", expires_at=pair.base + 30 * S)
    await pair.put("definitions", job="j", holder="me")
    await pair.put("definitions", job="j", holder="other")
    assert await pair.agree(upkeep.leave_sql(pair.table), "me", execute=True) == "DELETE 1"
    assert await pair.agree(upkeep.leave_sql(pair.table), "me", execute=True) == "DELETE 0"


# -- job notes ---------------------------------------------------------------------------------


async def test_notes_are_written_kept_and_replaced(pair: Pair) -> None:
    t = pair.base
    sql = upkeep.note_sql(pair.table)
    nxt = t + 60 * S
    await pair.put("jobs", job="kept", next_run=nxt, grace=100.0, grace_until=t + 500 * S, tags=[])
    await pair.put("jobs", job="lapsed", next_run=nxt, grace=100.0, grace_until=t - S, tags=[])
    await pair.put(
        "jobs", job="same", next_run=nxt, grace=30.0, grace_until=t + 500 * S, tags=["a"]
    )
    await pair.put("jobs", job="retired", next_run=nxt, tags=[], retired_at=t, retired_by="op")
    await pair.put("jobs", job="unchanged", schedule="s", next_run=nxt, grace=None, tags=[])
    jobs = ["kept", "lapsed", "new", "retired", "same", "unchanged", "untagged"]
    answer = await pair.agree(
        sql,
        jobs,
        ["every 10s", "every 10s", "every 5s", "every 10s", "every 10s", "s", "every 1s"],
        [nxt, nxt, nxt, nxt, t + 70 * S, nxt, None],
        "writer",
        [50.0, 50.0, 20.0, None, 30.0, None, 5.5],
        [t, t, None, None, t, None, t],
        7.25,
        ['["b","a"]', "[]", '["x"]', "[]", '["a"]', "[]", None],
        ['{"jitter": null}', None, '{"a": 1}', None, None, None, None],
        execute=True,
    )
    assert answer == "INSERT 0 6"
    # Written again as they are: nothing changes.
    assert (
        await pair.agree(
            sql,
            ["unchanged"],
            ["s"],
            [nxt],
            "w",
            [None],
            [None],
            1.0,
            ["[]"],
            [None],
            execute=True,
        )
        == "INSERT 0 0"
    )


async def test_first_seen(pair: Pair) -> None:
    await pair.put("jobs", job="a", first_seen=pair.base - 100 * S)
    await pair.put(
        "jobs", job="b", first_seen=datetime.min.replace(tzinfo=UTC) + timedelta(hours=1)
    )
    await pair.put("jobs", job="c")
    await pair.agree(schema.first_seen_sql(pair.table), ["a", "b", "c", "d"])


# -- pruning -----------------------------------------------------------------------------------


async def test_prune_keeps_each_jobs_latest_run_and_latest_success(pair: Pair) -> None:
    t = pair.base - timedelta(days=10)
    for i, outcome in enumerate(["succeeded", "failed", "succeeded", "failed", None]):
        await pair.put("runs", job="a", slot=t + i * S, outcome=outcome)
    for i, outcome in enumerate(["failed", "succeeded", "failed"]):
        await pair.put("runs", job="b", slot=t + i * S, outcome=outcome)
    await pair.put("runs", job="c", slot=t, outcome="failed")
    await pair.put("runs", job="d", slot=pair.base - S, outcome="failed")
    await pair.put("runs", job="d", slot=pair.base, outcome="failed")
    assert await pair.agree(upkeep.prune_sql(pair.table), 86400.0, 100) == [{"count": 4}]


async def test_stale_definitions(pair: Pair) -> None:
    t = pair.base
    old = t - timedelta(hours=2)
    await pair.put("members", holder="alive", expires_at=t + 10 * S)
    await pair.put("members", holder="lately", expires_at=t - 100 * S)
    await pair.put("members", holder="gone", expires_at=old)
    for holder in ("alive", "lately", "gone", "absent", "me"):
        await pair.put("definitions", job="j", holder=holder, noted_at=old)
    await pair.put("definitions", job="k", holder="absent", noted_at=t)
    sql = definitions.stale_definitions_sql(pair.table)
    assert await pair.agree(sql, "me", 1000) == [{"count": 2}]


# -- definitions -------------------------------------------------------------------------------


async def test_define_and_conflicts(pair: Pair) -> None:
    t = pair.base
    await pair.put("members", holder="me", expires_at=t + 30 * S)
    await pair.put("members", holder="o1", expires_at=t + 30 * S, since=t - 1000 * S)
    await pair.put("members", holder="o2", expires_at=t + 30 * S, since=t - 5 * S)
    await pair.put("members", holder="dead", expires_at=t - 30 * S)
    old = t - 1000 * S
    await pair.put("definitions", job="a", holder="me", definition="1", noted_at=old)
    await pair.put("definitions", job="b", holder="me", definition="1", noted_at=old)
    await pair.put("definitions", job="c", holder="me", definition="1", noted_at=old)
    await pair.put("definitions", job="a", holder="o1", definition="2", noted_at=t - 3 * S)
    await pair.put("definitions", job="b", holder="o1", definition="2", noted_at=old)
    await pair.put("definitions", job="c", holder="o1", definition="2", noted_at=old)
    await pair.put("definitions", job="b", holder="o2", definition="3", noted_at=old)
    await pair.put("definitions", job="a", holder="dead", definition="4", noted_at=t)
    conflicts = definitions.conflicts_sql(pair.table)
    # a: o1 wrote lately; b: o2 came back lately; c: known in conflict.
    answer = await pair.agree(conflicts, "me", 60.0, ["c"], 1000)
    assert [(r["job"], r["holder"]) for r in answer] == [("a", "o1"), ("b", "o2"), ("c", "o1")]
    await pair.agree(conflicts, "me", 1e9, [], 1000)
    await pair.agree(conflicts, "me", 1e9, [], 2)
    define = definitions.define_sql(pair.table)
    assert (
        await pair.agree(define, "me", ["a", "b", "z"], ["1", "5", "9"], execute=True)
        == "INSERT 0 2"
    )
    # Its own rewritten row makes every live replica's row of that job one to compare.
    await pair.agree(conflicts, "me", 60.0, [], 1000)


# -- fleet control -----------------------------------------------------------------------------


async def test_poll(pair: Pair) -> None:
    t = pair.base
    await pair.put("control", job="paused", paused_at=t)
    await pair.put("control", job="fresh", trigger_slot=t - S)
    await pair.put("control", job="stale", trigger_slot=t - 1000 * S)
    await pair.put("control", job="claimed", trigger_slot=t - 2 * S)
    await pair.put("runs", job="claimed", slot=t - 2 * S, started_at=t)
    await pair.put("control", job="future", trigger_slot=t + timedelta(hours=1, microseconds=5))
    await pair.put("control", job="ancient", trigger_slot=datetime(1, 1, 1, 5, tzinfo=UTC))
    await pair.put("control", job="quiet")
    await pair.agree(control.poll_sql(pair.table), 300.0)


# -- stored schedules --------------------------------------------------------------------------


async def test_stored_schedule_reads(pair: Pair) -> None:
    t = pair.base
    table = pair.table
    await pair.agree(stored.schedule_changes_sql(table), 0, 100)
    assert await pair.agree(stored.schedule_top_sql(table)) == [{"max": None}]
    await pair.put("members", holder="m1", expires_at=t + 30 * S)
    await pair.put("members", holder="m2", expires_at=t + 30 * S)
    await pair.put("members", holder="dead", expires_at=t - 30 * S)
    sched = {"kind": "every", "seconds": 10}
    await pair.put("schedules", name="", revision=0, removed=True, task="")
    await pair.put(
        "schedules", name="a", revision=1, schedule=sched, kwargs={"bb": 1, "a": [1, "x"]}
    )
    await pair.put("schedules", name="b", revision=2, removed=True)
    await pair.put(
        "schedules", name="c", revision=3, problems={"m1": "no task", "m2": "no", "dead": "x"},
        problem_revision=3,
    )  # fmt: skip
    await pair.put("schedules", name="d", revision=3, problems={"m1": "no"}, problem_revision=3)
    await pair.put(
        "schedules", name="e", revision=4, problems={"m1": "x", "m2": "y"}, problem_revision=2
    )
    await pair.put("control", job="a", paused_at=t)
    await pair.agree(stored.schedule_changes_sql(table), 0, 100)
    await pair.agree(stored.schedule_changes_sql(table), 1, 100)
    await pair.agree(stored.schedule_changes_sql(table), 0, 2)
    await pair.agree(stored.schedule_top_sql(table))
    await pair.agree(stored.schedule_window_sql(table), "", 1)
    await pair.agree(stored.schedule_window_sql(table), "b", 5)
    await pair.agree(stored.schedule_page_sql(table), 0, 3, "", "c")
    await pair.agree(stored.schedule_page_sql(table), 1, 4, "a", None)
    assert [r["name"] for r in await pair.agree(stored.rejected_sql(table))] == ["c"]
    problem = stored.schedule_problem_sql(table)
    assert await pair.agree(problem, "d", 3, "bad kwargs", "m2", execute=True) == "UPDATE 1"
    assert await pair.agree(problem, "e", 4, "bad", "m1", execute=True) == "UPDATE 1"
    assert await pair.agree(problem, "e", 3, "bad", "m1", execute=True) == "UPDATE 0"
    assert [r["name"] for r in await pair.agree(stored.rejected_sql(table))] == ["c", "d"]


# -- secrets -----------------------------------------------------------------------------------


async def test_secrets(pair: Pair) -> None:
    read, make = upkeep.read_secret_sql(pair.table), upkeep.make_secret_sql(pair.table)
    assert await pair.agree(read, "k") == []
    assert await pair.agree(make, "k", b"\x01\x02", execute=True) == "INSERT 0 1"
    assert await pair.agree(make, "k", b"\x03", execute=True) == "INSERT 0 0"
    assert await pair.agree(read, "k") == [{"value": b"\x01\x02"}]


# -- the foreign holder ------------------------------------------------------------------------


async def test_foreign_holder(pair: Pair) -> None:
    t = pair.base
    sql = upkeep.holders_sql(pair.table)
    key, mine = -1234567890123, 987654321
    await pair.lock(key, "b")
    await pair.lock(mine, "a")
    real, sim = await pair.run(sql, key, "j")
    assert [r["pid"] for r in sim] == [r["pid"] for r in real] == [pair.sb.pid]
    assert await pair.agree(sql, mine, "j") == []
    await pair.put("runs", job="j", slot=t, session=pair.sb.pid)
    assert await pair.agree(sql, key, "j") == []
    await pair.put("runs", job="k", slot=t, session=pair.sb.pid, finished_at=t, outcome="failed")
    await pair.put("leases", job="k", slot=t, expires_at=t + 60 * S)
    assert await pair.agree(sql, key, "k") == []


# -- the crash check ---------------------------------------------------------------------------


async def test_crashed_marks_runs_whose_session_and_owner_are_gone(pair: Pair) -> None:
    t = pair.base
    old = t - 100 * S
    await pair.put("members", holder="me", expires_at=t + 40 * S, since=t - 60 * S)
    await pair.put("members", holder="alive", expires_at=t + 40 * S)
    await pair.put("members", holder="expired", expires_at=t - 10 * S)
    run = {"slot": old, "started_at": old, "session": DEAD}
    await pair.put("runs", job="no-holder", **run)
    await pair.put("runs", job="absent", holder="ghost", host="h2", pid=7, **run)
    await pair.put("runs", job="expired", holder="expired", **run)
    await pair.put("runs", job="owner-alive", holder="alive", **run)
    await pair.put(
        "runs", job="recent", holder="ghost", slot=old, started_at=t - 10 * S, session=DEAD
    )
    await pair.put("runs", job="mine-by-holder", holder="me", **run)
    await pair.put("runs", job="own-process", host="here", pid=42, **run)
    await pair.put("runs", job="session-alive", slot=old, started_at=old, session=pair.sb.pid)
    await pair.put(
        "runs",
        job="finished",
        slot=old,
        started_at=old,
        session=DEAD,
        finished_at=old,
        outcome="failed",
    )
    await pair.put("runs", job="no-session", slot=old, started_at=old)
    sql = crashes.crashed_sql(pair.table)
    answer = await pair.agree(sql, "here", 42, "me", TTL)
    assert sorted(r["job"] for r in answer) == ["absent", "expired", "no-holder"]
    # A crashed run ends at its owner's last heartbeat (its row's expiry less the time to
    # live), not at its detection; with no members row to tell, at its detection.
    ended = {r["job"]: r["finished_at"] for r in answer}
    assert ended["expired"] == t - 10 * S - TTL * S
    assert ended["absent"] == ended["no-holder"] == "NOW"
    assert await pair.agree(sql, "here", 42, "me", TTL) == []


async def test_crashed_marks_at_once_the_runs_of_a_member_whose_session_is_gone(
    pair: Pair,
) -> None:
    """Session mode: a killed replica's lock session and the session its members row names
    are both gone from the same server: its run is crashed without waiting for the row to
    expire. Not when that session lives (a run's session lost under a live replica), nor
    when the row was written on a server that has since restarted, nor in lease mode."""
    t = pair.base
    started = pair.server.started
    live = t + 40 * S
    await pair.put("members", holder="me", expires_at=live, since=t - 60 * S)
    await pair.put("members", holder="killed", expires_at=live, session=DEAD,
                   server_started=started)  # fmt: skip
    await pair.put("members", holder="cut-off", expires_at=live, session=pair.sb.pid,
                   server_started=started)  # fmt: skip
    await pair.put("members", holder="before-restart", expires_at=live, session=DEAD,
                   server_started=started - timedelta(hours=1))  # fmt: skip
    await pair.put("members", holder="lease-mode", expires_at=live)
    recent = t - 5 * S  # claimed since the time to live: the expiry rule would wait
    for holder in ("killed", "cut-off", "before-restart", "lease-mode"):
        await pair.put("runs", job=holder, holder=holder, slot=recent, started_at=recent,
                       session=DEAD, host="h2")  # fmt: skip
    sql = crashes.crashed_sql(pair.table)
    answer = await pair.agree(sql, "here", 42, "me", TTL)
    assert [r["job"] for r in answer] == ["killed"]
    error = await pair.a.fetchval(f"SELECT error FROM {pair.table.runs} WHERE job = 'killed'")
    assert error.endswith("lock session and membership session gone")
    assert await pair.agree(sql, "here", 42, "me", TTL) == []


async def test_crashed_ends_a_frozen_holders_session_then_marks_its_run(pair: Pair) -> None:
    t = pair.base
    old = t - 100 * S
    await pair.put("members", holder="me", expires_at=t + 40 * S, since=t - 60 * S)
    await pair.put("members", holder="frozen", expires_at=t - 10 * S)  # stopped beating
    await pair.put("members", holder="slow", expires_at=t + 40 * S)  # beats: a slow run
    await pair.put("runs", job="slow", slot=old, started_at=old, session=pair.sa.pid,
                   holder="slow", host="h2")  # fmt: skip
    await pair.put("runs", job="frozen", slot=old, started_at=old, session=pair.sb.pid,
                   holder="frozen", host="h3")  # fmt: skip
    sql = crashes.crashed_sql(pair.table)
    b = pair.b.get_server_pid()
    assert await pair.agree(sql, "here", 42, "me", TTL) == []  # its session is ended...
    async with asyncio.timeout(10):  # (the backend exits after the statement)
        while await pair.a.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", b):
            await asyncio.sleep(0.05)
    assert pair.sb.pid not in pair.server.sessions
    answer = await pair.agree(sql, "here", 42, "me", TTL)  # ... and its run marked next
    assert [r["job"] for r in answer] == ["frozen"]


async def test_crashed_waits_for_its_own_row_to_stand(pair: Pair) -> None:
    t = pair.base
    old = t - 100 * S
    await pair.put("members", holder="me", expires_at=t + 40 * S, since=t - 5 * S)
    await pair.put("runs", job="absent", holder="ghost", slot=old, started_at=old, session=DEAD)
    await pair.put("runs", job="legacy", slot=old, started_at=old, session=DEAD)
    sql = crashes.crashed_sql(pair.table)
    assert [r["job"] for r in await pair.agree(sql, "here", 42, "me", TTL)] == ["legacy"]
    # A locker without a holder (a standalone run) marks only the legacy rows.
    await pair.put("runs", job="legacy2", slot=old, started_at=old, session=DEAD)
    assert [r["job"] for r in await pair.agree(sql, "here", 42, None, TTL)] == ["legacy2"]


async def test_crashed_answers_odd_instants(pair: Pair) -> None:
    far = datetime(9999, 12, 31, tzinfo=UTC)
    await pair.put("runs", job="odd", slot=far, started_at=pair.base - 100 * S, session=DEAD)
    answer = await pair.agree(crashes.crashed_sql(pair.table), "here", 42, "me", TTL)
    assert answer[0]["odd"] == "slot=9999-12-31 00:00:00+00"


# -- the takeover ------------------------------------------------------------------------------


async def test_recover_takes_a_crashed_or_failed_row_over(pair: Pair) -> None:
    t = pair.base
    sql = crashes.recover_sql(pair.table)
    key = 5550001
    pair.keys.add(key)
    earlier = [{"attempt": 1, "outcome": "failed", "started_at": "2026-01-01T00:00:00+00:00"}]
    await pair.put(
        "runs", job="crashed", slot=t, started_at=t - 9 * S, finished_at=t - S,
        outcome="crashed", error="died", session=DEAD, holder="h", retry_at=t,
    )  # fmt: skip
    await pair.put(
        "runs", job="failed2", slot=t, attempt=2, started_at=t - 9 * S + 123 * MS,
        finished_at=t - S, outcome="timed_out", attempts=earlier,
    )  # fmt: skip
    await pair.put("runs", job="ok", slot=t, finished_at=t, outcome="succeeded", started_at=t)
    await pair.put(
        "runs", job="crashed2", slot=t, attempt=2, finished_at=t, outcome="crashed", started_at=t
    )
    await pair.put(
        "runs", job="odd", slot=t, finished_at=t, outcome="failed", started_at=t, attempts={"x": 1}
    )
    got = await pair.agree(sql, key, "crashed", t, "me", 9, 2, "mine")
    assert got[0]["started_at"] == "NOW" and got[0]["undone"] is None
    await pair.agree(sql, key, "failed2", t, "me", 9, 3, "mine")
    refused = await pair.agree(sql, key, "ok", t, "me", 9, 2, "mine")
    assert refused[0]["got"] and refused[0]["undone"] and refused[0]["started_at"] is None
    await pair.agree(sql, key, "crashed2", t, "me", 9, 3, "mine")
    await pair.agree(sql, key, "odd", t, "me", 9, 2, "mine")
    await pair.agree(sql, key, "missing", t, "me", 9, 2, None)


async def test_recover_refused_when_paused_or_locked(pair: Pair) -> None:
    t = pair.base
    sql = crashes.recover_sql(pair.table)
    await pair.put("runs", job="j", slot=t, finished_at=t, outcome="crashed", started_at=t)
    await pair.put("control", job="p", paused_at=t)
    await pair.put("runs", job="p", slot=t, finished_at=t, outcome="crashed", started_at=t)
    await pair.lock(77, "b")
    assert (await pair.agree(sql, 77, "j", t, "me", 9, 2, "mine"))[0]["got"] is False
    pair.keys.add(78)
    assert (await pair.agree(sql, 78, "p", t, "me", 9, 2, "mine"))[0]["paused"] is True


# -- retries left behind -----------------------------------------------------------------------


async def test_retries_due_and_pending(pair: Pair) -> None:
    t = pair.base
    old = t - 100 * S
    await pair.put("members", holder="me", expires_at=t + 40 * S, since=t - 60 * S)
    await pair.put("members", holder="alive", expires_at=t + 40 * S)
    failed = {"slot": old, "started_at": old, "finished_at": old + S, "outcome": "failed"}
    await pair.put("runs", job="a", holder="gone", retry_at=t - 10 * S, **failed)
    await pair.put("runs", job="b", holder="alive", retry_at=t - 10 * S, **failed)
    await pair.put("runs", job="c", holder="gone", retry_at=t - S, **failed)
    await pair.put("runs", job="d", holder="gone", retry_at=t - 10 * S, slot=old, started_at=old)
    await pair.put("runs", job="e", holder="gone", retry_at=t - 10 * S, **failed)
    await pair.put(
        "runs",
        job="f",
        holder="gone",
        slot=old,
        started_at=old,
        finished_at=old,
        outcome="succeeded",
    )
    pending = await pair.agree(crashes.retries_pending_sql(pair.table), 5.0)
    assert sorted(r["job"] for r in pending) == ["a", "b", "d", "e"]
    due = crashes.retries_due_sql(pair.table)
    taken = await pair.agree(due, ["a", "b", "c", "d"], 5.0, "me", TTL)
    assert [r["job"] for r in taken] == ["a"]
    retry = crashes.retry_due_sql(pair.table)
    assert await pair.agree(retry, "f", old, 2, t, execute=True) == "UPDATE 0"
    assert await pair.agree(retry, "a", old, 2, t + S, execute=True) == "UPDATE 1"
    assert await pair.agree(retry, "a", old, 3, t + S, execute=True) == "UPDATE 0"


# -- the write-back after a new primary ----------------------------------------------------------


async def test_reassert_writes_back_what_the_ledger_lacks(pair: Pair) -> None:
    t = pair.base
    sql = failover.reassert_sql(pair.table)
    await pair.put("runs", job="mine", slot=t, holder="me", started_at=t - 5 * S)
    await pair.put(
        "runs", job="mine-done", slot=t, holder="me", started_at=t, finished_at=t, outcome="failed"
    )
    await pair.put("runs", job="theirs", slot=t, holder="them", started_at=t)
    await pair.put("runs", job="theirs-later", slot=t, holder="them", attempt=2, started_at=t)
    await pair.put("runs", job="legacy", slot=t, host="h9", pid=99, started_at=t)
    await pair.put("runs", job="mine-inflight", slot=t, holder="me", started_at=t)
    entries = [
        ("lost", t, 1, t - 9 * S, t - 8 * S, "succeeded", None),
        ("lost-inflight", t, 1, t - 9 * S, None, None, None),
        ("mine", t, 1, t - 5 * S, t - S, "failed", "boom"),
        ("mine-done", t, 1, t, t + S, "succeeded", None),
        ("theirs", t, 1, t, t + S, "succeeded", None),
        ("theirs-later", t, 1, t, t + S, "succeeded", None),
        ("legacy", t, 1, t, None, None, None),
        ("mine-inflight", t, 1, t, None, None, None),
        ("lost", t, 1, t - 9 * S, t - 8 * S, "succeeded", None),
    ]
    columns = list(zip(*entries, strict=True))
    answer = await pair.agree(sql, *(list(c) for c in columns), "host", 5, "me")
    assert sorted((r["i"], r["restored"], r["finished"], r["other"]) for r in answer) == [
        (1, True, False, None),
        (2, True, False, None),
        (3, False, True, None),
        (5, False, False, "them"),
        (7, False, False, "h9:99"),
        (9, True, False, None),
    ]
    # Again: all of it is there now.
    assert await pair.agree(sql, *(list(c) for c in columns), "host", 5, "me") == [
        {"i": 5, "restored": False, "finished": False, "other": "them"},
        {"i": 7, "restored": False, "finished": False, "other": "h9:99"},
    ]


async def test_reassert_writes_back_a_retry_the_server_lost(pair: Pair) -> None:
    """A snapshot restored from before a retry's takeover: the row is this replica's
    attempt 1, unfinished; it remembers attempts 1 (failed) and 2 (succeeded). The latest
    remembered attempt's outcome is written, with its attempt (not left unfinished)."""
    t = pair.base
    sql = failover.reassert_sql(pair.table)
    await pair.put("runs", job="retried", slot=t, holder="me", started_at=t)
    await pair.put("runs", job="theirs", slot=t, holder="them", started_at=t)
    entries = [
        ("retried", t, 1, t, t + S, "failed", "boom"),
        ("retried", t, 2, t + 2 * S, t + 3 * S, "succeeded", None),
        ("theirs", t, 2, t + 2 * S, t + 3 * S, "succeeded", None),
    ]
    columns = list(zip(*entries, strict=True))
    answer = await pair.agree(sql, *(list(c) for c in columns), "host", 5, "me")
    assert [(r["i"], r["finished"]) for r in answer] == [(1, True), (2, True)]
    row = await pair.a.fetchrow(
        f"SELECT attempt, outcome, started_at FROM {pair.table.runs} WHERE job = 'retried'"
    )
    assert (row["attempt"], row["outcome"], row["started_at"]) == (2, "succeeded", t + 2 * S)


# -- slots' fates ------------------------------------------------------------------------------


async def test_slot_records_first_of_a_range_stands(pair: Pair) -> None:
    t = pair.base - timedelta(hours=1)
    await pair.put("slots", job="a", slot=t, last_slot=t + 10 * S, fate="missed", reason="old")
    answer = await pair.agree(
        slots.record_slots_sql(pair.table),
        ["a", "a", "b", "b"],
        [t, t + 20 * S, t, t],
        [t + 5 * S, t + 20 * S, t + 9 * S, t + 9 * S],
        ["coalesced", "skipped", "coalesced", "missed"],
        ["new", "still running", "fleet down", "twice in one statement"],
        [t + 10 * S, None, t + 10 * S, None],
        "holder-1",
        execute=True,
    )
    assert answer == "INSERT 0 2"  # a's first range was recorded; b's second is the same slot


async def test_slot_records_are_pruned_by_their_last_slot(pair: Pair) -> None:
    old = pair.base - timedelta(days=10)
    await pair.put("slots", job="a", slot=old, last_slot=old + S)
    await pair.put("slots", job="a", slot=old + 2 * S, last_slot=pair.base)
    await pair.put("slots", job="b", slot=old, last_slot=old)
    assert await pair.agree(slots.prune_slots_sql(pair.table), 86400.0, 1) == [{"count": 1}]
    assert await pair.agree(slots.prune_slots_sql(pair.table), 86400.0, 10) == [{"count": 1}]
