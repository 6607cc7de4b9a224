"""The day fields with L, W, # and ?: Debian's union and OR/AND rules, exact dates.

Debian has no ``L``, ``W`` or ``#``; cronlock gives them the meaning Debian's rules give any
value: a field is the union of its elements, and the two day fields OR unless one starts
with ``*`` (or is ``?``). Checked three ways: hand-written dates (read off a printed
calendar), the independent reference in debian_cron.py, and refusals with their messages.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from itertools import takewhile

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import cronlock._schedules.cron as cron_module
from cronlock._errors import ScheduleError
from cronlock._schedules.cron import cron
from cronlock._schedules.schedule import upcoming

from .debian_cron import fire_days


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def days(year: int, *month_days: tuple[int, int]) -> list[datetime]:
    return [utc(year, month, day) for month, day in month_days]


# (expression, after, the next slots). 2024: 1 Jan a Monday, a leap year; 2100 is not one.
TABLE: list[tuple[str, datetime, list[datetime]]] = [
    # Both day fields restricted: OR -- the 1st, the 15th, and the first Monday.
    (
        "0 0 1,15 * 1#1",
        utc(2023, 12, 31),
        days(2024, (1, 1), (1, 15), (2, 1), (2, 5), (2, 15), (3, 1), (3, 4), (3, 15), (4, 1)),
    ),
    ("0 0 15 * fri#2", utc(2024, 1, 1), days(2024, (1, 12), (1, 15), (2, 9), (2, 15), (3, 8))),
    ("0 0 1 * 5L", utc(2024, 1, 1), days(2024, (1, 26), (2, 1), (2, 23), (3, 1), (3, 29))),
    ("0 0 15 * 7#1", utc(2024, 1, 1), days(2024, (1, 7), (1, 15), (2, 4), (2, 15), (3, 3))),
    (
        "0 0 L,15W * 1#1",
        utc(2024, 1, 1),
        days(2024, (1, 15), (1, 31), (2, 5), (2, 15), (2, 29), (3, 4), (3, 15), (3, 31)),
    ),
    # A list is a union; '*' first makes the day fields AND, and '*' in the list is every day.
    ("0 0 * * *,sat#3", utc(2024, 1, 1), days(2024, (1, 2), (1, 3), (1, 4), (1, 5))),
    ("0 0 1 * *,sat#3", utc(2024, 1, 1), days(2024, (2, 1), (3, 1), (4, 1))),
    (
        "0 0 * * 5,6#3",
        utc(2024, 1, 1),
        days(2024, (1, 5), (1, 12), (1, 19), (1, 20), (1, 26), (2, 2), (2, 9), (2, 16), (2, 17)),
    ),
    # Day of month starting with '*': last Fridays that fall on odd days.
    (
        "0 0 */2 * 5L",
        utc(2024, 1, 1),
        days(2024, (2, 23), (3, 29), (5, 31), (9, 27), (10, 25), (11, 29), (12, 27)),
    ),
    # '?' is '*': the other field alone decides.
    ("0 0 ? * 1#1", utc(2024, 1, 1), days(2024, (2, 5), (3, 4), (4, 1))),
    ("0 0 15W * ?", utc(2024, 5, 1), days(2024, (5, 15), (6, 14), (7, 15), (8, 15), (9, 16))),
    # A fifth weekday only some months have; in February only day 29 of a leap year is one.
    ("0 0 * * 2#5", utc(2024, 1, 1), days(2024, (1, 30), (4, 30), (7, 30), (10, 29), (12, 31))),
    ("0 0 * 2 4#5", utc(2024, 1, 1), [utc(2024, 2, 29), utc(2052, 2, 29), utc(2080, 2, 29)]),
    ("0 0 30 2 1#5", utc(2024, 1, 1), [utc(2044, 2, 29), utc(2072, 2, 29)]),
    (
        "0 0 * 2 sun#5,mon#5,tue#5,wed#5,thu#5,fri#5,sat#5",
        utc(2024, 3, 1),
        [utc(2028, 2, 29), utc(2032, 2, 29), utc(2036, 2, 29)],
    ),
    ("0 0 * * L5", utc(2024, 1, 1), days(2024, (1, 26), (2, 23), (3, 29))),
    # L, LW and W at the month's edges.
    (
        "0 0 L 2 *",
        utc(2024, 1, 1),
        [utc(2024, 2, 29), utc(2025, 2, 28), utc(2026, 2, 28), utc(2027, 2, 28), utc(2028, 2, 29)],
    ),
    (
        "0 0 L 2 *",
        utc(2099, 3, 1),
        [utc(2100, 2, 28), utc(2101, 2, 28), utc(2102, 2, 28), utc(2103, 2, 28), utc(2104, 2, 29)],
    ),
    (
        "0 0 LW * *",
        utc(2024, 1, 1),
        days(2024, *[(1, 31), (2, 29), (3, 29), (4, 30), (5, 31), (6, 28), (7, 31), (8, 30)]),
    ),
    ("0 0 LW * *", utc(2026, 1, 31), days(2026, (2, 27), (3, 31), (4, 30), (5, 29), (6, 30))),
    (
        "0 0 1W * *",
        utc(2024, 5, 1),
        days(2024, (6, 3), (7, 1), (8, 1), (9, 2), (10, 1), (11, 1), (12, 2)),
    ),
    (
        "0 0 30W 1,3-12 *",
        utc(2024, 1, 1),
        days(2024, (1, 30), (3, 29), (4, 30), (5, 30), (6, 28), (7, 30), (8, 30), (9, 30)),
    ),
    (
        "0 0 31W 1,3,5,7,8,10,12 *",
        utc(2024, 12, 1),
        [utc(2024, 12, 31), *days(2025, (1, 31), (3, 31), (5, 30), (7, 31), (8, 29), (10, 31))],
    ),
    (
        "0 0 28W 2 *",
        utc(2024, 1, 1),
        [utc(2024, 2, 28), utc(2025, 2, 28), utc(2026, 2, 27), utc(2027, 2, 26), utc(2028, 2, 28)],
    ),
    # Sunday 29 February: 28 years apart, and 2100 is no leap year.
    ("0 0 29 2 */7", utc(2024, 1, 1), [utc(2032, 2, 29), utc(2060, 2, 29), utc(2088, 2, 29)]),
    ("0 0 29 2 */7", utc(2089, 1, 1), [utc(2128, 2, 29)]),
    # Times of day on the chosen days.
    (
        "30 9,17 * * 5L",
        utc(2024, 1, 1),
        [utc(2024, 1, 26, 9, 30), utc(2024, 1, 26, 17, 30), utc(2024, 2, 23, 9, 30)],
    ),
]


@pytest.mark.parametrize(("expr", "after", "expected"), TABLE)
def test_slots(expr: str, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(cron(expr), after, len(expected)) == expected


def test_seconds_field_with_extensions() -> None:
    job = cron("0 30 9 1,15 * mon#1", seconds=True)
    assert upcoming(job, utc(2024, 1, 1, 10), 4) == [
        utc(2024, 1, 15, 9, 30),
        utc(2024, 2, 1, 9, 30),
        utc(2024, 2, 5, 9, 30),
        utc(2024, 2, 15, 9, 30),
    ]


def test_restart_inside_a_chosen_day() -> None:
    job = cron("*/20 9-10 * * 5L", tz="Europe/Berlin")  # 09:00-10:40 CET = 08:00-09:40 UTC
    assert job.next_after(utc(2024, 1, 26, 8, 50)) == utc(2024, 1, 26, 9)
    assert job.next_after(utc(2024, 1, 26, 9, 40)) == utc(2024, 2, 23, 8)


# -- against the independent reference, over years with leap Februaries --

REFERENCE = [
    "0 0 1,15 * 1#1",
    "0 0 15 * fri#2",
    "0 0 1 * 5L",
    "0 0 * * *,sat#3",
    "0 0 * * 5,6#3",
    "0 0 1 * *,sat#3",
    "0 0 ? * 1#1",
    "0 0 15W * ?",
    "0 0 ? * ?",
    "0 0 * * 2#5",
    "0 0 * 2 4#5",
    "0 0 LW * *",
    "0 0 1W,15W * *",
    "0 0 30W 1,3-12 *",
    "0 0 31W 1,3,5,7,8,10,12 *",
    "0 0 L 2 *",
    "0 0 28W 2 *",
    "0 0 */2 * 5L",
    "0 0 L,15W * 1#1",
    "0 0 15 * 7#1",
    "0 0 1-7 * 0L",
    "0 0 LW * 1#1,3#1",
    "0 0 */3,L * mon#2",
    "0 0 10-20 * 1-5",
    "0 0 * * 1-3,5#2,sat#5",
    "0 0 1,L,LW,5W 2,8 *",
    "0 0 */10 * 1-5/2,sun#4",
]


@pytest.mark.parametrize("expr", REFERENCE)
def test_matches_the_reference(expr: str) -> None:
    start, end = date(2023, 12, 1), date(2029, 3, 1)
    expected = fire_days(expr, start, end)
    job = cron(expr)
    got: list[date] = []
    slot = job.next_after(utc(start.year, start.month, start.day) - timedelta(microseconds=1))
    while slot is not None and slot.date() < end:
        got.append(slot.date())
        slot = job.next_after(slot)
    assert got == expected


def _field(elements: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A comma list, sometimes led by '*' (which makes the day fields AND), or '?'."""
    body = st.lists(elements, min_size=1, max_size=3).map(",".join)
    return st.one_of(
        body,
        body.map(lambda text: f"*,{text}"),
        st.sampled_from(["*", "?", "*/2", "*/3"]),
    )


