"""A batch's schedules alike are checked once (their schedule and options): what each of
them is refused for and stored as must be what it would be alone."""

from __future__ import annotations

import pytest

from cronlock import ScheduleError, StoredSchedule, cron, every
from cronlock.postgres._ops.bulk import check_batch


def test_schedules_alike_are_each_refused_naming_themselves() -> None:
    good = StoredSchedule("t:1", "report", every(60), options={"recover": True})
    # Equal to the good one's options by value (1 == True), but refused alone: the shared
    # checks must tell them apart.
    bad = StoredSchedule("t:2", "report", every(60), options={"recover": 1})
    with pytest.raises(ScheduleError, match=r"'t:2'.*recover must be True or False"):
        check_batch([good, bad], prefix=None, min_interval=1.0)
    # A refusal is never remembered as a success: the same again, named again.
    too_fast = [StoredSchedule(f"t:{i}", "report", every(5)) for i in range(2)]
    for one in too_fast:
        with pytest.raises(ScheduleError, match=rf"'{one.name}'.*min_interval"):
            check_batch([one], prefix=None, min_interval=10.0)
    # The minimum interval is part of what is shared: allowed at 1 s.
    assert len(check_batch(too_fast, prefix=None, min_interval=1.0)) == 2


def test_schedules_alike_keep_their_own_kwargs_and_options() -> None:
    batch = [
        StoredSchedule(
            f"t:{i}",
            "report",
            cron(f"0 {i % 2} * * *", tz="Europe/Paris"),
            kwargs={"tenant": i},
            options={"timeout": 600, "tags": ["a", "b"] if i == 3 else "x"},
        )
        for i in range(6)
    ]
    checked = check_batch(batch, prefix=None, min_interval=1.0)
    assert [one.kwargs for one in checked] == [{"tenant": i} for i in range(6)]
    assert [str(one.schedule) for one in checked] == [str(s.schedule) for s in batch]
    assert checked[3].options["tags"] == ["a", "b"]
    assert checked[4].options["tags"] == ["x"]
    # Each schedule's options are its own: a change to one leaves the others alone.
    checked[0].options["timeout"] = 1.0
    assert checked[2].options["timeout"] == 600
