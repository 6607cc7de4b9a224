"""The ledger is shared: one row no replica can read must not break the fleet (issue 24).

Each test writes a hostile row into a real ledger (a timestamp Python cannot hold: BC,
``infinity``, ``-infinity``, or the last second of 9999, which arithmetic overflows) while
real replicas (two schedulers, each with its PostgresLocker on one pool) run. The replicas
keep running their healthy job exactly once a slot, a trigger still reaches them, catch-up
at start still works for the other jobs, and a WARNING names the row.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest

from cronlock import Scheduler, daily, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import fleetwatch as control_module
from cronlock.postgres._locker import upkeep
from cronlock.postgres._ops import control as control_ops
from cronlock.postgres._sql.tables import LedgerTable

from ..eventually import eventually
from .test_cli_pg import cli

pytestmark = pytest.mark.postgres

HOSTILE = ["4713-01-01 BC", "infinity", "-infinity", "9999-12-31 23:59:59+00"]
EVERY = 0.25  # seconds between the slots of the replicas' jobs (epoch-anchored)
_BAD = "bad"
_OK = "healthy"
_ON_DEMAND = "on-demand"
_NOTED = "noted-elsewhere"  # a job whose schedule note another fleet wrote
_DSN = ""  # the test's DSN (dsn_admin)


@pytest.fixture
def ledger() -> LedgerTable:
    return LedgerTable(f"hostile_{uuid.uuid4().hex[:10]}")


@pytest.fixture(autouse=True)
def fast_fleet_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fleet's latest runs are read every RUNS_EVERY seconds, and crashed runs looked
    # for every CHECK_EVERY: often, for the test (what they find is the same).
    monkeypatch.setattr(control_module, "RUNS_EVERY", 0.3)
    monkeypatch.setattr(upkeep, "CHECK_EVERY", 0.5)
    # Triggers are read every POLL_EVERY, and a trigger's caller looks for its run every
    # WAIT_EVERY: often too.
    monkeypatch.setattr(control_module, "POLL_EVERY", 0.2)
    monkeypatch.setattr(control_ops, "WAIT_EVERY", 0.1)


class Fleet:
    """Two replicas running ``healthy`` and ``bad`` every :data:`EVERY` seconds; counts
    healthy's runs."""

    def __init__(self, pool: Any, ledger: LedgerTable, mode: Literal["session", "lease"]) -> None:
        self._pool, self._table = pool, ledger.table
        self.ran: list[str] = []
        self.schedulers = []
        for _ in range(2):
            # One session a locker: both jobs' claims of an instant go in one batch.
            locker = PostgresLocker(pool, table=ledger.table, sessions=1, mode=mode)
            scheduler = Scheduler(locker=locker)
            scheduler.add_job(lambda: self.ran.append(_OK), every(seconds=EVERY), name=_OK)
            scheduler.add_job(lambda: self.ran.append(_BAD), every(seconds=EVERY), name=_BAD)
            # Run by triggers only (a trigger of a job that runs every second can meet its
            # own run in flight and wait for the next poll).
            scheduler.add_job(lambda: self.ran.append(_ON_DEMAND), daily("03:00"), name=_ON_DEMAND)
            self.schedulers.append(scheduler)

    async def __aenter__(self) -> Fleet:
        async with PostgresLocker(self._pool, table=self._table) as locker:
            await locker.last_claimed(_OK)  # creates the ledger
        for scheduler in self.schedulers:
            await scheduler.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for scheduler in reversed(self.schedulers):
            await scheduler.__aexit__(None, None, None)


@pytest.fixture
async def fleet(pool: Any, ledger: LedgerTable) -> AsyncIterator[Fleet]:
    async with Fleet(pool, ledger, "session") as running:
        yield running


def _trouble(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What cronlock logged at ERROR, or with a traceback."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("cronlock")
        and (record.levelno >= logging.ERROR or record.exc_info)
    ]


def _warned(caplog: pytest.LogCaptureFixture, *words: str) -> bool:
    return any(
        record.levelno == logging.WARNING and all(w in record.getMessage() for w in words)
        for record in caplog.records
    )


async def _healthy_runs(admin: Any, ledger: LedgerTable) -> int:
    count: int = await admin.fetchval(
        f"""SELECT count(*) FROM {ledger.runs}
            WHERE job = $1 AND outcome = 'succeeded' AND host <> 'gone'""",
        _OK,
    )
    return count


async def _keeps_running(fleet: Fleet, admin: Any, ledger: LedgerTable, slots: int) -> None:
    """The healthy job runs *slots* more times, exactly once a slot (every run in the
    process has its one row), and a trigger written now reaches a replica and runs once."""
    more = fleet.ran.count(_OK) + slots
    await eventually(lambda: fleet.ran.count(_OK) >= more, f"{slots} more runs of {_OK!r}")
    async with FleetControl(_DSN, table=ledger.table) as control:
        triggered = await control.trigger(_ON_DEMAND, force=True)
        record = await triggered.wait(timeout=30)
    assert (record.outcome, record.manual) == ("succeeded", True)
    # Every run the process made has its one row: the counts meet once the latest run's
    # outcome is written (most of each slot's interval). A slot run twice would keep the
    # process's count ahead of the ledger's for good.
    counts: list[tuple[int, int]] = []

    async def met() -> bool:
        counts.append((await _healthy_runs(admin, ledger), fleet.ran.count(_OK)))
        return counts[-1][0] == counts[-1][1]

    await eventually(met, f"each run of {_OK!r} in the process has its row: {counts[-3:]}")
    assert fleet.ran.count(_ON_DEMAND) == 1