def _range(low: int, high: int) -> st.SearchStrategy[str]:
    return st.tuples(st.integers(low, high), st.integers(low, high), st.integers(1, 9)).map(
        lambda t: f"{min(t[:2])}-{max(t[:2])}" + (f"/{t[2]}" if t[2] > 1 else "")
    )


DOM = _field(
    st.one_of(
        st.integers(1, 31).map(str),
        _range(1, 31),
        st.sampled_from(["L", "LW"]),
        st.integers(1, 28).map(lambda day: f"{day}W"),
    )
)
DOW = _field(
    st.one_of(
        st.integers(0, 7).map(str),
        st.sampled_from(["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
        _range(0, 7),
        st.tuples(st.integers(0, 7), st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"),
        st.integers(0, 7).map(lambda weekday: f"{weekday}L"),
    )
)
MONTHS = st.just("*") | st.lists(st.integers(1, 12), min_size=1, max_size=3).map(
    lambda months: ",".join(map(str, months))
)


@settings(max_examples=400, deadline=None)
@given(DOM, MONTHS, DOW, st.integers(1995, 2105))
def test_any_day_fields_match_the_reference(dom: str, months: str, dow: str, year: int) -> None:
    expr = f"0 0 {dom} {months} {dow}"
    try:
        matcher = cron_module._compile(expr, False).days
    except ScheduleError as exc:
        refusal = str(exc)
    else:
        start, end = date(year, 1, 1), date(year + 1, 3, 1)
        got = list(takewhile(lambda day: day < end, matcher.dates_from(start)))
        assert got == fire_days(expr, start, end)
        return
    event("refused: never fires")
    assert "never fires" in refusal
    assert fire_days(expr, date(2001, 1, 1), date(2029, 1, 1)) == []  # every month shape


@pytest.mark.parametrize(
    ("expr", "fires"),
    [
        ("0 0 */40 * 1#2", False),  # the 1st AND a second Monday
        ("0 0 */31 * 2L", False),  # the 1st AND a last Tuesday
        ("0 0 LW * */7", False),  # a last weekday AND a Sunday
        ("0 0 1W,15W * */7", False),  # a nearest weekday AND a Sunday
        ("0 0 1W,15W * 0,6", True),  # OR: every weekend day
        ("0 0 */31 * 2#1", True),  # the 1st AND a first Tuesday
    ],
)
def test_never_fires_agrees_with_the_reference(expr: str, fires: bool) -> None:
    assert (fire_days(expr, date(2001, 1, 1), date(2029, 1, 1)) != []) is fires  # all shapes
    if fires:
        assert cron(expr).next_after(utc(2001, 1, 1)) is not None
    else:
        with pytest.raises(ScheduleError, match="never fires"):
            cron(expr)


# -- refused at definition time, with the field, the value and the reason --


@pytest.mark.parametrize(
    ("expr", "fragments"),
    [
        (
            "0 0 31W * *",
            [
                "day-of-month field '31W':",
                "February, April, June, September, November have no day 31",
                "croniter takes the month's last weekday",
                "LW",
            ],
        ),
        ("0 0 29W * *", ["field '29W':", "February in common years has no day 29"]),
        ("0 0 1,30W 1-3 *", ["field '1,30W': 30W:", "February has no day 30"]),
        ("0 0 * * L", ["day-of-week field 'L'", "'5L'"]),
        ("0 0 L-3 * *", ["day-of-month field 'L-3'", "'L-n'", "not supported"]),
        ("0 0 * * 1-5#1", ["day-of-week field '1-5#1'", "single weekday"]),
        ("0 0 1#1 * *", ["day-of-month field '1#1'", "day-of-week field"]),
        ("0 0 1-15W * *", ["day-of-month field '1-15W'", "single day"]),
        ("0 0 0W * *", ["day-of-month field '0W'", "out of range 1-31"]),
        ("0 0 * * 8L", ["day-of-week field '8L'", "out of range 0-7"]),
        ("0 0 * * 5#0", ["day-of-week field '5#0'", "1-5"]),
        ("0 0 * * 1,5#6", ["day-of-week field '1,5#6'", "'5#6'", "1-5"]),
        (
            "0 0 */40 * 1#2",
            ["never fires", "both day-of-month '*/40' and day-of-week '1#2'", "starts with '*'"],
        ),
    ],
)
def test_refusals_name_the_field_and_the_reason(expr: str, fragments: list[str]) -> None:
    with pytest.raises(ScheduleError) as info:
        cron(expr)
    for fragment in fragments:
        assert fragment in str(info.value)
