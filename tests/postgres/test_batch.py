"""Runs due together share their round trips: batched claims and ends, against a real server.

Each test would fail if every job paid its own round trip: the locker's statement counter
(one per round trip on its lock sessions) is compared with the number of jobs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from cronlock import LockError, RunContext, RunRecord, Scheduler, every
from cronlock.postgres import FleetControl, PostgresHold, PostgresLocker

pytestmark = pytest.mark.postgres

LocksHeld = Callable[[Iterable[str]], Awaitable[int]]
SLOT = datetime(2030, 1, 1, 3, 0, tzinfo=UTC)


def names(count: int) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return [f"batch-{tag}-{i}" for i in range(count)]


def locker(dsn: str, app: str, **options: Any) -> PostgresLocker:
    options.setdefault("heartbeat", None)  # no upkeep statements in the counts
    # What one batch carries, without the fair race's lanes (tested on their own below).
    options.setdefault("spread", 0)
    return PostgresLocker(dsn, application_name=app, **options)


async def hold_row(conn: Any, lk: PostgresLocker, job: str) -> Any:
    """An uncommitted ledger row for (*job*, SLOT) on *conn*; a claim inserting it waits.
    Returns the open transaction (roll it back to let the claim go on)."""
    table = lk.ledger
    assert table is not None
    tx = conn.transaction()
    await tx.start()
    await conn.execute(
        f"INSERT INTO {table.runs} (job, slot, host, pid) VALUES ($1, $2, 'x', 0)", job, SLOT
    )
    return tx


async def acquire_all(lk: PostgresLocker, jobs: list[str], slot: datetime = SLOT) -> list[Any]:
    return list(await asyncio.gather(*(lk.acquire(job, slot) for job in jobs)))


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "lock-only"])
async def test_claims_and_releases_due_together_share_one_statement(
    pg_dsn: str, app_name: str, locks_held: LocksHeld, ledger: bool
) -> None:
    jobs = names(200)
    async with locker(pg_dsn, app_name, sessions=2, ledger=ledger) as lk:
        await lk.last_claimed(jobs[0])  # open one session before counting
        before = lk.statistics().statements
        leases = await acquire_all(lk, jobs)
        claimed = lk.statistics().statements - before
        assert all(isinstance(lease, PostgresHold) for lease in leases)
        assert await locks_held(jobs) == len(jobs)
        before = lk.statistics().statements
        await asyncio.gather(*(lease.release() for lease in leases))
        released = lk.statistics().statements - before
        assert await locks_held(jobs) == 0
        # Two sessions: one claim statement and one release statement each (not 200).
        assert claimed <= 2, claimed
        assert released <= 2, released
        # A run alone still costs one round trip each way, without waiting for company.
        before = lk.statistics().statements
        lease = await lk.acquire(jobs[0], SLOT + timedelta(minutes=1))
        assert isinstance(lease, PostgresHold)
        await lease.release()
        assert lk.statistics().statements - before == 2


async def test_a_burst_across_three_lockers_runs_each_slot_exactly_once(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    jobs = names(600)
    granted: list[str] = []

    async def replica(lk: PostgresLocker) -> None:
        async def one(job: str) -> None:
            lease = await lk.acquire(job, SLOT)
            if isinstance(lease, PostgresHold):
                granted.append(job)
                await asyncio.sleep(0.01)
                await lease.release()

        await asyncio.gather(*(one(job) for job in jobs))

    lockers = [locker(pg_dsn, f"{app_name}-{i}", sessions=2) for i in range(3)]
    try:
        await asyncio.gather(*(replica(lk) for lk in lockers))
        # A lagging replica coming later finds every slot claimed.
        late = await acquire_all(lockers[0], jobs)
        stats = [lk.statistics() for lk in lockers]
    finally:
        for lk in lockers:
            await lk.close()
    assert sorted(granted) == sorted(jobs)  # each slot once, none missed
    assert set(late) == {"already_ran"}
    assert sum(s.granted for s in stats) == len(jobs)
    assert sum(s.statements for s in stats) < len(jobs)  # far fewer round trips than runs
    assert await locks_held(jobs) == 0


async def test_the_fair_race_spreads_a_burst_over_the_replicas(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    # With the race on (the default), one instant's jobs are won lane by lane: a burst is
    # shared out, not run wholly by the replica that drew the shortest wait.
    jobs = names(600)
    # One session each, so without lanes one draw per replica would decide the whole burst;
    # a wide spread, so that the draws, not the statements' overlap, decide.
    lockers = [locker(pg_dsn, f"{app_name}-{i}", sessions=1, spread=0.5) for i in range(3)]
    bursts: list[list[int]] = []
    try:
        for lk in lockers:  # sessions open, as in a running replica (connecting takes longer)
            warm = names(20)  # (another slot: the race's draws are per slot and lane)
            for lease in await acquire_all(lk, warm, SLOT - timedelta(days=1)):
                assert isinstance(lease, PostgresHold)
                await lease.release()
            assert lk.statistics().sessions_open == 1
        statements = 0
        # Up to three bursts (three slots), until one is shared: on a loaded machine one
        # replica's claims can start late enough to lose every lane, now and then; without
        # lanes one replica wins every burst whole.
        for attempt in range(3):
            slot = SLOT + timedelta(minutes=attempt)
            before = sum(lk.statistics().statements for lk in lockers)
            answers = await asyncio.gather(*(acquire_all(lk, jobs, slot) for lk in lockers))
            statements += sum(lk.statistics().statements for lk in lockers) - before
            won = [sum(isinstance(a, PostgresHold) for a in mine) for mine in answers]
            for mine in answers:
                for lease in mine:
                    if isinstance(lease, PostgresHold):
                        await lease.release()
            bursts.append(won)
            assert sum(won) == len(jobs), won  # each slot once, none missed
            if sorted(won)[-2] > 0:
                break
    finally:
        for lk in lockers:
            await lk.close()
    # Eight lanes, each won by the shortest of three draws: one replica winning them all
    # has a chance of 3 / 3**8 (about 1 in 2,000) a burst; without lanes, it is certain.
    assert sorted(bursts[-1])[-2] > 0, bursts
    assert statements < len(bursts) * len(jobs) / 4  # still batched: a few claims a lane
    assert await locks_held(jobs) == 0


async def test_the_fair_race_sends_a_few_claim_statements_per_instant_whatever_the_sessions(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    # The race's lanes are the locker's, not each session's: four sessions do not
    # multiply the claim statements one instant costs (each is a fixed share of the
    # server's time, which every replica's claims wait for when all of them claim at once).
    jobs = names(200)
    # A wide spread: no two lanes' gates open while the same statement is in flight.
    async with locker(pg_dsn, app_name, sessions=4, spread=0.5) as lk:
        warm = names(40)  # every session open (another slot)
        for lease in await acquire_all(lk, warm, SLOT - timedelta(days=1)):
            assert isinstance(lease, PostgresHold)
            await lease.release()
        assert lk.statistics().sessions_open == 4
        before = lk.statistics().statements
        leases = await acquire_all(lk, jobs)
        statements = lk.statistics().statements - before
        assert all(isinstance(lease, PostgresHold) for lease in leases)
        for lease in leases:
            await lease.release()
    assert statements <= 8, statements  # eight lanes (with lanes per session: ~32)
    assert await locks_held(jobs) == 0


async def test_claims_waiting_on_a_session_go_before_ends_waiting_on_it(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    # A claim stands between a due slot and its run's start; an end only between a
    # finished run and its unlock. When both wait behind a statement, the claim goes first.
    held, blocked, later = names(3)
    blocker = await asyncpg.connect(pg_dsn)
    done: list[str] = []
    try:
        async with locker(pg_dsn, app_name, sessions=1) as lk:
            lease = await lk.acquire(held, SLOT)
            assert isinstance(lease, PostgresHold)
            tx = await hold_row(blocker, lk, blocked)  # its claim's insert waits on it
            before = lk.statistics().statements
            claiming = asyncio.create_task(lk.acquire(blocked, SLOT))
            while lk.statistics().statements == before:
                await asyncio.sleep(0)
            # Behind that statement: first an end (releasing), then a claim.
            releasing = asyncio.create_task(lease.release())
            releasing.add_done_callback(lambda _: done.append("end"))
            batcher = lk._claims[0].batcher
            while not batcher._ends:
                await asyncio.sleep(0)
            claiming_later = asyncio.create_task(lk.acquire(later, SLOT))
            claiming_later.add_done_callback(lambda _: done.append("claim"))
            while not batcher._claims:
                await asyncio.sleep(0)
            assert not claiming.done()
            await tx.rollback()  # the blocked statement goes on, then the two waiting
            first, second = await asyncio.gather(claiming, claiming_later)
            await releasing
            for lease in (first, second):
                assert isinstance(lease, PostgresHold)
                await lease.release()
    finally:
        await blocker.close()
    assert done == ["claim", "end"]
    assert await locks_held([held, blocked, later]) == 0


async def test_a_caller_cancelled_inside_a_batch_gives_its_slot_back(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    jobs = names(50)
    victim = jobs[7]
    async with locker(pg_dsn, app_name, sessions=1) as lk, locker(pg_dsn, app_name + "-b") as other:
        await lk.last_claimed(victim)
        before = lk.statistics().statements
        tasks = {job: asyncio.create_task(lk.acquire(job, SLOT)) for job in jobs}
        # Let the batch go out (the flush starts at the next turn), then cancel one caller
        # while the statement is in flight.
        while lk.statistics().statements == before:
            await asyncio.sleep(0)
        assert not any(task.done() for task in tasks.values())
        tasks[victim].cancel()
        results = await asyncio.gather(*tasks.values(), return_exceptions=True)
        outcome = dict(zip(tasks, results, strict=True))
        assert isinstance(outcome[victim], asyncio.CancelledError)
        kept = [lease for job, lease in outcome.items() if job != victim]
        assert all(isinstance(lease, PostgresHold) for lease in kept)
        # The others hold their locks; the victim's lock and claim were given back.
        assert await locks_held([victim]) == 0
        assert await locks_held(jobs) == len(jobs) - 1
        assert await lk.history(victim) == []
        lease = await other.acquire(victim, SLOT)  # another replica may still run the slot
        assert isinstance(lease, PostgresHold)
        await lease.release()
        for held in kept:
            assert isinstance(held, PostgresHold)
            await held.release()
    assert await locks_held(jobs) == 0


async def test_a_session_killed_during_a_batched_claim(
    pg_dsn: str, app_name: str, admin: Any, locks_held: LocksHeld
) -> None:
    """The batch is retried once on a fresh session; no lock is left held by nobody; the
    leases granted are live, and a later kill marks them all lost."""
    jobs = names(40)
    blocker = await asyncpg.connect(pg_dsn)
    async with locker(pg_dsn, app_name, sessions=1) as lk:
        await lk.last_claimed(jobs[0])  # the session and the ledger exist
        tx = await hold_row(blocker, lk, jobs[3])  # the batch's insert waits on it
        pending = asyncio.create_task(acquire_all(lk, jobs))
        pid = None
        for _ in range(500):  # the batch waits on the row lock
            pid = await admin.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                "AND wait_event_type = 'Lock'",
                app_name,
            )
            if pid is not None:
                break
            await asyncio.sleep(0.01)
        assert pid is not None
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        await tx.rollback()
        await blocker.close()
        results = await asyncio.wait_for(pending, 30)
        leases = [r for r in results if isinstance(r, PostgresHold)]
        assert len(leases) == len(jobs)  # retried on a fresh session: all granted
        assert lk.statistics().sessions_opened == 2
        assert await locks_held(jobs) == len(jobs)
        assert not any(lease.lost for lease in leases)
        # Killing the session that holds them now loses every one of them.
        pid = await admin.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", app_name
        )
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        for _ in range(500):
            if all(lease.lost for lease in leases):
                break
            await asyncio.sleep(0.01)
        assert all(lease.lost for lease in leases)
        for lease in leases:
            await lease.release()
    assert await locks_held(jobs) == 0


async def test_a_losing_replica_learns_the_outcome_from_its_refusal(
    pg_dsn: str, app_name: str
) -> None:
    job = names(1)[0]
    async with locker(pg_dsn, app_name + "-a") as a, locker(pg_dsn, app_name + "-b") as b:
        lease = await a.acquire(job, SLOT)
        assert isinstance(lease, PostgresHold)
        lease.record(RunRecord(SLOT, SLOT, SLOT + timedelta(seconds=1), "succeeded"))
        await lease.release()
        await b.last_claimed(job)  # open b's session
        before = b.statistics().statements
        assert await b.acquire(job, SLOT) == "already_ran"
        told = b.refusal_history(job)
        assert b.statistics().statements - before == 1  # the claim, and no read
        assert told is not None
        last, success = told
        assert last is not None and last.slot == SLOT and last.outcome == "succeeded"
        assert success == last
        assert b.refusal_history(job) is None  # told once
        # The next slot, refused while a runs it: b learns the previous slot's outcome.
        lease = await a.acquire(job, SLOT + timedelta(minutes=1))
        assert await b.acquire(job, SLOT + timedelta(minutes=1)) in ("locked", "already_ran")
        told = b.refusal_history(job)
        assert told is not None and told[0] is not None and told[0].slot == SLOT
        assert isinstance(lease, PostgresHold)
        await lease.release()


async def test_catch_up_reads_in_one_batch_and_warns_only_of_missed_slots(
    pg_dsn: str, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Three groups of hourly jobs whose previous slot fell 10 s before the start: claimed
    (nothing to do), unclaimed but within grace (run, no warning: it may have been in
    flight), and unclaimed with older slots past grace too (run, and a warning naming the
    truly missed slots only)."""
    now = datetime.now(UTC)
    previous = now.replace(microsecond=0) - timedelta(seconds=10)
    schedule = every(3600, anchor=previous)
    claimed, recent, missed = names(100), names(100), names(10)
    ran: list[tuple[str, datetime]] = []

    async def task(name: str, ctx: RunContext) -> None:
        ran.append((name, ctx.slot))

    async with locker(pg_dsn, app_name) as lk:
        await lk.last_claimed(claimed[0])  # the ledger exists
        table = lk.ledger
        assert table is not None
        rows = (
            [(job, previous) for job in claimed]
            + [(job, previous - timedelta(hours=1)) for job in recent]
            + [(job, previous - timedelta(hours=3)) for job in missed]
        )
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.executemany(
                f"INSERT INTO {table.runs} (job, slot, host, pid, finished_at, outcome) "
                "VALUES ($1, $2, 'elsewhere', 1, $2, 'succeeded')",
                rows,
            )
        finally:
            await conn.close()
        scheduler = Scheduler(locker=lk)
        for name in claimed + recent + missed:
            scheduler.add_job(task, schedule, name=name, args=(name,))
        before = lk.statistics().statements
        with caplog.at_level(logging.INFO, logger="cronlock"):
            await scheduler.start()
            for _ in range(1000):
                if len(ran) >= len(recent) + len(missed) and not lk.statistics().held:
                    break
                await asyncio.sleep(0.01)
            statements = lk.statistics().statements - before
            await scheduler.shutdown()
    assert sorted(ran) == sorted((name, previous) for name in recent + missed)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    passed = [m for m in warned if "passed while no replica ran them" in m]
    assert len(passed) == len(missed)
    assert all(any(repr(name) in m for m in passed) for name in missed)
    span = f"{(previous - timedelta(hours=2)).isoformat()} .. "
    assert all(span in m for m in passed)  # the slots past grace, not the one that ran
    # Catch-up's records carry the job, the slot it runs and the replica as attributes.
    caught = [r for r in caplog.records if r.name == "cronlock" and "catching up" in r.msg]
    assert sorted(r.job for r in caught) == sorted(recent + missed)  # type: ignore[attr-defined]
    assert {r.slot for r in caught} == {previous.isoformat()}  # type: ignore[attr-defined]
    assert all(r.replica for r in caught)  # type: ignore[attr-defined]
    # One read for the 210 jobs, and the 110 catch-up runs claimed and ended in batches.
    assert statements < 30, statements


