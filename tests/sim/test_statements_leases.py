"""Agreement of the simulated server's lease-mode statements with a real PostgreSQL.

Each test puts the same rows in a real ledger (a throwaway schema) and in a simulated
server, runs the real statement and its handler with the same arguments, and compares the
answers and the rows left. The simulated clock is set to the real server's before each
statement, so instants the statements compute agree within a second.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from cronlock._sim.server import Exec, Session, SimServer
from cronlock._sim.statements.all import statements_for
from cronlock._sim.world import World
from cronlock.postgres._sql.failover import lease_reassert_sql
from cronlock.postgres._sql.leases import (
    lease_claim_many_sql,
    lease_crashed_sql,
    lease_finish_many_sql,
    lease_holders_sql,
    lease_late_finish_sql,
    lease_recover_sql,
    lease_undo_lost_sql,
    renew_sql,
)
from cronlock.postgres._sql.tables import LedgerTable

from .realserver import throwaway_ledger

pytestmark = pytest.mark.postgres

_KEYS = {"runs": ("job", "slot"), "leases": ("job",), "control": ("job",), "members": ("holder",)}
_NEG = datetime.min.replace(tzinfo=UTC)
_POS = datetime.max.replace(tzinfo=UTC)
ME, OTHER, TTL, LEASE = "me", "other", 30.0, 20.0


def _value(value: Any) -> Any:
    """A value as read from either side, made comparable: asyncpg's naive infinities made
    the model's aware ones, jsonb text parsed."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return _NEG if value.year == 1 else _POS
    if isinstance(value, str) and value[:1] in "[{":
        return json.loads(value)
    return value


def _same(real: Any, sim: Any) -> bool:
    """Equal, instants within a second (the two clocks are read apart)."""
    if isinstance(real, datetime) and isinstance(sim, datetime):
        if {real, sim} & {_NEG, _POS}:
            return real == sim
        return abs(real - sim) < timedelta(seconds=1)
    if isinstance(real, list) and isinstance(sim, list):
        return len(real) == len(sim) and all(map(_same, real, sim))
    if isinstance(real, dict) and isinstance(sim, dict):
        return real.keys() == sim.keys() and all(_same(real[k], sim[k]) for k in real)
    return bool(real == sim) and type(real) is type(sim)


class Both:
    """One ledger twice: on the real server and in a simulated one."""

    def __init__(self, conn: Any, table: LedgerTable, server: SimServer, session: Session):
        self.conn, self.table, self.server, self.session = conn, table, server, session
        self.now = datetime.now(UTC)

    async def sync(self) -> datetime:
        """Set the simulated clock to the real server's; that instant."""
        self.now = await self.conn.fetchval("SELECT clock_timestamp()")
        world = self.server.world
        self.server.skew = (self.now - world.epoch).total_seconds() - world.now
        return self.now

    async def put(self, name: str, **values: Any) -> None:
        """A row of table *name* in both (the real server fills the defaults)."""
        columns = ", ".join(values)
        marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
        quoted = getattr(self.table, name)
        row = await self.conn.fetchrow(
            f"INSERT INTO {quoted} ({columns}) VALUES ({marks}) RETURNING *", *values.values()
        )
        record = {k: _value(v) for k, v in dict(row).items()}
        key = tuple(record[k] for k in _KEYS[name])
        db = self.server.db
        db.begin(self.server.clock())
        db.put(name, key if len(key) > 1 else key[0], record)
        db.commit()

    async def run(self, sql: str, *args: Any, by: str | None = "i") -> list[dict[str, Any]]:
        """Run *sql* on both; assert the answers agree (rows sorted *by* a column, or as
        they come); the real answer."""
        await self.sync()
        real: Any
        try:
            real = [{k: _value(v) for k, v in r.items()} for r in await self.conn.fetch(sql, *args)]
        except asyncpg.PostgresError as exc:
            real = type(exc)
        handler = self.server.statements.lookup(sql)
        db = self.server.db
        db.begin(self.server.clock())
        sim: Any
        try:
            sim = [dict(r.items()) for r in handler(Exec(self.server, self.session), args)]
        except asyncpg.PostgresError as exc:
            db.rollback()
            sim = type(exc)
        else:
            db.commit()
        if isinstance(real, list) and isinstance(sim, list) and by is not None:
            real.sort(key=lambda r: r[by])
            sim.sort(key=lambda r: r[by])
        assert _same(real, sim), f"\nreal {real}\nsim  {sim}"
        await self.check_tables()
        return real if isinstance(real, list) else []

    async def check_tables(self) -> None:
        """The runs and leases tables hold the same rows on both."""
        for name in ("runs", "leases"):
            quoted = getattr(self.table, name)
            real = [
                {k: _value(v) for k, v in r.items()}
                for r in await self.conn.fetch(f"SELECT * FROM {quoted}")
            ]
            sim = [
                {k: _value(v) for k, v in r.items()} for r in self.server.db.table(name).values()
            ]
            order = _KEYS[name]
            real.sort(key=lambda r: tuple(r[k] for k in order))
            sim.sort(key=lambda r: tuple(r[k] for k in order))
            assert _same(real, sim), f"{name}\nreal {real}\nsim  {sim}"


