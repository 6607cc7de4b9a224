"""A sync with more changes than a page reads them a page a statement (a job's claim goes
in between), against the real server: the same changes as one read gives, none twice,
tombstones after the first read only."""

from __future__ import annotations

import uuid

import pytest

from cronlock import StoredSchedule, every
from cronlock.postgres import FleetControl, PostgresLocker
from cronlock.postgres._locker import reads

pytestmark = pytest.mark.postgres


def _tenants(count: int, seconds: int) -> list[StoredSchedule]:
    return [StoredSchedule(f"t:{i:02}", "report", every(seconds)) for i in range(count)]


@pytest.mark.parametrize("page", [3, 1000], ids=["pages", "one-read"])
async def test_the_changes_read_in_pages_add_up(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, page: int
) -> None:
    monkeypatch.setattr(reads, "CHANGES_PAGE", page)
    table = f"pages_{uuid.uuid4().hex[:10]}"
    async with FleetControl(pg_dsn, table=table) as control:
        await control.put_schedules(_tenants(10, 60))
        await control.remove_schedule("t:09")
        async with PostgresLocker(pg_dsn, table=table) as locker:
            top, changes = await locker.stored_changes(0)
            assert sorted(name for name, _, _ in changes) == [f"t:{i:02}" for i in range(9)]
            assert all(stored is not None for _, _, stored in changes)  # no tombstone
            await control.put_schedules(_tenants(8, 90))  # 8 of 9 changed
            await control.remove_schedule("t:08")
            later, changes = await locker.stored_changes(top)
            assert later > top
            changed = {name: stored for name, _, stored in changes}
            # (t:09's tombstone too: the first read left it out, and read up to revision
            # 1, the latest of the rows it read.)
            assert sorted(changed) == [f"t:{i:02}" for i in range(10)]
            assert changed["t:08"] is None and changed["t:09"] is None  # the tombstones
            assert all(changed[f"t:{i:02}"].schedule == every(90) for i in range(8))  # type: ignore[union-attr]
            assert await locker.stored_changes(later) == (later, [])
