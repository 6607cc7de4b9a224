"""Time-zone resolution and the wall-clock -> UTC mapping under Vixie/Debian cron rules."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._errors import ScheduleError

__all__ = (
    "TimeZone",
    "WallSource",
    "first_instant_after",
    "local_wall",
    "resolve_tz",
    "to_utc",
    "wall_to_instants",
)

TimeZone = str | ZoneInfo

_UTC_ZONE = ZoneInfo("UTC")
# Offsets around a point are sampled this far each side; no real zone moves twice in it.
_WINDOW = timedelta(hours=26)


def resolve_tz(tz: TimeZone | tzinfo | None, *, field: str = "tz") -> ZoneInfo:
    """Return a :class:`ZoneInfo` for an IANA name or ZoneInfo; ``None`` means UTC.

    Fixed-offset tzinfos (``timezone(timedelta(hours=2))``) are rejected: they have no DST
    rules, so a schedule in them silently drifts by an hour twice a year.
    """
    if tz is None:
        return _UTC_ZONE
    if isinstance(tz, ZoneInfo):
        return tz
    if tz is UTC:
        return _UTC_ZONE
    if isinstance(tz, str):
        if not tz or tz != tz.strip():
            raise ScheduleError(f"{field}: {tz!r} is not an IANA time zone name")
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ScheduleError(
                f"{field}: unknown time zone {tz!r} (use an IANA name like 'Europe/Berlin')"
            ) from exc
    raise ScheduleError(
        f"{field}: {tz!r} is not an IANA zone; fixed offsets have no DST rules, "
        "pass a name like 'Europe/Berlin' or a zoneinfo.ZoneInfo"
    )


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
    """The first UTC instant in (lo, hi] whose offset differs from lo's (bisection)."""
    base = lo.astimezone(tz).utcoffset()
    step = timedelta(seconds=1)
    while hi - lo > step:
        mid = lo + (hi - lo) / 2
        mid = mid.replace(microsecond=0)
        if mid <= lo:
            break
        if mid.astimezone(tz).utcoffset() == base:
            lo = mid
        else:
            hi = mid
    return hi


def _offset_range(tz: ZoneInfo, around: datetime) -> tuple[timedelta, timedelta]:
    """The smallest and largest UTC offset the zone uses within ~a day of *around*."""
    offsets = [
        (around + k * (_WINDOW / 2)).astimezone(tz).utcoffset() for k in (-2, -1, 0, 1, 2)
    ]
    values = [o for o in offsets if o is not None]
    return min(values), max(values)


def local_wall(instant: datetime, tz: ZoneInfo) -> datetime:
    """The naive local wall time of a UTC instant."""
    return instant.astimezone(tz).replace(tzinfo=None, fold=0)


WallSource = Callable[[datetime], Iterable[datetime]]
"""Yields naive wall times strictly after a naive start, in increasing order."""


def first_instant_after(
    after: datetime, tz: ZoneInfo, walls_from: WallSource, *, fixed: bool
) -> datetime | None:
    """The earliest firing instant strictly after *after* (aware UTC), or None.

    Mapping wall times to instants is monotonic except around a fall-back, where a
    wildcard job's second pass comes after later wall times' first pass; so candidates are
    scanned from the earliest wall time that could fire after *after* until no later wall
    time could beat the best instant found. Far from any transition the first candidate wins.
    """
    lo_off, hi_off = _offset_range(tz, after)
    naive_after = after.astimezone(UTC).replace(tzinfo=None)
    # A wall time w fires at w - offset >= w - hi_off and <= w - lo_off.
    start = naive_after + lo_off
    best: datetime | None = None
    naive_best = naive_after
    for wall in walls_from(start):
        if best is not None and wall - hi_off >= naive_best:
            return best
        for instant in wall_to_instants(wall, tz, fixed=fixed):
            if instant > after and (best is None or instant < best):
                best = instant
                naive_best = best.replace(tzinfo=None)
                lo2, hi2 = _offset_range(tz, best)
                if lo_off == hi_off == lo2 == hi2:
                    return best  # one offset throughout: the mapping is monotonic
                hi_off = max(hi_off, hi2)
    return best