@pytest.fixture
async def both() -> AsyncIterator[Both]:
    name = f"agree_leases_{secrets.token_hex(4)}"
    async with throwaway_ledger(name, sessions=1, table=name) as (table, (conn,)):
        world = World(1)
        world.server = server = SimServer(world, statements_for(table))
        pair = Both(conn, table, server, server.open_session("t", lambda reason: None))
        await pair.sync()
        yield pair


def _slot(both: Both, seconds: int) -> datetime:
    """A whole second *seconds* from the real server's clock."""
    return both.now.replace(microsecond=0) + timedelta(seconds=seconds)


async def _claim(both: Both, *pairs: tuple[str, datetime]) -> list[dict[str, Any]]:
    jobs = [job for job, _ in pairs]
    slots = [slot for _, slot in pairs]
    keys = list(range(1, len(pairs) + 1))
    sql = lease_claim_many_sql(both.table)
    return await both.run(sql, keys, jobs, slots, "h1", 11, ME, LEASE)


async def _finished_run(both: Both, job: str, slot: datetime, **more: Any) -> None:
    values = {"host": "h2", "pid": 22, "started_at": slot, "finished_at": slot}
    values |= {"outcome": "succeeded", "holder": OTHER} | more
    await both.put("runs", job=job, slot=slot, **values)


# -- claims ------------------------------------------------------------------------------------


async def test_claim_granted_on_an_empty_ledger(both: Both) -> None:
    s = _slot(both, 5)
    [row] = await _claim(both, ("a", s))
    assert row["got"] and row["started_at"] == s and not row["stray"]


async def test_claim_refused_by_a_live_lease_tells_the_latest_run(both: Both) -> None:
    s = _slot(both, 5)
    await _finished_run(both, "a", s - timedelta(seconds=60))
    await _finished_run(both, "a", s + timedelta(seconds=60))  # after the slot: not told
    await both.put("leases", job="a", slot=s - timedelta(seconds=5), holder=OTHER,
                   expires_at=both.now + timedelta(hours=1))  # fmt: skip
    [row] = await _claim(both, ("a", s))
    assert not row["got"] and row["p_slot"] == s - timedelta(seconds=60)


async def test_claim_granted_when_the_lease_expired_or_is_ours(both: Both) -> None:
    s = _slot(both, 5)
    old = s - timedelta(seconds=10)
    await both.put("leases", job="a", slot=old, holder=OTHER,
                   expires_at=both.now - timedelta(hours=1), attempt=2)  # fmt: skip
    await both.put("leases", job="b", slot=old, holder=ME,
                   expires_at=both.now + timedelta(hours=1))  # fmt: skip
    await both.put("leases", job="c", slot=old, holder=OTHER, expires_at=_NEG)
    answers = await _claim(both, ("a", s), ("b", s), ("c", s))
    assert all(row["got"] for row in answers)
    # Taken over from another holder that let its lease lapse unreleased: told whose, for
    # which slot, when it lapsed and its last renewal (a lease of this length before).
    lapsed = answers[0]
    assert (lapsed["gone_slot"], lapsed["gone_holder"]) == (old, OTHER)
    assert lapsed["gone_since"] == lapsed["gone_expired"] - timedelta(seconds=LEASE)
    # Ours (a release lost), or released: nobody gone.
    assert answers[1]["gone_slot"] is None and answers[2]["gone_slot"] is None


