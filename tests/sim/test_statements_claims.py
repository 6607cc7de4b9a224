"""The simulated server's claims, ends and reads of runs agree with PostgreSQL's.

Each test puts the same rows in a real ledger (a throwaway schema) and in a simulated
server, runs the real statement with asyncpg and the handler with the same arguments, and
compares the answers and then the runs table and the advisory locks held. Instants within a
few seconds of the statement (``clock_timestamp()``) read as ``NOW`` on both sides, the
claiming backend's pid as ``ME``, the other backend's as ``OTHER``.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from cronlock._sim.server import Exec, SimServer
from cronlock._sim.statements.all import statements_for
from cronlock._sim.world import World
from cronlock.postgres._sql import bare, claims, crashes, runs
from cronlock.postgres._sql.tables import LedgerTable

from .realserver import throwaway_ledger

pytestmark = pytest.mark.postgres

_NEAR = timedelta(seconds=5)
_MIN = datetime.min.replace(tzinfo=UTC)
_MAX = datetime.max.replace(tzinfo=UTC)
_COLUMNS = (
    "job", "slot", "host", "pid", "started_at", "finished_at", "outcome", "error", "session",
    "attempt", "manual", "holder", "attempts", "retry_at",
)  # fmt: skip


class Pair:
    """A real ledger and a simulated one, each with two sessions: ``a`` (the one that sends
    the statements under test) and ``b`` (another replica's, holding locks)."""

    def __init__(self, table: LedgerTable, a: Any, b: Any) -> None:
        self.table = table
        self.a, self.b = a, b
        world = World(1)
        self.server = SimServer(world, statements_for(table))
        world.server = self.server
        self.sa = self.server.open_session("a", lambda reason: None)
        self.sb = self.server.open_session("b", lambda reason: None)
        self.keys: set[int] = set()
        self.now = datetime.now(UTC)

    def key(self) -> int:
        """A lock key no other test (or helper) contends for."""
        key = random.getrandbits(64) - 2**63
        self.keys.add(key)
        return key

    # -- the same data on both sides ------------------------------------------------------

    async def put(self, job: str, slot: datetime, **values: Any) -> None:
        """A runs row with *values* (the rest: the DDL's defaults) on both sides."""
        row: dict[str, Any] = {
            "job": job, "slot": slot, "host": "h1", "pid": 1, "started_at": slot,
            "finished_at": None, "outcome": None, "error": None, "session": None,
            "attempt": 1, "manual": False, "holder": None, "attempts": None, "retry_at": None,
        }  # fmt: skip
        row.update(values)
        real = dict(row)
        if row["session"] in ("ME", "OTHER"):  # session a's backend, or b's, on each side
            me = row["session"] == "ME"
            real["session"] = self.a_pid if me else int(self.b.get_server_pid())
            row["session"] = self.sa.pid if me else self.sb.pid
        if real["attempts"] is not None:
            real["attempts"] = json.dumps(real["attempts"], default=str)
        marks = ", ".join(
            f"${n}::jsonb" if c == "attempts" else f"${n}" for n, c in enumerate(_COLUMNS, 1)
        )
        await self.a.execute(
            f"INSERT INTO {self.table.runs} ({', '.join(_COLUMNS)}) VALUES ({marks})",
            *(real[c] for c in _COLUMNS),
        )
        db = self.server.db
        db.begin(self.now)
        db.put("runs", (job, slot), row)
        db.commit()

    async def told(self, job: str, slot: datetime, last: datetime) -> None:
        """A slots record (a range told skipped) on both sides."""
        await self.a.execute(
            f"INSERT INTO {self.table.slots} (job, slot, last_slot, fate, reason)"
            " VALUES ($1, $2, $3, 'skipped', 'overlap')",
            job,
            slot,
            last,
        )
        db = self.server.db
        db.begin(self.now)
        row = {"job": job, "slot": slot, "last_slot": last, "fate": "skipped",
               "reason": "overlap", "into_slot": None, "holder": None,
               "recorded_at": self.now}  # fmt: skip
        db.put("slots", (job, slot), row)
        db.commit()

    async def control(self, job: str, paused_at: datetime | None, trigger: datetime | None) -> None:
        """A control row on both sides."""
        await self.a.execute(
            f"INSERT INTO {self.table.control} (job, paused_at, trigger_slot) VALUES ($1, $2, $3)",
            job,
            paused_at,
            trigger,
        )
        db = self.server.db
        db.begin(self.now)
        row = {"job": job, "paused_at": paused_at, "paused_by": None, "trigger_slot": trigger}
        db.put("control", job, {**row, "triggered_by": None, "updated_at": self.now})
        db.commit()

    # -- a statement on both sides ----------------------------------------------------------

    async def run(
        self,
        sql: str,
        *args: Any,
        sim_args: tuple[Any, ...] | None = None,
        on: str = "a",
        execute: bool = False,
    ) -> tuple[Any, Any]:
        """Run *sql* on both sides on session *on*; the two answers, normalised."""
        conn = self.a if on == "a" else self.b
        self.now = await conn.fetchval("SELECT clock_timestamp()")
        real: Any = await (conn.execute if execute else conn.fetch)(sql, *args)
        sim = self.sim(sql, args if sim_args is None else sim_args, on=on)
        if execute:
            return real, sim
        return self._answer(real), self._answer(sim)

    def sim(self, sql: str, args: tuple[Any, ...], *, on: str = "a") -> Any:
        """Run *sql*'s handler at :attr:`now` on session *on* of the model, as the simulated
        server runs a statement (its changes rolled back when it fails)."""
        handler = self.server.statements.lookup(sql)
        x = Exec(self.server, self.sa if on == "a" else self.sb)
        x.now = self.now
        db = self.server.db
        db.begin(self.now)
        try:
            result = handler(x, args)
        except BaseException:
            db.rollback()
            raise
        db.commit()
        return result

    async def agree(self, sql: str, *args: Any, **options: Any) -> list[dict[str, Any]]:
        """Run *sql* on both sides; assert that the answers, the runs and the locks agree;
        the (normalised) answer."""
        real, sim = await self.run(sql, *args, **options)
        assert sim == real
        assert await self.real_runs() == self.sim_runs()
        assert await self.real_locks() == self.sim_locks()
        return list(real) if isinstance(real, list) else real

    @property
    def a_pid(self) -> int:
        return int(self.a.get_server_pid())

    def _value(self, value: Any) -> Any:
        if isinstance(value, datetime):
            if value.tzinfo is None:  # asyncpg's infinity: a naive datetime.max or min
                return _MAX if value.year == 9999 else _MIN
            return "NOW" if abs(value - self.now) <= _NEAR else value
        return value

    def _answer(self, records: list[Any]) -> list[dict[str, Any]]:
        answer = [
            {k: self._value(v) for k, v in dict(record.items()).items()} for record in records
        ]
        return sorted(answer, key=repr)

    # -- the state after --------------------------------------------------------------------

    def _row(self, row: dict[str, Any], me: int, other: int) -> dict[str, Any]:
        out = {c: self._value(row[c]) for c in _COLUMNS}
        out["session"] = {me: "ME", other: "OTHER"}.get(row["session"], row["session"])
        if isinstance(out["attempts"], str):
            out["attempts"] = json.loads(out["attempts"])
        return out

    async def real_runs(self) -> list[dict[str, Any]]:
        found = await self.a.fetch(f"SELECT * FROM {self.table.runs} ORDER BY job, slot")
        me, other = self.a_pid, int(self.b.get_server_pid())
        return [self._row(dict(r.items()), me, other) for r in found]

    def sim_runs(self) -> list[dict[str, Any]]:
        rows = sorted(self.server.db.table("runs").values(), key=lambda r: (r["job"], r["slot"]))
        return [
            self._row({**r, "attempts": _json(r["attempts"])}, self.sa.pid, self.sb.pid)
            for r in rows
        ]

    async def real_locks(self) -> set[tuple[int, str]]:
        found = await self.a.fetch(
            "SELECT classid, objid, pid FROM pg_locks WHERE locktype = 'advisory' "
            "AND objsubid = 1 AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        who = {self.a_pid: "a", int(self.b.get_server_pid()): "b"}
        held = set()
        for r in found:
            key = (int(r["classid"]) << 32) | int(r["objid"])
            key = key - 2**64 if key >= 2**63 else key
            if key in self.keys:
                held.add((key, who.get(r["pid"], "?")))
        return held

    def sim_locks(self) -> set[tuple[int, str]]:
        who = {self.sa.pid: "a", self.sb.pid: "b"}
        return {(k, who[pid]) for k, (pid, _) in self.server.locks.items() if k in self.keys}

    async def lock(self, key: int, on: str = "b") -> None:
        """Session *on* takes lock *key* on both sides."""
        conn, session = (self.a, self.sa) if on == "a" else (self.b, self.sb)
        assert await conn.fetchval(claims.TRY_LOCK_SQL, key)
        assert self.server.try_lock(session, key)


def _json(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else json.dumps(value, default=str)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    async with throwaway_ledger("agree_claims") as (table, (a, b)):
        yield Pair(table, a, b)


HOUR = timedelta(hours=1)


def _base() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)


# -- the try-locks and unlocks ----------------------------------------------------------------


async def test_try_locks_and_unlocks(pair: Pair) -> None:
    k1, k2, k3 = pair.key(), pair.key(), pair.key()
    await pair.lock(k3)
    assert await pair.agree(claims.TRY_LOCK_SQL, k1) == [{"pg_try_advisory_lock": True}]
    assert await pair.agree(claims.TRY_LOCK_SQL, k1) == [{"pg_try_advisory_lock": True}]
    assert await pair.agree(claims.TRY_LOCK_SQL, k3) == [{"pg_try_advisory_lock": False}]
    await pair.agree(claims.TRY_LOCK_ON_SQL, k2, pair.a_pid, sim_args=(k2, pair.sa.pid))
    await pair.agree(claims.TRY_LOCK_ON_SQL, k2, 1, sim_args=(k2, 1))
    assert await pair.agree(claims.UNLOCK_SQL, k1) == [{"pg_advisory_unlock": True}]
    assert await pair.agree(claims.UNLOCK_SQL, k3) == [{"pg_advisory_unlock": False}]
    await pair.agree(claims.UNLOCK_SQL, k1)
    await pair.agree(claims.TRY_LOCK_MANY_SQL, [k1, k3, k2])
    await pair.agree(claims.UNLOCK_MANY_SQL, [k1, k3, k2, k2])
    await pair.agree(bare.TRY_LOCK_MANY_SQL, [k3, k1])
    await pair.agree(bare.UNLOCK_MANY_SQL, [k1, k3])


# -- the claim of many slots ------------------------------------------------------------------


async def test_claims_granted_refused_ran_paused(pair: Pair) -> None:
    base = _base()
    done: dict[str, Any] = {"host": "h2", "pid": 7, "outcome": "succeeded", "session": 4242}
    await pair.put("a", base - 2 * HOUR, finished_at=base - 2 * HOUR + timedelta(seconds=3), **done)
    await pair.put(
        "a",
        base - HOUR,
        finished_at=base - HOUR + timedelta(seconds=1),
        outcome="failed",
        error="boom",
    )
    await pair.put("a", base, session=4242)  # claimed, unfinished
    await pair.put(
        "b", base - HOUR, finished_at=base - HOUR, outcome="crashed", attempt=2, manual=True
    )
    await pair.control("p", base - 3 * HOUR, None)  # paused
    await pair.control("t", base - 3 * HOUR, base + HOUR)  # paused, this slot triggered
    await pair.control("q", None, base)  # triggered, not paused
    await pair.put("p", base - 2 * HOUR, finished_at=base - 2 * HOUR, outcome="succeeded")
    keys = {job: pair.key() for job in "abcdptq"}
    await pair.lock(keys["c"])
    claim = claims.claim_many_sql(pair.table)
    elements = [
        ("a", base),  # ran (unfinished): told the failure before it
        ("a", base - HOUR),  # ran (finished): told itself
        ("a", base + 30 * HOUR),  # granted, a future slot: started at the slot
        ("b", base + HOUR),  # granted, started now
        ("b", base - 30 * HOUR),  # granted, before any run: nothing told
        ("c", base),  # locked by another session
        ("p", base),  # paused: no lock tried, told its last run
        ("t", base + HOUR),  # the triggered slot of a paused job: claimed, manual
        ("t", base),  # paused
        ("q", base),  # triggered: manual
        ("d", _base() - timedelta(days=3)),  # granted
    ]
    answer = await pair.agree(
        claim,
        [keys[j] for j, _ in elements],
        [j for j, _ in elements],
        [s for _, s in elements],
        "me",
        99,
        "holder-1",
    )
    by_i = {row["i"]: row for row in answer}
    assert [by_i[i]["got"] for i in range(1, 12)] == [
        False, False, True, True, True, False, False, True, False, True, True,
    ]  # fmt: skip
    assert by_i[1]["p_outcome"] == "failed" and by_i[2]["p_outcome"] == "failed"
    assert by_i[3]["started_at"] == base + 30 * HOUR and by_i[4]["started_at"] == "NOW"
    # Claimed again: every slot ran now; the locks are still held by this session (taken
    # again: re-entrant) and given back... never: a ran slot takes no lock.
    await pair.agree(
        claim,
        [keys[j] for j, _ in elements],
        [j for j, _ in elements],
        [s for _, s in elements],
        "me",
        99,
        None,
    )


async def test_a_granted_claim_tells_the_gone_holder_it_took_the_job_over_from(
    pair: Pair,
) -> None:
    base, s = _base(), timedelta(seconds=1)
    await pair.put("g", base, holder="gone-1", session=4242)  # unfinished, lock free
    await pair.told("g", base + s, base + 3 * s)  # what it told itself before it went
    await pair.told("g", base + 20 * s, base + 30 * s)  # after the claimed slot
    await pair.put("c", base, holder="gone-2", finished_at=base + s, outcome="crashed")
    await pair.put("l", base, holder="gone-3", finished_at=base + s, outcome="lock_lost")
    await pair.put("ok", base, holder="other", finished_at=base + s, outcome="succeeded")
    await pair.put("mine", base, holder="holder-1")  # this locker's own
    await pair.put("old", base)  # an older cronlock's claim: no holder
    await pair.put("two", base, holder="gone-4")
    elements = [(job, base + 10 * s) for job in ("g", "c", "l", "ok", "mine", "old")]
    elements += [("two", base + 5 * s), ("two", base + 10 * s)]  # two of one job at once
    answer = await pair.agree(
        claims.claim_many_sql(pair.table),
        [pair.key() for _ in elements],
        [job for job, _ in elements],
        [slot for _, slot in elements],
        "me",
        99,
        "holder-1",
    )
    gone = {
        elements[row["i"] - 1]: (row["gone_slot"], row["gone_holder"], row["gone_since"])
        for row in answer
        if row["gone_slot"] is not None
    }
    assert gone == {
        ("g", base + 10 * s): (base + 3 * s, "gone-1", base + 3 * s),
        ("c", base + 10 * s): (base, "gone-2", base),
        ("l", base + 10 * s): (base, "gone-3", base),
        # The second claim of "two" sees the statement's snapshot: not the first one's row.
        ("two", base + 5 * s): (base, "gone-4", base),
        ("two", base + 10 * s): (base, "gone-4", base),
    }
    assert all(row["gone_expired"] == "NOW" for row in answer if row["gone_slot"] is not None)


async def test_claim_of_one_slot_twice_in_a_batch(pair: Pair) -> None:
    base, key = _base(), pair.key()
    await pair.agree(
        claims.claim_many_sql(pair.table), [key, key], ["a", "a"], [base, base], "me", 1, "h"
    )


async def test_claim_told_skips_rows_out_of_range(pair: Pair) -> None:
    base = _base()
    await pair.put("a", base - 2 * HOUR, finished_at=base - 2 * HOUR, outcome="succeeded")
    await pair.put("a", base - HOUR, started_at=_MIN, finished_at=_MAX, outcome="failed")
    await pair.put("a", _MIN, finished_at=base, outcome="succeeded")
    await pair.put("a", _MAX, finished_at=base, outcome="succeeded")
    await pair.put("b", _MIN, finished_at=base, outcome="succeeded")
    key, other = pair.key(), pair.key()
    await pair.lock(key)
    answer = await pair.agree(
        claims.claim_many_sql(pair.table),
        [key, other],
        ["a", "b"],
        [base, base],
        "me",
        1,
        "h",
    )
    row = next(r for r in answer if r["i"] == 1)
    assert row["p_odd"] == "started_at=-infinity, finished_at=infinity"


async def test_claim_with_a_null_host_fails(pair: Pair) -> None:
    base, key = _base(), pair.key()
    sql = claims.claim_many_sql(pair.table)
    with pytest.raises(asyncpg.NotNullViolationError):
        await pair.a.fetch(sql, [key], ["a"], [base], None, 1, "h")
    with pytest.raises(asyncpg.NotNullViolationError):
        pair.sim(sql, ([key], ["a"], [base], None, 1, "h"))
    # The real server's lock stays taken (the error ends the statement, not the session's
    # lock); the model's statement is rolled back but its lock is kept too.
    assert await pair.real_locks() == pair.sim_locks() == {(key, "a")}
    assert await pair.real_runs() == pair.sim_runs() == []


# -- the end of many runs -----------------------------------------------------------------------


async def test_finish_outcomes_undos_and_unlocks(pair: Pair) -> None:
    base = _base()
    mine: dict[str, Any] = {"host": "me", "pid": 5}
    theirs: dict[str, Any] = {"host": "them", "pid": 5}
    now = datetime.now(UTC)
    await pair.put("ok", base, **mine)  # an outcome, started reported
    await pair.put("early", base, **mine)  # reported before its claim: the claim
    await pair.put("late", base, **mine)  # reported after now: now
    await pair.put("none", base, **mine)  # no start reported: the claim's
    await pair.put("other", base, **theirs)  # an outcome for another's claim: recorded
    await pair.put("undo1", base, **mine)  # undo of attempt 1: deleted
    await pair.put("undo1x", base, **theirs)  # undo of another's attempt 1: kept
    await pair.put("undo2", base, attempt=2, **mine)  # undo of a rerun: cancelled
    await pair.put("undo2x", base, attempt=2, **theirs)  # another's rerun: kept
    await pair.put("done", base, finished_at=base, outcome="succeeded", **mine)  # finished
    ends = [
        ("ok", "succeeded", None, False, base + timedelta(seconds=2)),
        ("early", "failed", "boom", False, base - HOUR),
        ("late", "timed_out", "slow", False, now + HOUR),
        ("none", "succeeded", None, False, None),
        ("other", "failed", "x", False, None),
        ("undo1", None, None, True, None),
        ("undo1x", None, None, True, None),
        ("undo2", None, None, True, None),
        ("undo2x", None, None, True, None),
        ("done", "failed", "again", False, None),
        ("missing", "succeeded", None, False, None),
    ]
    keys = [pair.key() for _ in ends]
    for key in keys[:6]:
        await pair.lock(key, on="a")
    await pair.lock(keys[6], on="b")
    answer = await pair.agree(
        claims.finish_many_sql(pair.table),
        [e[0] for e in ends],
        [base] * len(ends),
        [e[1] for e in ends],
        [e[2] for e in ends],
        keys,
        [e[3] for e in ends],
        "me",
        5,
        [e[4] for e in ends],
    )
    assert sorted((r["i"], r["released"]) for r in answer)[:7] == [
        (1, True), (2, True), (3, True), (4, True), (5, True), (6, True), (7, False),
    ]  # fmt: skip


async def test_claim_then_finish_then_claim_again(pair: Pair) -> None:
    base = _base()
    keys = [pair.key(), pair.key()]
    claim, finish = claims.claim_many_sql(pair.table), claims.finish_many_sql(pair.table)
    args = (keys, ["x", "y"], [base, base], "me", 3, "h")
    await pair.agree(claim, *args)
    await pair.agree(
        finish, ["x", "y"], [base, base], ["succeeded", None], [None, None], keys,
        [False, True], "me", 3, [None, None],
    )  # fmt: skip
    # y's claim was undone: claimable again, by the other session; x ran.
    await pair.agree(claim, *args, on="b", sim_args=args)


async def test_undo_lost_gives_back_this_processs_unanswered_first_claims(pair: Pair) -> None:
    base = _base()
    await pair.put("lost", base, session="OTHER")  # claimed on the session since lost
    await pair.put("no-session", base)
    await pair.put("here", base, session="ME")  # claimed on this very session
    await pair.put("done", base, session="OTHER", finished_at=base, outcome="succeeded")
    await pair.put("rerun", base, session="OTHER", attempt=2)
    await pair.put("theirs", base, session="OTHER", host="h2")
    await pair.put("other-pid", base, session="OTHER", pid=2)
    jobs = ["lost", "no-session", "here", "done", "rerun", "theirs", "other-pid", "missing"]
    answer = await pair.agree(claims.undo_lost_sql(pair.table), jobs, [base] * 8, "h1", 1)
    assert answer == [{"undone": 2}]
    assert [r["job"] for r in await pair.real_runs()] == [
        "done", "here", "other-pid", "rerun", "theirs",
    ]  # fmt: skip


# -- late outcomes ------------------------------------------------------------------------------


async def test_late_finish(pair: Pair) -> None:
    base = _base()
    mine: dict[str, Any] = {"host": "me", "pid": 5}
    await pair.put("open", base, **mine)
    await pair.put("crashed", base, finished_at=base, outcome="crashed", error="gone", **mine)
    await pair.put("done", base, finished_at=base, outcome="succeeded", **mine)
    await pair.put("rerun", base, attempt=2, **mine)
    await pair.put("theirs", base, host="them", pid=5)
    await pair.put("nofinish", base, **mine)
    jobs = ["open", "crashed", "done", "rerun", "theirs", "nofinish", "missing"]
    end = base + timedelta(seconds=9)
    real, sim = await pair.run(
        runs.late_finish_sql(pair.table),
        jobs,
        [base] * len(jobs),
        ["failed"] * len(jobs),
        ["lost"] * len(jobs),
        [end, end, end, end, end, None, end],
        [1] * len(jobs),
        "me",
        5,
        [base + timedelta(seconds=1), None, None, None, None, base + HOUR, None],
    )
    assert real == sim
    # Written: the open ones (unmarked: nobody else reported them) and the crashed one.
    assert {(row["job"], row["unmarked"]) for row in real} == {
        ("open", True),
        ("nofinish", True),
        ("crashed", False),
    }
    assert await pair.real_runs() == pair.sim_runs()


# -- reads of runs --------------------------------------------------------------------------------


async def _history_rows(pair: Pair) -> datetime:
    base = _base()
    s = timedelta(seconds=1)
    await pair.put("a", base - 3 * HOUR, finished_at=base - 3 * HOUR + s, outcome="succeeded")
    await pair.put(
        "a", base - 2 * HOUR, finished_at=base - 2 * HOUR + s, outcome="failed", error="e"
    )
    await pair.put(
        "a",
        base - HOUR,
        finished_at=base - HOUR + s,
        outcome="crashed",
        attempt=2,
        attempts=[
            {
                "attempt": 1, "started_at": "2026-03-01T09:00:01.5+00:00", "finished_at": None,
                "outcome": "failed", "error": "x", "host": "h", "pid": 3,
            }
        ],
    )  # fmt: skip
    await pair.put("a", base)  # unfinished
    await pair.put("a", _MAX, finished_at=base, outcome="succeeded")
    await pair.put("a", _MIN, finished_at=base, outcome="succeeded")
    await pair.put("o", _MAX, finished_at=base, outcome="succeeded")
    await pair.put("u", base)
    await pair.put("f", base - HOUR, finished_at=base, outcome="timed_out", manual=True)
    await pair.put("f", base, finished_at=_MAX, outcome="succeeded")
    return base


async def test_reads_of_runs(pair: Pair) -> None:
    base = await _history_rows(pair)
    jobs = ["a", "o", "u", "f", "none", "a"]
    await pair.agree(runs.catch_up_sql(pair.table), jobs)
    for job in ("a", "o", "u", "f", "none"):
        await pair.agree(runs.last_claimed_sql(pair.table), job)
        await pair.agree(runs.last_runs_sql(pair.table), job)
        await pair.agree(runs.history_sql(pair.table), job, 10)
        await pair.agree(runs.history_sql(pair.table), job, 2)
        await pair.agree(runs.runs_page_sql(pair.table), job, 2, base - HOUR)
        await pair.agree(runs.runs_page_sql(pair.table), job, 3, None)
    await pair.agree(runs.last_runs_many_sql(pair.table), jobs)
    await pair.agree(runs.last_runs_many_sql(pair.table, ("last", "ok")), jobs)


async def test_catch_up_of_a_job_below_range(pair: Pair) -> None:
    base = _base()
    await pair.put("m", _MIN, finished_at=base, outcome="succeeded")
    await pair.agree(runs.catch_up_sql(pair.table), ["m"])


# -- retries ------------------------------------------------------------------------------------


async def test_retry_due_and_pending(pair: Pair) -> None:
    base = _base()
    await pair.put("f", base, finished_at=base, outcome="failed")
    await pair.put("t", base, finished_at=base, outcome="timed_out", attempt=2)
    await pair.put("s", base, finished_at=base, outcome="succeeded")
    await pair.put("old", base, finished_at=base, outcome="failed", retry_at=base)
    sql = crashes.retry_due_sql(pair.table)
    soon = datetime.now(UTC) + timedelta(minutes=5)
    for job, attempt, when in (
        ("f", 2, base + HOUR),
        ("f", 3, base),
        ("t", 3, soon),
        ("s", 2, base),
        ("none", 2, base),
    ):
        real, sim = await pair.run(sql, job, base, attempt, when, execute=True)
        assert real == sim
        assert await pair.real_runs() == pair.sim_runs()
    pending = crashes.retries_pending_sql(pair.table)
    for margin in (0.0, 3600.0 * 30, 3600.0 * 23):
        await pair.agree(pending, margin)
