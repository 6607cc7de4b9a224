"""Which days a cron expression fires on: Debian's day rule over croniter's extensions.

Debian cron has no ``L``, ``W`` or ``#``; cronlock accepts them (as croniter does) and gives
them the meaning Debian's rule gives any other value:

* a field's elements are a union: ``1,15,L`` is the 1st, the 15th and the last day;
  ``5,6#3`` every Friday plus the third Saturday;
* the two day fields OR when both are restricted and AND when either *starts* with ``*``
  (or is ``?``): ``0 0 1,15 * 1#1`` is the 1st, the 15th and the first Monday;
  ``0 0 * * *,sat#3`` is every day.

croniter 7 gets several of these wrong (``0 0 1,15 * 1#1`` fires on first Mondays only,
``0 0 15 * fri#2`` never, ``5,6#3`` is refused), so the day fields never reach croniter:
it only walks the time of day inside the days found here.

What each extension means:

* ``L`` (day of month): the last day of the month. ``LW``: its last weekday (Mon-Fri).
* ``15W``: the weekday nearest the 15th within the month: a Saturday moves to the Friday
  before (to Monday the 3rd for ``1W``), a Sunday to the Monday after (to the Friday before
  for the month's last day).
* ``5#2`` / ``fri#2``: the second Friday (weeks 1-5; a month without a fifth one has none).
* ``5L`` / ``L5`` / ``friL``: the last Friday of the month.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date

__all__ = ("DayFields", "DayMatcher", "FieldError", "month_length")

_VALUE = r"[0-9]+|[a-z]{3}"
_NTH_RE = re.compile(rf"^(?P<day>{_VALUE})#(?P<nth>[0-9]+)$")
_LAST_DOW_RE = re.compile(rf"^(?:l(?P<a>{_VALUE})|(?P<b>{_VALUE})l)$")
_NEAREST_RE = re.compile(r"^(?:(?P<a>[0-9]+)w|w(?P<b>[0-9]+))$")
_SHORTEST = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February: common years

Number = Callable[[str], int]
"""Reads one value of the field (a number or a name) and checks its range."""


class FieldError(Exception):
    """A problem in one field; turned into a ScheduleError naming the expression."""


@dataclass
class DayFields:
    """The two day fields as parsed: plain values plus the extensions, each a union."""

    dom: set[int] = field(default_factory=set)
    """Plain days of the month, 1-31."""
    dow: set[int] = field(default_factory=set)
    """Plain weekdays, 0 = Sunday."""
    last: bool = False
    last_weekday: bool = False
    nearest: set[int] = field(default_factory=set)
    nth: set[tuple[int, int]] = field(default_factory=set)
    """(weekday, week number 1-5)."""
    last_dow: set[int] = field(default_factory=set)

    @property
    def dom_extended(self) -> bool:
        """Whether the day-of-month field uses ``L`` or ``W``."""
        return self.last or self.last_weekday or bool(self.nearest)

    def add_dom_extension(self, element: str, number: Number) -> bool:
        """Record ``L``, ``LW`` or ``nW``; False if *element* is none of them."""
        if element == "l":
            self.last = True
        elif element == "lw":
            self.last_weekday = True
        elif m := _NEAREST_RE.match(element):
            self.nearest.add(number(m["a"] or m["b"]))
        elif "#" in element:
            raise FieldError("'#' (the nth weekday) belongs in the day-of-week field")
        elif re.fullmatch(r"l-[0-9]+", element):
            raise FieldError("offsets from the last day ('L-n') are not supported")
        elif "w" in element and not element.isalpha():
            raise FieldError("'W' takes a single day, as in '15W', or 'LW'")
        else:
            return False
        return True

    def add_dow_extension(self, element: str, number: Number) -> bool:
        """Record ``n#k`` or ``nL``; False if *element* is neither."""
        if m := _NTH_RE.match(element):
            nth = int(m["nth"])
            if not 1 <= nth <= 5:
                raise FieldError("the week number after '#' must be 1-5")
            self.nth.add((number(m["day"]) % 7, nth))
        elif m := _LAST_DOW_RE.match(element):
            self.last_dow.add(number(m["a"] or m["b"]) % 7)
        elif element == "l":
            raise FieldError(
                "'L' alone means different days in different crons; "
                "write the weekday with it, as in '5L' for the last Friday"
            )
        elif "#" in element:
            raise FieldError("'#' takes a single weekday and a week number, as in 'fri#2'")
        else:
            return False
        return True

    def missing_nearest(self, months: set[int]) -> tuple[int, list[int]] | None:
        """A ``nW`` day that some selected month lacks, with those months; else None.

        There is no weekday nearest to a day that does not exist, and crons disagree on
        what to do (croniter takes the month's last weekday): refused rather than guessed.
        """
        for day in sorted(self.nearest, reverse=True):
            if lacking := [m for m in sorted(months) if day > _SHORTEST[m]]:
                return day, lacking
        return None

    def _dom_days(self, length: int, first: int) -> set[int]:
        days = {d for d in self.dom if d <= length}
        if self.last:
            days.add(length)
        if self.last_weekday:
            days.add(_nearest_weekday(length, length, first))
        days.update(_nearest_weekday(d, length, first) for d in self.nearest if d <= length)
        return days

    def _dow_days(self, length: int, first: int) -> set[int]:
        days: set[int] = set()
        for day in range(1, length + 1):
            weekday = (first + day - 1) % 7
            if (
                weekday in self.dow
                or (weekday, (day + 6) // 7) in self.nth
                or (weekday in self.last_dow and day + 7 > length)
            ):
                days.add(day)
        return days

    def month_days(self, length: int, first: int, *, both: bool) -> tuple[int, ...]:
        """The matching days of a month of *length* days whose 1st is weekday *first*."""
        dom, dow = self._dom_days(length, first), self._dow_days(length, first)
        return tuple(sorted(dom & dow if both else dom | dow))


def _nearest_weekday(day: int, length: int, first: int) -> int:
    """The weekday (Mon-Fri) nearest *day*, within the month (Quartz's ``W``)."""
    weekday = (first + day - 1) % 7  # 0 = Sunday
    if weekday == 6:  # Saturday: the Friday before, or Monday the 3rd
        return day - 1 if day > 1 else day + 2
    if weekday == 0:  # Sunday: the Monday after, or the Friday before the month's end
        return day + 1 if day < length else day - 2
    return day


class DayMatcher:
    """The dates an expression's month and day fields select, month by month.

    Which days of a month match depends only on its length and the weekday of its 1st,
    so the 28 possible answers are computed once; finding the next date costs one lookup
    per month, with no iteration over days that cannot match.
    """

    __slots__ = ("_months", "_table")

    def __init__(self, fields: DayFields, months: set[int], *, both: bool) -> None:
        """*both*: the day fields AND (one starts with ``*`` or is ``?``), else OR."""
        self._months = frozenset(months)
        self._table = {
            (length, first): fields.month_days(length, first, both=both)
            for length in (28, 29, 30, 31)
            for first in range(7)
        }

    def never_fires(self) -> bool:
        """True when no date in any year matches (every month shape occurs in 28 years)."""
        lengths = {2: (28, 29)}
        return not any(
            self._table[length, first]
            for month in self._months
            for length in lengths.get(month, (_SHORTEST[month],))
            for first in range(7)
        )

    def dates_from(self, start: date) -> Iterator[date]:
        """The matching dates on or after *start*, increasing (until the year 9999)."""
        year, month, day = start.year, start.month, start.day
        while year <= 9999:
            if month in self._months:
                weekday = date(year, month, 1).weekday()  # Monday = 0
                length = month_length(year, month)
                days = self._table[length, (weekday + 1) % 7]
                for d in days[bisect_left(days, day) :]:
                    yield date(year, month, d)
            day = 1
            month += 1
            if month == 13:
                year, month = year + 1, 1


def month_length(year: int, month: int) -> int:
    """Days in *month* of *year* (the calendar module costs ~5 ms to import)."""
    if month == 12:
        return 31
    return (date(year, month + 1, 1) - date(year, month, 1)).days