async def test_claim_of_a_slot_that_ran_or_whose_lease_names_it(both: Both) -> None:
    s = _slot(both, -5)
    await _finished_run(both, "a", s)
    await both.put(
        "leases", job="b", slot=s, holder=OTHER, expires_at=both.now - timedelta(hours=1)
    )
    answers = await _claim(both, ("a", s), ("b", s))
    assert answers[0]["ran"] and answers[0]["p_slot"] == s
    assert not answers[1]["ran"] and not answers[1]["got"]


async def test_claim_of_a_paused_job_and_of_its_triggered_slot(both: Both) -> None:
    s = _slot(both, 5)
    await both.put("control", job="a", paused_at=both.now)
    await both.put("control", job="b", paused_at=both.now, trigger_slot=s)
    await both.put("control", job="c", trigger_slot=s)
    answers = await _claim(both, ("a", s), ("b", s), ("c", s))
    assert [(r["paused"], r["got"]) for r in answers] == [
        (True, False),
        (False, True),
        (False, True),
    ]


async def test_claim_batch_of_one_job_joins_the_lease_on_the_job(both: Both) -> None:
    # A slot that ran and a free one of the same job: the free one takes the lease, and
    # the one that ran is answered got (and stray): the lease is joined on the job alone.
    s = _slot(both, 5)
    await _finished_run(both, "a", s - timedelta(seconds=1))
    answers = await _claim(both, ("a", s - timedelta(seconds=1)), ("a", s))
    assert answers[0]["stray"] and answers[1]["got"]


async def test_claim_of_two_free_slots_of_one_job_fails(both: Both) -> None:
    s = _slot(both, 5)
    assert await _claim(both, ("a", s), ("a", s + timedelta(seconds=1))) == []
    # The same slots, the lease already naming the first: the first leaves it alone.
    await both.put("leases", job="a", slot=s, holder=ME, expires_at=_NEG)
    await _claim(both, ("a", s), ("a", s + timedelta(seconds=1)))


# -- takeovers ---------------------------------------------------------------------------------


async def _recover(both: Both, job: str, slot: datetime, attempt: int) -> list[dict[str, Any]]:
    sql = lease_recover_sql(both.table)
    return await both.run(sql, 7, job, slot, "h1", 11, ME, LEASE, attempt, by=None)


async def test_recover_takes_a_crashed_run_over(both: Both) -> None:
    s = _slot(both, -30)
    await _finished_run(both, "a", s, outcome="crashed", error="gone", attempts='[{"x": 1}]')
    await both.put(
        "leases", job="a", slot=s, holder=OTHER, expires_at=both.now - timedelta(seconds=1)
    )
    [row] = await _recover(both, "a", s, 2)
    assert row["got"] and row["started_at"] is not None and not row["stray"]


async def test_recover_refused_by_a_live_lease_or_a_pause(both: Both) -> None:
    s = _slot(both, -30)
    await _finished_run(both, "a", s, outcome="crashed")
    await _finished_run(both, "b", s, outcome="failed")
    await both.put(
        "leases", job="a", slot=s, holder=OTHER, expires_at=both.now + timedelta(hours=1)
    )
    await both.put("control", job="b", paused_at=both.now, trigger_slot=s)
    assert not (await _recover(both, "a", s, 2))[0]["got"]
    assert (await _recover(both, "b", s, 2))[0]["paused"]


async def test_recover_of_a_row_that_cannot_be_taken_over_is_stray(both: Both) -> None:
    s = _slot(both, -30)
    await _finished_run(both, "a", s)  # succeeded
    await _finished_run(both, "b", s, outcome="crashed", attempt=2)  # a rerun crashed
    assert (await _recover(both, "a", s, 2))[0]["stray"]
    assert (await _recover(both, "b", s, 3))[0]["stray"]
    assert (await _recover(both, "c", s, 2))[0]["stray"]  # no row at all


# -- renewals, ends ---------------------------------------------------------------------------


async def test_renew_only_this_holders_live_leases_of_those_slots(both: Both) -> None:
    s = _slot(both, -5)
    live = both.now + timedelta(seconds=3)
    await both.put("leases", job="a", slot=s, holder=ME, expires_at=live)
    await both.put("leases", job="b", slot=s, holder=ME, expires_at=both.now - timedelta(seconds=1))
    await both.put("leases", job="c", slot=s, holder=OTHER, expires_at=live)
    await both.put("leases", job="d", slot=s - timedelta(seconds=1), holder=ME, expires_at=live)
    jobs = ["a", "b", "c", "d", "a"]
    answers = await both.run(renew_sql(both.table), jobs, [s] * 5, ME, LEASE, by="job")
    assert [row["job"] for row in answers] == ["a"]


