"""A sync of many stored-schedule changes reads them in pages (issue 37, item 3): one
statement of 100,000 rows held the lock session, and every claim waiting behind it, for a
few hundred milliseconds. Here a page is 7 rows, so that a few dozen schedules take many
pages, against the real server in both modes: the replica holds exactly what is stored,
also when schedules change while the pages are read (those are read by the next sync).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cronlock import Scheduler, StoredSchedule, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import reads

from ..eventually import eventually
from .conftest import Coordination

pytestmark = pytest.mark.postgres


def tenants(names: range, plus: int = 0) -> list[StoredSchedule]:
    return [
        StoredSchedule(f"t:{i:03d}", "report", every(3600), kwargs={"tenant": i + plus})
        for i in names
    ]


def held(scheduler: Scheduler) -> dict[str, Any]:
    """Each stored job of *scheduler* and the tenant it runs for."""
    return {name: scheduler.get_job(name).kwargs["tenant"] for name in scheduler.stored_jobs}


async def test_a_large_sync_reads_its_changes_in_pages_and_misses_none(
    coordination: Coordination, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "_PAGE", 7)
    pages: list[str] = []
    fetch_page = reads._fetch_page
    table = f"pages_{uuid.uuid4().hex[:10]}"
    c = coordination
    async with FleetControl(c.dsn, table=table, schema=c.schema) as control:
        changed_between: list[bool] = []

        async def page(
            window: str, sql: str, since: int, top: int, after: str, conn: Any
        ) -> tuple[list[Any], str | None]:
            pages.append(after)
            if since > 0 and len(changed_between) == 0:
                # While the second sync reads its pages: one schedule before this page and
                # one after it change again (a later revision than the pages read up to).
                changed_between.append(True)
                await control.put_schedules(
                    [
                        StoredSchedule("t:001", "report", every(3600), kwargs={"tenant": -1}),
                        StoredSchedule("t:050", "report", every(3600), kwargs={"tenant": -50}),
                    ]
                )
            return await fetch_page(window, sql, since, top, after, conn)

        monkeypatch.setattr(reads, "_fetch_page", page)
        await control.put_schedules(tenants(range(60)))
        locker = PostgresLocker(c.dsn, table=table, schema=c.schema, mode=c.mode)
        scheduler = Scheduler(locker=locker, sync_every=0.2, stop_timeout=0)

        @scheduler.task("report")
        async def report(tenant: int) -> None:
            pass

        async with scheduler:
            # Started: all 60 held, read in pages of 7 (the first from the start).
            assert held(scheduler) == {f"t:{i:03d}": i for i in range(60)}
            assert len(pages) == 9 and pages[0] == ""
            # Every one changed, 10 removed, in one batch: applied whole, in pages.
            pages.clear()
            await control.sync_schedules("t:", tenants(range(50), plus=1000))
            wanted = {f"t:{i:03d}": i + 1000 for i in range(50)}
            wanted |= {"t:001": -1}  # changed while the pages were read; t:050 came back
            wanted |= {"t:050": -50}
            await eventually(
                lambda: held(scheduler) == wanted, f"the replica holds {wanted}", every=0.1
            )
            assert changed_between == [True] and len(pages) >= 8
