"""Time-zone resolution and the wall-clock -> UTC mapping under Vixie/Debian cron rules.

A schedule's zone stands for a wall clock people read. ``EST`` or ``Etc/GMT-1`` name no
place: they hold one offset all year, so ``0 3 * * *`` in ``EST`` fires at 04:00 New York
time all summer, and nothing at registration says so. :func:`resolve_tz` refuses them *by
name* (:func:`refuse_fixed_offset`): a zone whose offset never changes is not enough
(``Asia/Tokyo`` has no DST and is a real place's clock), and ``EST5EDT``, ``CET`` and the
like are accepted, because they do observe DST.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from .._errors import ScheduleError

__all__ = (
    "TimeZone",
    "WallSource",
    "first_instant_after",
    "local_wall",
    "refuse_fixed_offset",
    "resolve_tz",
    "to_utc",
    "wall_to_instants",
)

TimeZone = str | ZoneInfo

_UTC_ZONE = ZoneInfo("UTC")
# The longest IANA name is 32 characters (America/Argentina/ComodRivadavia); a longer one
# is refused before the file system is asked (which says "File name too long", with the
# path of the zone files).
MAX_ZONE_NAME = 64
# How far ahead to look for a fall-back whose repeated hour could still be to come;
# no real zone moves twice in it.
_WINDOW = timedelta(hours=26)


def resolve_tz(tz: TimeZone | tzinfo | None, *, field: str = "tz") -> ZoneInfo:
    """Return a :class:`ZoneInfo` for an IANA name or ZoneInfo; ``None`` means UTC.

    Fixed offsets are rejected, whether a tzinfo (``timezone(timedelta(hours=2))``) or a
    zone name that holds one (``EST``, ``Etc/GMT-1``): they have no DST rules, so a schedule
    in them silently drifts by an hour twice a year. UTC, however spelt, is accepted.
    """
    if tz is None:
        return _UTC_ZONE
    if isinstance(tz, ZoneInfo):
        refuse_fixed_offset(tz, field=field)
        return tz
    if tz is UTC:
        return _UTC_ZONE
    if isinstance(tz, str):
        if not tz or tz != tz.strip():
            raise ScheduleError(f"{field}: {tz!r} is not an IANA time zone name")
        if len(tz) > MAX_ZONE_NAME:
            raise ScheduleError(
                f"{field}: unknown time zone {tz[:MAX_ZONE_NAME]!r}... ({len(tz)} characters; "
                f"IANA names have at most {MAX_ZONE_NAME}, like 'Europe/Berlin')"
            )
        try:
            zone = ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            # OSError: a directory of the zone files ("Europe": IsADirectoryError) or a name
            # the file system refuses; its message would show the install path, not the name.
            raise ScheduleError(f"{field}: unknown time zone {tz!r} ({_region_hint(tz)})") from None
        refuse_fixed_offset(zone, field=field)
        return zone
    raise ScheduleError(
        f"{field}: {tz!r} is not an IANA zone; fixed offsets have no DST rules, "
        "pass a name like 'Europe/Berlin' or a zoneinfo.ZoneInfo"
    )


def _region_hint(name: str) -> str:
    """What to name instead of *name*: a zone of it when it is a region ("Europe")."""
    prefix = name.rstrip("/") + "/"
    zones = sorted(z for z in available_timezones() if z.startswith(prefix))
    if zones:
        return f"{name!r} is a region; name a zone in it, such as {zones[0]!r}"
    return "use an IANA name like 'Europe/Berlin'"


def to_utc(value: datetime, *, field: str = "datetime") -> datetime:
    """Convert an aware datetime to UTC; naive datetimes are rejected."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError(f"{field}: {value!r} is naive; pass an aware datetime")
    return value.astimezone(UTC)


def _exists(wall: datetime, tz: ZoneInfo) -> bool:
    aware = wall.replace(tzinfo=tz)
    back = aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None)
    return back == wall.replace(fold=0)