async def test_finish_writes_outcomes_undoes_claims_and_releases(both: Both) -> None:
    s = _slot(both, -5)
    live = both.now + timedelta(seconds=10)
    for job in "abcde":
        attempt = 2 if job == "d" else 1
        await both.put("runs", job=job, slot=s, host="h1", pid=11, started_at=s, holder=ME,
                       attempt=attempt)  # fmt: skip
    await both.put("leases", job="a", slot=s, holder=ME, expires_at=live)
    await both.put("leases", job="b", slot=s, holder=ME, expires_at=live)  # undone
    await both.put("leases", job="c", slot=s, holder=OTHER, expires_at=live)  # taken over
    await both.put("leases", job="d", slot=s, holder=ME, expires_at=both.now - timedelta(seconds=9))
    jobs = ["a", "b", "c", "d", "e"]
    outcomes = ["succeeded", None, "failed", None, "succeeded"]
    errors = [None, None, "boom", None, None]
    undo = [False, True, False, True, False]
    started = [s + timedelta(seconds=1), None, None, None, s - timedelta(seconds=9)]
    sql = lease_finish_many_sql(both.table)
    args = (jobs, [s] * 5, outcomes, errors, [1, 2, 3, 4, 5], undo, "h1", 11, started, ME)
    answers = await both.run(sql, *args)
    assert [row["released"] for row in answers] == [True, True, False, True, False]


async def test_undo_lost_deletes_unanswered_claims_and_frees_their_leases(both: Both) -> None:
    s = _slot(both, -5)
    live = both.now + timedelta(seconds=10)
    for job in "abcd":
        await both.put("runs", job=job, slot=s, host="h1", pid=11, started_at=s, holder=ME,
                       attempt=2 if job == "c" else 1)  # fmt: skip
    await both.put("runs", job="e", slot=s, host="h1", pid=11, started_at=s, holder=ME,
                   finished_at=s, outcome="succeeded")  # fmt: skip
    await both.put("leases", job="a", slot=s, holder=ME, expires_at=live)  # freed
    await both.put("leases", job="b", slot=s, holder=OTHER, expires_at=live)  # not ours
    await both.put("leases", job="c", slot=s, holder=ME, expires_at=live)  # a rerun's
    await both.put("leases", job="d", slot=s - timedelta(seconds=1), holder=ME, expires_at=live)
    sql = lease_undo_lost_sql(both.table)
    answers = await both.run(sql, ["a", "b", "c", "d", "e", "f"], [s] * 6, "h1", 11, ME, by=None)
    assert answers == [{"undone": 3}]  # a, b and d; not c (a rerun), e (finished), f (none)


async def test_late_finish_writes_over_a_crash_and_releases(both: Both) -> None:
    s = _slot(both, -60)
    await both.put("runs", job="a", slot=s, host="h1", pid=11, started_at=s, holder=ME,
                   finished_at=s + timedelta(seconds=5), outcome="crashed")  # fmt: skip
    await both.put("runs", job="b", slot=s, host="h1", pid=11, started_at=s, holder=ME, attempt=2)
    await both.put("leases", job="a", slot=s, holder=ME, expires_at=both.now - timedelta(hours=1))
    await both.put(
        "leases", job="b", slot=s, holder=OTHER, expires_at=both.now + timedelta(hours=1)
    )
    end = s + timedelta(seconds=3)
    args = (["a", "b"], [s, s], ["succeeded", "failed"], [None, "x"], [end, end], [1, 1],
            "h1", 11, [s + timedelta(seconds=1), None], ME)  # fmt: skip
    [row] = await both.run(lease_late_finish_sql(both.table), *args, by=None)
    assert (row["job"], row["unmarked"]) == ("a", False)  # written over the crash mark


# -- crashes, holders, failover --------------------------------------------------------------