@pytest.fixture
def dsn_admin(admin: Any, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(f"{__name__}._DSN", pg_dsn)
    return admin


async def _started(fleet: Fleet, admin: Any, ledger: LedgerTable) -> None:
    async def two() -> bool:
        return await _healthy_runs(admin, ledger) >= 2

    await eventually(two, "two runs of the healthy job in the ledger")


async def _told(caplog: pytest.LogCaptureFixture, *words: str) -> None:
    """Wait for the WARNING naming the odd row (a read or a refusal meets it in its time)."""
    await eventually(lambda: _warned(caplog, *words), f"a WARNING with {words}")


@pytest.mark.parametrize("value", HOSTILE)
async def test_a_run_with_hostile_times_is_skipped_and_reported(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The job's latest run (a slot an hour ahead) has hostile start and finish times: the
    fleet watch reads it every RUNS_EVERY, catch-up would too, history does."""
    caplog.set_level(logging.WARNING, logger="cronlock")
    await _started(fleet, dsn_admin, ledger)
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at, outcome)
            VALUES ($1, now() + interval '1 hour', 'elsewhere', 1, $2::text::timestamptz,
                    $2::text::timestamptz, 'succeeded')""",
        _BAD,
        value,
    )
    await _keeps_running(fleet, dsn_admin, ledger, 4)
    locker = fleet.schedulers[0].get_job(_BAD)._wiring.locker
    assert isinstance(locker, PostgresLocker)
    history = await locker.history(_BAD, 5)
    assert history, "the readable runs are still there"
    assert all(r.started_at.tzinfo is not None for r in history)
    assert _warned(caplog, repr(_BAD), ledger.runs, "started_at=", "finished_at=")
    assert _trouble(caplog) == []


@pytest.mark.parametrize("value", HOSTILE)
async def test_a_run_with_a_hostile_slot_is_skipped_and_reported(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cronlock")
    await _started(fleet, dsn_admin, ledger)
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at, outcome)
            VALUES ($1, $2::text::timestamptz, 'elsewhere', 1, now(), now(), 'succeeded')""",
        _BAD,
        value,
    )
    await _keeps_running(fleet, dsn_admin, ledger, 4)
    locker = fleet.schedulers[0].get_job(_BAD)._wiring.locker
    assert isinstance(locker, PostgresLocker)
    history = await locker.history(_BAD, 50)
    assert history
    assert all(r.slot.tzinfo is not None and r.slot.year > 2000 for r in history)
    last, _ = await locker.last_runs(_BAD)
    assert last is not None and last.slot.year > 2000  # the odd row hides no real run
    assert _warned(caplog, repr(_BAD), ledger.runs, "slot=")
    assert _trouble(caplog) == []


@pytest.mark.parametrize("value", HOSTILE)
async def test_a_claim_batch_answering_a_hostile_row_still_claims_the_others(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The next slots of ``bad`` are in the ledger already, finished at a hostile time: each
    refusal tells that row, in the batch that also claims ``healthy``."""
    await _claims_survive(fleet, dsn_admin, ledger, value, caplog)


@pytest.mark.parametrize("value", HOSTILE[:2])
async def test_a_lease_mode_claim_batch_answering_a_hostile_row_still_claims_the_others(
    pool: Any, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with Fleet(pool, ledger, "lease") as fleet:
        await _claims_survive(fleet, dsn_admin, ledger, value, caplog)


async def _claims_survive(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cronlock")
    await _started(fleet, dsn_admin, ledger)
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at, outcome)
            SELECT $1, date_trunc('second', now()) + (2 + i * $3::float8) * interval '1 s',
                   'elsewhere', 1, now(), $2::text::timestamptz, 'succeeded'
            FROM generate_series(1, 16) AS i""",
        _BAD,
        value,
        EVERY,
    )
    await _told(caplog, repr(_BAD), ledger.runs, "finished_at=")
    await _keeps_running(fleet, dsn_admin, ledger, 4)
    assert _warned(caplog, repr(_BAD), ledger.runs, "finished_at=")
    assert _trouble(caplog) == []


# (A BC trigger slot is older than any trigger's expiry: dropped by the poll, as any old
# trigger, with or without the guards.)
@pytest.mark.parametrize("value", HOSTILE[1:])
async def test_a_hostile_trigger_slot_is_reported_and_never_run(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cronlock")
    await _started(fleet, dsn_admin, ledger)
    await dsn_admin.execute(
        f"INSERT INTO {ledger.control} (job, trigger_slot) VALUES ($1, $2::text::timestamptz)",
        _BAD,
        value,
    )
    await _told(caplog, repr(_BAD), ledger.control, "trigger_slot=")
    await _keeps_running(fleet, dsn_admin, ledger, 4)
    manual = await dsn_admin.fetchval(
        f"SELECT count(*) FROM {ledger.runs} WHERE job = $1 AND manual", _BAD
    )
    assert manual == 0
    assert _warned(caplog, repr(_BAD), ledger.control, "trigger_slot=")
    assert _trouble(caplog) == []


@pytest.mark.parametrize("value", HOSTILE)
async def test_catch_up_at_start_works_for_the_other_jobs(
    pool: Any, dsn_admin: Any, ledger: LedgerTable, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the replicas start, ``bad`` has a hostile slot and a run with hostile times;
    ``healthy`` last ran an hour ago: its catch-up run still happens."""
    caplog.set_level(logging.INFO, logger="cronlock")
    async with PostgresLocker(pool, table=ledger.table) as locker:
        await locker.last_claimed(_OK)  # creates the ledger
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, started_at, finished_at, outcome)
            VALUES ($1, date_trunc('second', now()) - interval '1 hour', 'gone', 1,
                    now() - interval '1 hour', now() - interval '1 hour', 'succeeded'),
                   ($2, date_trunc('second', now()) - interval '1 hour', 'gone', 1,
                    $3::text::timestamptz, $3::text::timestamptz, 'succeeded'),
                   ($2, $3::text::timestamptz, 'gone', 1, now(), now(), 'succeeded')""",
        _OK,
        _BAD,
        value,
    )
    async with Fleet(pool, ledger, "session") as fleet:
        await _keeps_running(fleet, dsn_admin, ledger, 4)
    caught_up = [
        r.getMessage()
        for r in caplog.records
        if "catching up with one run" in r.getMessage() and repr(_OK) in r.getMessage()
    ]
    assert caught_up, "healthy was caught up"
    assert _warned(caplog, repr(_BAD), ledger.runs)
    assert _trouble(caplog) == []


async def test_a_hostile_crashed_row_does_not_stop_upkeep(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, caplog: pytest.LogCaptureFixture
) -> None:
    """An unfinished run of a session that is gone, with a BC slot: the crash check marks it
    and reads it back (RETURNING), on the upkeep task, which must go on."""
    caplog.set_level(logging.WARNING, logger="cronlock")
    await _started(fleet, dsn_admin, ledger)
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, session, started_at)
            VALUES ($1, '4713-01-01 BC', 'gone', 1, 2147483647, '4713-01-01 BC')""",
        _BAD,
    )

    async def marked() -> bool:
        outcome: str | None = await dsn_admin.fetchval(
            f"SELECT outcome FROM {ledger.runs} WHERE job = $1 AND slot < '0001-01-01'", _BAD
        )
        return outcome == "crashed"

    await eventually(marked, "the BC row marked crashed")
    # Upkeep still runs: a row written now is marked crashed too.
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.runs} (job, slot, host, pid, session)
            VALUES ($1, now() - interval '1 day', 'gone', 1, 2147483647)""",
        _BAD,
    )

    async def marked_too() -> bool:
        return bool(
            await dsn_admin.fetchval(
                f"""SELECT outcome = 'crashed' FROM {ledger.runs}
                    WHERE job = $1 AND slot > '2000-01-01' AND host = 'gone'""",
                _BAD,
            )
        )

    await eventually(marked_too, "the row written after it marked crashed too")
    await _keeps_running(fleet, dsn_admin, ledger, 4)
    assert _warned(caplog, repr(_BAD), ledger.runs, "slot=")
    assert _trouble(caplog) == []


@pytest.mark.parametrize("value", HOSTILE[:2])
async def test_status_reads_a_hostile_lease_and_jobs_row(
    fleet: Fleet, dsn_admin: Any, ledger: LedgerTable, value: str
) -> None:
    """A lease (read by ``status`` for *lock held by*) and a schedule note with hostile
    times: the command line shows the jobs, without a traceback."""
    await _started(fleet, dsn_admin, ledger)
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.leases} (job, slot, holder, expires_at)
            VALUES ($1, $2::text::timestamptz, 'elsewhere', now() + interval '1 hour')""",
        _BAD,
        value,
    )
    # The note of a job no replica here runs: theirs of ``bad`` would replace it (with the
    # next slot) at any moment, before ``status`` reads it.
    await dsn_admin.execute(
        f"""INSERT INTO {ledger.jobs} (job, schedule, next_run, due)
            VALUES ($1, 'every 1s', $2::text::timestamptz, $2::text::timestamptz)""",
        _NOTED,
        value,
    )
    shown = await cli("status", "--dsn", _DSN, "--table", ledger.table)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    assert any(line.startswith(_BAD) for line in shown.stdout.splitlines())
    assert "next_run=" in shown.stderr  # the note's odd time, named
    await _keeps_running(fleet, dsn_admin, ledger, 4)