def wall_to_instants(wall: datetime, tz: ZoneInfo, *, fixed: bool) -> tuple[datetime, ...]:
    """Map one naive local wall time to the UTC instants at which it fires.

    * An ordinary wall time maps to its one instant.
    * A repeated wall time (fall-back): fixed-time jobs fire on the first pass only;
      wildcard jobs fire on both passes.
    * A skipped wall time (spring-forward gap): fixed-time jobs fire at the first instant
      after the gap; wildcard jobs do not fire.
    """
    first = wall.replace(tzinfo=tz, fold=0)
    second = wall.replace(tzinfo=tz, fold=1)
    if first.utcoffset() == second.utcoffset():
        return (first.astimezone(UTC),)
    if _exists(wall, tz):
        # Ambiguous: fold=0 is the earlier (first) pass.
        a, b = first.astimezone(UTC), second.astimezone(UTC)
        return (a,) if fixed else (a, b)
    if not fixed:
        return ()
    # In a gap: fold=1 reads the wall time with the offset from after the transition,
    # which lands before the gap; the transition itself is the first instant after it.
    before = wall.replace(tzinfo=tz, fold=0).utcoffset()
    after = wall.replace(tzinfo=tz, fold=1).utcoffset()
    assert before is not None and after is not None
    # Walk to the transition: the instant whose local time is the gap's end.
    lo = (wall - max(before, after)).replace(tzinfo=UTC)
    hi = (wall - min(before, after)).replace(tzinfo=UTC)
    return (_transition_in(lo, hi, tz),)


def _transition_in(lo: datetime, hi: datetime, tz: ZoneInfo) -> datetime:
    """The first UTC instant in (lo, hi] whose offset differs from lo's (bisection).

    Transitions fall on whole seconds, so the search runs on integer timestamps: exact
    whatever the microseconds of *lo* and *hi* (halving a timedelta and truncating could
    stall early and return an instant up to a second past the transition).
    """
    base = lo.astimezone(tz).utcoffset()
    a = math.floor(lo.timestamp())  # no whole-second transition lies in (a, lo]
    b = math.ceil(hi.timestamp())
    while b - a > 1:
        mid = (a + b) // 2
        if datetime.fromtimestamp(mid, UTC).astimezone(tz).utcoffset() == base:
            a = mid
        else:
            b = mid
    return datetime.fromtimestamp(b, UTC)


def local_wall(instant: datetime, tz: ZoneInfo) -> datetime:
    """The naive local wall time of a UTC instant."""
    return instant.astimezone(tz).replace(tzinfo=None, fold=0)


WallSource = Callable[[datetime], Iterable[datetime]]
"""Yields naive wall times strictly after a naive start, in increasing order."""

_TINY = timedelta(microseconds=1)


def first_instant_after(
    after: datetime, tz: ZoneInfo, walls_from: WallSource, *, fixed: bool
) -> datetime | None:
    """The earliest firing instant strictly after *after* (aware UTC), or None.

    Two increasing streams of candidates, the answer being the smaller head:

    * walls after the wall clock reading at *after*: each one's earliest instant after
      *after* (its first pass, the end of the gap for a fixed-time job in a gap, or, when
      *after* lies in a repeated hour, a wildcard job's second pass). Far from any
      transition its first wall wins: one step of *walls_from*.
    * only for wildcard jobs, and only when the clock is about to fall back: the second
      pass of the repeated walls, which may read *earlier* than the wall clock at *after*.
    """
    after = after.astimezone(UTC)
    best = _first_pass(after, tz, walls_from, fixed=fixed)
    if fixed:
        return best
    base = after.astimezone(tz).utcoffset()
    later = (after + _WINDOW).astimezone(tz).utcoffset()
    if base is None or later is None or later >= base:
        return best  # no fall-back ahead: nothing is repeated
    change = _transition_in(after, after + _WINDOW, tz)
    new = change.astimezone(tz).utcoffset()
    assert new is not None
    if new >= base or (best is not None and best <= change):
        return best  # it springs forward first, or a first-pass slot comes before
    # Walls in [local(change), local(change) + (base - new)) occur again after `change`.
    fold_start = local_wall(change, tz)
    for wall in walls_from(fold_start - _TINY):
        if wall < fold_start + (base - new):
            second = (wall - new).replace(tzinfo=UTC)
            if best is None or second < best:
                best = second
        break
    return best


def _first_pass(
    after: datetime, tz: ZoneInfo, walls_from: WallSource, *, fixed: bool
) -> datetime | None:
    """The earliest instant after *after* of the walls after its wall-clock reading."""
    start = local_wall(after, tz)
    while True:
        restart: datetime | None = None
        for wall in walls_from(start):
            instants = [i for i in wall_to_instants(wall, tz, fixed=fixed) if i > after]
            if instants:
                return min(instants)
            if not fixed and not _exists(wall, tz):
                # A wildcard wall in a gap: jump to the gap's end rather than step through
                # up to an hour of nonexistent minutes one croniter call at a time.
                (end,) = wall_to_instants(wall, tz, fixed=True)
                restart = local_wall(end, tz) - _TINY
                break
        if restart is None:
            return None
        start = restart


# -- fixed-offset zone names, refused ----------------------------------------------------

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