async def test_crashed_marks_runs_whose_lease_and_owner_are_gone(both: Both) -> None:
    long_ago, s = both.now - timedelta(hours=1), _slot(both, -3600)
    gone = both.now - timedelta(minutes=5)
    await both.put("members", holder=ME, fleet="f", expires_at=both.now + timedelta(hours=1),
                   since=long_ago)  # fmt: skip
    await both.put("members", holder="alive", fleet="f", expires_at=both.now + timedelta(hours=1))
    await both.put("members", holder="dead", fleet="f", expires_at=gone)
    for job, holder in [("a", None), ("b", "dead"), ("c", "alive"), ("d", "dead"), ("e", ME),
                        ("f", "dead"), ("g", "dead")]:  # fmt: skip
        await both.put("runs", job=job, slot=s, host="h9", pid=9, started_at=long_ago,
                       holder=holder)  # fmt: skip
    await both.put(
        "leases", job="d", slot=s, holder="dead", expires_at=both.now + timedelta(hours=1)
    )
    await both.put("leases", job="f", slot=s, holder=ME, expires_at=gone)  # ours: left to us
    await both.put(
        "leases",
        job="g",
        slot=s - timedelta(seconds=1),
        holder="dead",
        expires_at=both.now + timedelta(hours=1),
    )  # another slot's: no matter
    answers = await both.run(lease_crashed_sql(both.table), "h1", 11, ME, TTL, by="job")
    assert [row["job"] for row in answers] == ["a", "b", "g"]
    assert await both.run(lease_crashed_sql(both.table), None, 11, ME, TTL) == []


async def test_holders_are_the_live_leases(both: Both) -> None:
    s = _slot(both, -5)
    await both.put("runs", job="a", slot=s, host="h1", pid=11, started_at=s)
    await both.put("leases", job="a", slot=s, holder=ME, expires_at=both.now + timedelta(hours=1))
    await both.put("leases", job="b", slot=_POS, holder=OTHER, expires_at=_POS)
    await both.put("leases", job="c", slot=s, holder=ME, expires_at=_NEG)
    answers = await both.run(lease_holders_sql(both.table), by="job")
    assert [(row["job"], row["pid"]) for row in answers] == [("a", 11), ("b", None)]


async def test_reassert_releases_lost_releases_and_takes_back_runs_in_flight(both: Both) -> None:
    s = _slot(both, -5)
    live, dead = both.now + timedelta(hours=1), both.now - timedelta(hours=1)
    await both.put("leases", job="a", slot=s, holder=OTHER, expires_at=live)
    await both.put("leases", job="b", slot=s, holder=ME, expires_at=live)  # ended here
    await both.put("leases", job="d", slot=s, holder=ME, expires_at=dead)
    await both.put("leases", job="e", slot=s, holder=OTHER, expires_at=dead)
    await both.put("leases", job="f", slot=s - timedelta(seconds=1), holder=ME, expires_at=live)
    # Granted since the lists were made: a live run stands on it (not in flight yet, nor
    # ended), and on "h" a later attempt than the one that ended.
    await both.put("leases", job="g", slot=s, holder=ME, expires_at=live)
    await both.put("leases", job="h", slot=s, holder=ME, expires_at=live, attempt=2)
    jobs = ["f", "a", "c", "d", "e"]
    ended = (["b", "f", "g", "h"], [s, s, s - timedelta(seconds=9), s], [1, 1, 1, 1])
    sql = lease_reassert_sql(both.table)
    [row] = await both.run(sql, ME, jobs, [s] * 5, [1, 1, 2, 1, 1], LEASE, *ended, by=None)
    assert row["released"] == 1 and row["kept"] == ["c", "d", "e", "f"]
    expiry = f"SELECT job, expires_at FROM {both.table.leases} WHERE job = ANY($1)"
    found = {job: _value(at) for job, at in await both.conn.fetch(expiry, ["b", "g", "h"])}
    assert found == {"b": _NEG, "g": live, "h": live}  # (and the model agrees)
    # Nothing ended: nothing is released. One job twice: refused twice, fine; inserted,
    # then met again, an error.
    [row] = await both.run(sql, ME, ["a", "a"], [s, s], [1, 1], LEASE, [], [], [], by=None)
    assert row["released"] == 0 and row["kept"] == []
    ended = (["c", "d", "e", "f"], [s, s, s, s], [2, 1, 1, 1])
    [row] = await both.run(sql, ME, ["a"], [s], [1], LEASE, *ended, by=None)
    assert row["released"] == 4 and row["kept"] == []
    assert await both.run(sql, ME, ["g", "g"], [s, s], [1, 1], LEASE, [], [], [], by=None) == []
