"""The zone names tzdata keeps for fixed offsets, which
:func:`cronlock._schedules.tz.resolve_tz` refuses.

A schedule's zone stands for a wall clock people read. ``EST`` or ``Etc/GMT-1`` name no
place: they hold one offset all year, so ``0 3 * * *`` in ``EST`` fires at 04:00 New York
time all summer, and nothing at registration says so. They are refused *by name*: a zone
whose offset never changes is not enough (``Asia/Tokyo`` has no DST and is a real place's
clock), and ``EST5EDT``, ``CET`` and the like are accepted, because they do observe DST.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from .._errors import ScheduleError

__all__ = ("refuse_fixed_offset",)

# The legacy abbreviation zones with one offset and no region: what a schedule in one gets
# wrong, and the region zone to name instead.
_SUMMER = (
    "a 03:00 schedule in it fires at 04:00 local time all summer where the clocks move to "
    "daylight time"
)
_LEGACY: dict[str, tuple[str, str]] = {
    "EST": (_SUMMER, "'America/New_York' (or 'America/Panama' to keep -05:00 all year)"),
    "MST": (_SUMMER, "'America/Denver' (or 'America/Phoenix' to keep -07:00 all year)"),
    "HST": (
        "it names no place, so it would not follow Hawaii if its rules changed",
        "'Pacific/Honolulu'",
    ),
}
# Etc/GMT+5 is UTC-05:00 (POSIX signs). Etc/GMT, Etc/GMT0, Etc/GMT+0 and Etc/GMT-0 are UTC.
_ETC_GMT = re.compile(r"Etc/GMT[+-]0*[1-9][0-9]*", re.IGNORECASE)
_SAMPLE = datetime(2024, 1, 1, tzinfo=UTC)


def refuse_fixed_offset(zone: ZoneInfo, *, field: str) -> None:
    """Raise :class:`~cronlock.ScheduleError` if *zone* is a fixed-offset zone name.

    The message names *field*, the name, its offset and the zone to use instead. Zones
    with no key (``ZoneInfo.from_file``) pass: there is no name to judge them by.
    """
    key = zone.key
    if not key:
        return
    given = f"{field}={key!r}"
    name = key.upper()
    if name == "FACTORY":
        raise ScheduleError(
            f"{given} is tzdata's placeholder for a zone not yet configured, not a place's "
            "clock; use a region zone, such as 'Europe/Berlin', or 'UTC'"
        )
    legacy = _LEGACY.get(name)
    if legacy is None and not _ETC_GMT.fullmatch(key):
        return
    offset = _format(_SAMPLE.astimezone(zone).utcoffset())
    if legacy is not None:
        wrong, instead = legacy
        raise ScheduleError(
            f"{given} is a fixed offset of {offset} with no daylight saving time; {wrong}. "
            f"Use a region zone, such as {instead}"
        )
    raise ScheduleError(
        f"{given} is a fixed offset of {offset} (Etc/GMT names invert the sign) with no "
        "daylight saving time, so a schedule in it drifts an hour from any local clock that "
        "moves for summer. Use the region zone of the place whose clock the schedule follows, "
        "such as 'Europe/Berlin', or 'UTC' for UTC itself"
    )


def _format(offset: timedelta | None) -> str:
    minutes = int((offset or timedelta(0)).total_seconds()) // 60
    sign = "-" if minutes < 0 else "+"
    hours, minutes = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{minutes:02d}"
