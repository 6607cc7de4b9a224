"""Zones: fixed-offset names (EST, Etc/GMT-1) are refused wherever a zone is given; UTC in
every spelling, region zones without DST (Asia/Tokyo) and the US rule zones (EST5EDT) are not.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, available_timezones

import pytest

from cronlock import CronSchedule, ScheduleError, Scheduler, cron, daily, monthly, weekly
from cronlock._schedules.schedule import upcoming

SUMMER = datetime(2024, 7, 1, tzinfo=UTC)
ETC_OFFSETS = {f"Etc/GMT{sign}{n}" for sign in "+-" for n in range(1, 15)}
REFUSED = {"EST", "MST", "HST", "Factory"} | ETC_OFFSETS

MAKERS: dict[str, Callable[[str | ZoneInfo], object]] = {
    "Scheduler": lambda tz: Scheduler(tz=tz),
    "cron": lambda tz: cron("0 3 * * *", tz=tz),
    "daily": lambda tz: daily("03:00", tz=tz),
    "weekly": lambda tz: weekly("mon", tz=tz),
    "monthly": lambda tz: monthly(1, tz=tz),
    "CronSchedule": lambda tz: CronSchedule("0 3 * * *", tz=tz),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
@pytest.mark.parametrize(
    "tz",
    ["EST", ZoneInfo("EST"), "Etc/GMT-1", ZoneInfo("Etc/GMT+5")],
    ids=["EST", "ZoneInfo-EST", "Etc/GMT-1", "ZoneInfo-Etc/GMT+5"],
)
def test_fixed_offset_names_are_refused_everywhere(
    make: Callable[[str | ZoneInfo], object], tz: str | ZoneInfo
) -> None:
    with pytest.raises(ScheduleError, match="is a fixed offset of") as info:
        make(tz)
    assert str(tz) in str(info.value)  # names the value
    assert isinstance(info.value, ValueError)


def test_est_names_its_offset_what_goes_wrong_and_the_zone_to_use() -> None:
    with pytest.raises(ScheduleError) as info:
        Scheduler(tz="EST")
    assert str(info.value) == (
        "tz='EST' is a fixed offset of -05:00 with no daylight saving time; a 03:00 schedule "
        "in it fires at 04:00 local time all summer where the clocks move to daylight time. "
        "Use a region zone, such as 'America/New_York' (or 'America/Panama' to keep -05:00 "
        "all year)"
    )
    # What it would have done: 08:00 UTC is 04:00 in New York in July.
    new_york = upcoming(cron("0 3 * * *", tz="America/New_York"), SUMMER, 1)
    assert new_york == [datetime(2024, 7, 1, 7, tzinfo=UTC)]


@pytest.mark.parametrize(
    ("tz", "fragments"),
    [
        ("MST", ["-07:00", "'America/Denver'", "'America/Phoenix'"]),
        ("HST", ["-10:00", "'Pacific/Honolulu'"]),
        ("Etc/GMT-1", ["tz='Etc/GMT-1'", "+01:00", "invert the sign", "'UTC' for UTC itself"]),
        ("Etc/GMT+12", ["-12:00", "region zone"]),
        ("Factory", ["placeholder", "'UTC'"]),
    ],
)
def test_each_refusal_says_what_to_use(tz: str, fragments: list[str]) -> None:
    with pytest.raises(ScheduleError) as info:
        cron("0 3 * * *", tz=tz)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_the_field_is_named_as_the_caller_spelt_it() -> None:
    with pytest.raises(ScheduleError, match=re.escape("daily: tz='HST' is a fixed offset")):
        daily(tz="HST")


@pytest.mark.parametrize(
    "tz",
    ["UTC", "Etc/UTC", "GMT", "Etc/GMT", "Etc/GMT0", "Etc/GMT+0", "Etc/GMT-0", "Zulu", "UCT"],
)
def test_utc_in_every_spelling_is_utc(tz: str) -> None:
    assert upcoming(cron("0 3 * * *", tz=tz), SUMMER, 1) == [datetime(2024, 7, 1, 3, tzinfo=UTC)]
    assert Scheduler(tz=tz).tz.utcoffset(SUMMER) == UTC.utcoffset(SUMMER)


@pytest.mark.parametrize(
    ("tz", "summer_utc_hour"),
    [
        ("Asia/Tokyo", 18),  # no DST, but a place's clock: 03:00 JST is 18:00 UTC the day before
        ("Japan", 18),
        ("America/Phoenix", 10),
        ("EST5EDT", 7),  # the US rule zones observe DST: 03:00 EDT
        ("CST6CDT", 8),
        ("MST7MDT", 9),
        ("PST8PDT", 10),
    ],
)
def test_region_zones_and_rule_zones_are_accepted(tz: str, summer_utc_hour: int) -> None:
    Scheduler(tz=tz)
    [slot] = upcoming(cron("0 3 * * *", tz=tz), SUMMER, 1)
    assert slot.hour == summer_utc_hour


def test_exactly_the_fixed_offset_names_are_refused() -> None:
    """Over every zone tzdata ships: refused iff a legacy fixed-offset name."""
    refused = set()
    for name in available_timezones():
        try:
            cron("0 3 * * *", tz=name)
        except ScheduleError:
            refused.add(name)
    assert refused == REFUSED & available_timezones()
    assert {"EST", "Etc/GMT-1", "Etc/GMT+12"} <= refused  # the test did look at them


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
@pytest.mark.parametrize(
    ("tz", "expected"),
    [
        ("Europe", "unknown time zone 'Europe' ('Europe' is a region; name a zone in it, such as"),
        ("America/Argentina/", "such as 'America/Argentina/Buenos_Aires'"),
        ("x" * 300, "(300 characters; IANA names have at most 64"),
        ("Mars/Base", "unknown time zone 'Mars/Base' (use an IANA name like 'Europe/Berlin')"),
    ],
    ids=["region", "subregion", "300-characters", "unknown"],
)
def test_a_region_or_an_overlong_name_is_a_schedule_error_not_an_os_error(
    make: Callable[[str | ZoneInfo], object], tz: str, expected: str
) -> None:
    """Not the OSError the zone files raise (IsADirectoryError, "File name too long"),
    whose message names the install path of tzdata instead of the zone."""
    with pytest.raises(ScheduleError) as info:
        make(tz)
    message = str(info.value)
    assert expected in message
    assert "zoneinfo/" not in message and "Errno" not in message
    assert len(message) < 250  # the 300 characters are not repeated back
    assert info.value.__cause__ is None
