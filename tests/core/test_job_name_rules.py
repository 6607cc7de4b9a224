"""A job's name is a key of the run ledger: one the server would refuse (a NUL, a lone
surrogate, kilobytes of text) is refused at registration, naming the job, the field and
why, so it never reaches the batched statements every job shares (issue 24, item 1)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cronlock import ScheduleError, Scheduler, every
from cronlock._names import MAX_NAME
from cronlock.postgres import locked_run


async def _task() -> None:
    pass


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("nightly\x00report", "name contains a NUL at position 7"),
        ("a\x1b[2Jb", r"name contains the control character '\x1b' at position 1"),
        ("two\nlines", r"name contains the control character '\n' at position 3"),
        ("del\x7f", r"the control character '\x7f' at position 3"),
        ("c1\x9b", r"the control character '\x9b' at position 2"),
        ("half\ud800", r"a lone surrogate '\ud800' (not encodable as UTF-8) at position 4"),
        ("x" * (MAX_NAME + 1), f"name is longer than {MAX_NAME} characters ({MAX_NAME + 1})"),
    ],
)
def test_a_name_the_ledger_cannot_key_is_refused(name: str, why: str) -> None:
    scheduler = Scheduler()
    with pytest.raises(ScheduleError) as caught:
        scheduler.add_job(_task, every(60), name=name)
    message = str(caught.value)
    assert message.startswith("job ")
    assert why in message
    assert scheduler.jobs == ()


def test_a_long_name_is_shown_truncated() -> None:
    name = "".join(chr(0x41 + i % 26) for i in range(2700))  # past a btree entry's limit
    with pytest.raises(ScheduleError) as caught:
        Scheduler().add_job(_task, every(60), name=name)
    message = str(caught.value)
    assert repr(name[:60]) in message
    assert "(2700 characters)" in message
    assert len(message) < 250


def test_the_decorators_check_names_too() -> None:
    scheduler = Scheduler()
    with pytest.raises(ScheduleError, match="contains a NUL"):
        scheduler.every(60, name="bad\x00")(_task)
    with pytest.raises(ScheduleError, match="longer than"):
        scheduler.cron("* * * * *", name="y" * 500)(_task)


@pytest.mark.parametrize(
    "name",
    ["report", "x" * MAX_NAME, "café-☕", "rapport\u202e", "a b", "\u00a0nbsp", "日本語のジョブ"],
)
def test_odd_but_valid_names_are_accepted(name: str) -> None:
    # Format characters and separators are valid text; the command line escapes what a
    # terminal would act on (bidi overrides among them) when it prints them.
    job = Scheduler().add_job(_task, every(60), name=name)
    assert job.name == name


def test_a_name_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ScheduleError, match="job name must be a non-empty string, got 42"):
        Scheduler().add_job(_task, every(60), name=42)  # type: ignore[arg-type]


def test_locked_run_with_a_slot_checks_the_name() -> None:
    slot = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(ScheduleError, match="contains a NUL"):
        locked_run("postgresql://nowhere/db", "job\x00", slot=slot)
