"""Long work off the event loop's critical path (issue 37, item 3): a start that loads
thousands of stored schedules and a sync that changes them all let other tasks run while
they go on, the jobs in code keep firing meanwhile, and catch-up decides job by job, one
job that raises costing nothing to the others. (How long any of it takes is measured in
``benchmarks/stored_load.py``, not here.)"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta

import pytest

from cronlock import InMemoryLocker, RunContext, RunRecord, Scheduler, every
from cronlock._locking.protocols import LedgerSummary
from cronlock._schedules.interval import IntervalSchedule
from cronlock.testing import FakeClock

from .conftest import T0
from .test_stored_schedules import MemoryStore

MANY = 2000


@pytest.fixture
def sliced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of no time at all: the work lets others run between any two items, so what
    the tests see does not depend on the machine's speed."""
    monkeypatch.setattr("cronlock._pacing.SLICE", 0.0)


class Watcher:
    """A task that looks at the scheduler's stored jobs at every turn of the loop, and
    keeps how many it saw each time."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.seen: list[int] = []
        self._scheduler = scheduler
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            stored = self._scheduler._stored
            self.seen.append(0 if stored is None else len(stored.applied))
            await asyncio.sleep(0)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _scheduler(clock: FakeClock, store: MemoryStore) -> Scheduler:
    scheduler = Scheduler(clock=clock, locker=store, sync_every=2)

    @scheduler.task("report")
    async def report(tenant: int) -> None:
        pass

    return scheduler


@pytest.mark.usefixtures("sliced")
async def test_other_tasks_run_while_thousands_of_stored_schedules_load(
    clock: FakeClock,
) -> None:
    store = MemoryStore()
    for tenant in range(MANY):
        store.put(f"t:{tenant}", "report", every(3600), kwargs={"tenant": tenant})
    scheduler = _scheduler(clock, store)
    watcher = Watcher(scheduler)
    await scheduler.start()
    try:
        assert len(scheduler.stored_jobs) == MANY  # all of them once start() returns
        partial = [count for count in watcher.seen if 0 < count < MANY]
        # The watcher ran again and again with the load half done: never held for all of it.
        assert len(partial) > 100, watcher.seen[:20]
    finally:
        await watcher.stop()
        await scheduler.shutdown()


@pytest.mark.usefixtures("sliced")
async def test_a_sync_that_changes_thousands_of_schedules_lets_other_tasks_run(
    clock: FakeClock,
) -> None:
    store = MemoryStore()
    for tenant in range(MANY):
        store.put(f"t:{tenant}", "report", every(3600), kwargs={"tenant": tenant})
    scheduler = _scheduler(clock, store)
    async with scheduler:
        for tenant in range(MANY):  # every schedule: a new interval
            store.put(f"t:{tenant}", "report", every(1800), kwargs={"tenant": tenant})
        mixed: list[int] = []

        async def look() -> None:
            while True:
                changed = sum(
                    1
                    for name in ("t:0", f"t:{MANY - 1}")
                    if scheduler.get_job(name).schedule == every(1800)
                )
                mixed.append(changed)
                await asyncio.sleep(0)

        looker = asyncio.get_running_loop().create_task(look())
        stored = scheduler._stored
        assert stored is not None
        try:
            # What the sync task does at its next turn (the fake clock's advance waits
            # for every task to block, and the looker never does).
            await stored.sync()
            await asyncio.sleep(0)
        finally:
            looker.cancel()
            await asyncio.gather(looker, return_exceptions=True)
        # Seen with the first changed and the last not yet: the sync was applied in slices.
        assert 1 in mixed
        assert mixed[-1] == 2


@pytest.fixture
def thawed() -> Iterator[None]:
    """Nothing frozen before or after (a test that freezes leaves the others as they were)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("sliced", "thawed")