def test_a_burst_across_three_replica_processes_runs_each_slot_once(pg_dsn: str) -> None:
    """Three real replica processes, 1,500 jobs due at one instant: each slot runs exactly
    once fleet-wide, and no replica pays anything like a round trip per job."""
    jobs, tag = 1500, f"burst-{uuid.uuid4().hex[:8]}"
    at = int(time.time()) + 6
    script = Path(__file__).with_name("burst_replica.py")
    command = [sys.executable, str(script), pg_dsn, "--jobs", str(jobs), "--at", str(at)]
    procs = [
        subprocess.Popen(
            [*command, "--tag", tag],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [json.loads(proc.communicate(timeout=120)[0]) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    ran = [tuple(pair) for out in outputs for pair in out["ran"]]
    assert len(ran) == jobs  # no duplicate, no miss
    assert {name for name, _ in ran} == {f"{tag}-{i}" for i in range(jobs)}
    assert {slot for _, slot in ran} == {float(at)}
    # Claims and ends of 1,500 jobs over 4 sessions: a few dozen statements per replica.
    assert all(out["statements"] < jobs / 10 for out in outputs), outputs


async def test_a_row_the_server_would_refuse_does_not_fail_its_batch(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    jobs = names(20)
    bad = "bad\x00name"
    async with locker(pg_dsn, app_name, sessions=1) as lk:
        results = await asyncio.gather(
            *(lk.acquire(job, SLOT) for job in [*jobs[:10], bad, *jobs[10:]]),
            return_exceptions=True,
        )
        failed = results.pop(10)
        assert isinstance(failed, LockError)
        assert "NUL" in str(failed)
        assert all(isinstance(lease, PostgresHold) for lease in results)
        for lease in results:
            assert isinstance(lease, PostgresHold)
            await lease.release()
    assert await locks_held(jobs) == 0


async def test_a_batch_refuses_only_its_paused_jobs_and_runs_their_triggered_slot(
    pg_dsn: str, app_name: str
) -> None:
    """Claims sent in one statement: a job paused fleet-wide is refused ``"paused"`` (no lock
    tried), the others are granted, and the paused job's triggered slot is still claimed."""
    paused, others = names(1), names(50)
    async with locker(pg_dsn, app_name) as lk:
        await lk.last_claimed(others[0])  # the ledger exists
        table = lk.ledger
        assert table is not None
        async with FleetControl(pg_dsn, table=table.table) as control:
            await control.pause(paused[0], force=True)
            await control.trigger(paused[0], force=True)
            conn = await asyncpg.connect(pg_dsn)
            try:
                triggered = await conn.fetchval(
                    f"SELECT trigger_slot FROM {table.control} WHERE job = $1", paused[0]
                )
            finally:
                await conn.close()
            before = lk.statistics().statements
            answers = await acquire_all(lk, paused + others)
            assert lk.statistics().statements - before <= lk.statistics().sessions  # one each
            assert answers[0] == "paused"
            assert all(isinstance(lease, PostgresHold) for lease in answers[1:])
            lease = await lk.acquire(paused[0], triggered)
            assert isinstance(lease, PostgresHold)
            await asyncio.gather(*(lease.release() for lease in [lease, *answers[1:]]))
            await control.resume(paused[0], force=True)
            resumed = await lk.acquire(paused[0], SLOT + timedelta(hours=1))
            assert isinstance(resumed, PostgresHold)
            await resumed.release()


async def test_a_batch_interrupted_mid_statement_answers_its_claims_and_drops_the_session(
    pg_dsn: str, app_name: str, locks_held: LocksHeld
) -> None:
    # The flush task is cancelled only when the event loop is torn down around it (a
    # program that returns without shutting its scheduler down). The claims in the
    # statement being sent must still be answered, or their callers, which wait
    # uncancellably, never end (and asyncio.run with them); and that statement may have
    # taken their locks, so the session must go, or the locks outlive the batch.
    [job] = names(1)
    admin = await asyncpg.connect(pg_dsn)
    try:
        async with locker(pg_dsn, app_name, sessions=1, spread=0) as lk:
            await lk.last_claimed(job)  # the session is open and the ledger made
            assert lk.ledger is not None
            opened = lk.statistics().sessions_opened
            # An uncommitted row of the same slot: the claim takes the lock, then its
            # INSERT waits on that row.
            blocker = admin.transaction()
            await blocker.start()
            await admin.execute(
                f"INSERT INTO {lk.ledger.runs} (job, slot, host, pid) VALUES ($1, $2, 'x', 0)",
                job,
                SLOT,
            )
            batcher = lk._claims[0].batcher
            answer = batcher.claim(job, lk.lock_key(job), SLOT)
            for _ in range(600):
                waiting = await admin.fetchval(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE application_name = $1 AND wait_event_type = 'Lock'",
                    lk.application_name,
                )
                if waiting:
                    break
                await asyncio.sleep(0.05)
            assert waiting, "the claim never waited on the row"
            assert await locks_held([job]) == 1
            flush = batcher._flush
            assert flush is not None
            flush.cancel()
            await asyncio.wait({flush})
            try:
                await asyncio.wait({answer}, timeout=10)
                assert answer.done(), "a claim of the interrupted batch was never answered"
                with pytest.raises(LockError, match="interrupted"):
                    answer.result()
            finally:
                answer.cancel()  # before the fix: nobody would ever answer it
            await blocker.rollback()
            # The session that may hold its locks was dropped: the server released them.
            for _ in range(100):
                if not await locks_held([job]):
                    break
                await asyncio.sleep(0.05)
            assert await locks_held([job]) == 0
            # The next claim opens a fresh session and is granted.
            lease = await lk.acquire(job, SLOT + timedelta(minutes=1))
            assert isinstance(lease, PostgresHold)
            await lease.release()
            assert lk.statistics().sessions_opened == opened + 1
    finally:
        await admin.close()