async def test_a_bulk_load_freezes_what_it_registered_and_a_small_sync_does_not(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The full garbage collections of a bulk load would walk every job again and again;
    # frozen, they are out of the collector's sight. A sync of a few changes freezes
    # nothing more.
    monkeypatch.setattr("cronlock._pacing.FREEZE_FROM", 500)
    store = MemoryStore()
    for tenant in range(MANY):
        store.put(f"t:{tenant}", "report", every(3600), kwargs={"tenant": tenant})
    scheduler = _scheduler(clock, store)
    async with scheduler:
        assert gc.get_freeze_count() >= MANY  # the jobs (and all else alive then)
        assert all(seen is not scheduler for seen in gc.get_objects())  # out of sight
        gc.unfreeze()
        stored = scheduler._stored
        assert stored is not None
        for tenant in range(10):
            store.put(f"t:{tenant}", "report", every(1800), kwargs={"tenant": tenant})
        await stored.sync()
        assert gc.get_freeze_count() == 0
        assert scheduler.get_job("t:0").schedule == every(1800)


@pytest.mark.usefixtures("sliced", "thawed")
async def test_no_load_freezes_when_freezing_is_off(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cronlock._pacing.FREEZE_FROM", None)
    store = MemoryStore()
    for tenant in range(MANY):
        store.put(f"t:{tenant}", "report", every(3600), kwargs={"tenant": tenant})
    async with _scheduler(clock, store) as scheduler:
        assert len(scheduler.stored_jobs) == MANY
        assert gc.get_freeze_count() == 0


class BatchMemory(InMemoryLocker):
    """An in-process ledger read in batches at catch-up, as PostgresLocker's is."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    async def ledger_summaries(self, jobs: Sequence[str]) -> Mapping[str, LedgerSummary]:
        self.batches += 1
        found: dict[str, LedgerSummary] = {}
        for job in jobs:
            claimed = await self.last_claimed(job)
            if claimed is not None:
                last, ok = await self.last_runs(job)
                found[job] = LedgerSummary(claimed, last, ok)
        return found

    def refusal_history(self, job: str) -> tuple[RunRecord | None, RunRecord | None] | None:
        return None  # a refusal here says nothing of the fleet's runs


class Broken(IntervalSchedule):
    """Hourly, but failing for any instant before *since* (what catch-up asks about)."""

    since: datetime = T0

    def next_after(self, after: datetime) -> datetime | None:
        if after < Broken.since:
            raise RuntimeError("an odd schedule")
        return super().next_after(after)


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
async def test_catch_up_goes_on_past_a_job_that_raises(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, batched: bool
) -> None:
    locker = BatchMemory() if batched else InMemoryLocker()
    hourly = every(hours=1)
    runs: list[tuple[str, datetime]] = []

    def replica(broken: bool) -> Scheduler:
        scheduler = Scheduler(clock=clock, locker=locker)
        for name in ("a", "odd", "z"):

            async def task(ctx: RunContext) -> None:
                runs.append((ctx.job, ctx.slot))

            schedule = (
                Broken(hourly.interval, hourly.anchor) if broken and name == "odd" else hourly
            )
            scheduler.add_job(task, schedule, name=name, misfire_grace=timedelta(hours=1))
        return scheduler

    async with replica(broken=False):
        await clock.advance(timedelta(hours=1))  # 01:00 runs, claimed
    await clock.advance(timedelta(hours=1, minutes=30))  # nobody up at 02:00
    runs.clear()
    if isinstance(locker, BatchMemory):
        locker.batches = 0
    Broken.since = clock.now()
    with caplog.at_level(logging.ERROR, logger="cronlock"):
        async with replica(broken=True):
            await clock.advance(1)
    # The 02:00 slot is caught up for the two sound jobs; the odd one is logged alone.
    assert sorted(runs) == [("a", T0 + timedelta(hours=2)), ("z", T0 + timedelta(hours=2))]
    failed = [r.getMessage() for r in caplog.records if "catch-up failed" in r.getMessage()]
    assert failed == ["job 'odd': catch-up failed"]
    if isinstance(locker, BatchMemory):
        assert locker.batches == 1  # one read for the three
