"""DST under Debian cron rules: hand-written tables, and cron() against a reference daemon."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cronlock._schedules.cron import cron
from cronlock._schedules.schedule import upcoming

from .debian_cron import fire_days, parse, simulate, transitions

NY = ZoneInfo("America/New_York")  # 2024: -5 -> -4 on 10 Mar 07:00Z; back on 3 Nov 06:00Z
BERLIN = ZoneInfo("Europe/Berlin")  # 2024: +1 -> +2 on 31 Mar 01:00Z; back on 27 Oct 01:00Z
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")  # +11 -> +10:30 on 6 Apr 15:00Z; back 5 Oct 15:30Z
DUBLIN = ZoneInfo("Europe/Dublin")  # tzdata: winter GMT is the "negative DST"; IST (+1) summer
ZONES = [NY, BERLIN, LORD_HOWE, DUBLIN]


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


TABLE: list[tuple[str, ZoneInfo, datetime, list[datetime]]] = [
    # New York, spring forward: 02:00-02:59 EST do not exist.
    ("30 2 * * *", NY, utc(2024, 3, 9, 12), [utc(2024, 3, 10, 7), utc(2024, 3, 11, 6, 30)]),
    (
        "0,30 2 * * *",
        NY,
        utc(2024, 3, 10, 5),
        [utc(2024, 3, 10, 7), utc(2024, 3, 11, 6), utc(2024, 3, 11, 6, 30)],
    ),
    (
        "*/30 * * * *",
        NY,
        utc(2024, 3, 10, 6, 15),
        [utc(2024, 3, 10, 6, 30), utc(2024, 3, 10, 7), utc(2024, 3, 10, 7, 30)],
    ),
    (
        "0 * * * *",
        NY,
        utc(2024, 3, 10, 5, 30),
        [utc(2024, 3, 10, 6), utc(2024, 3, 10, 7), utc(2024, 3, 10, 8)],
    ),
    ("*/10 2 * * *", NY, utc(2024, 3, 9, 12), [utc(2024, 3, 11, 6)]),  # wildcard: skipped
    # New York, fall back: 01:00-01:59 happen twice (EDT, then EST).
    ("30 1 * * *", NY, utc(2024, 11, 2, 12), [utc(2024, 11, 3, 5, 30), utc(2024, 11, 4, 6, 30)]),
    ("0 2 * * *", NY, utc(2024, 11, 2, 12), [utc(2024, 11, 3, 7), utc(2024, 11, 4, 7)]),
    (
        "*/30 * * * *",
        NY,
        utc(2024, 11, 3, 4, 45),
        [
            utc(2024, 11, 3, 5),
            utc(2024, 11, 3, 5, 30),
            utc(2024, 11, 3, 6),
            utc(2024, 11, 3, 6, 30),
            utc(2024, 11, 3, 7),
        ],
    ),
    (
        "0 * * * *",
        NY,
        utc(2024, 11, 3, 4, 30),
        [utc(2024, 11, 3, 5), utc(2024, 11, 3, 6), utc(2024, 11, 3, 7)],
    ),
    ("30 * * * *", NY, utc(2024, 11, 3, 5, 45), [utc(2024, 11, 3, 6, 30)]),  # 01:30 EST
    # Berlin: 02:00-02:59 skipped in March, repeated in October.
    ("30 2 * * *", BERLIN, utc(2024, 3, 30, 12), [utc(2024, 3, 31, 1), utc(2024, 4, 1, 0, 30)]),
    (
        "30 2 * * *",
        BERLIN,
        utc(2024, 10, 26, 12),
        [utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)],
    ),
    (
        "*/30 * * * *",
        BERLIN,
        utc(2024, 10, 27, 0, 15),
        [
            utc(2024, 10, 27, 0, 30),
            utc(2024, 10, 27, 1),
            utc(2024, 10, 27, 1, 30),
            utc(2024, 10, 27, 2),
        ],
    ),
    # Lord Howe: a 30-minute shift. 02:00-02:29 skipped in October, 01:30-01:59 repeated in April.
    (
        "15 2 * * *",
        LORD_HOWE,
        utc(2024, 10, 4, 15, 45),
        [utc(2024, 10, 5, 15, 30), utc(2024, 10, 6, 15, 15)],
    ),
    (
        "45 1 * * *",
        LORD_HOWE,
        utc(2024, 4, 6, 12),
        [utc(2024, 4, 6, 14, 45), utc(2024, 4, 7, 15, 15)],
    ),
    (
        "*/30 * * * *",
        LORD_HOWE,
        utc(2024, 4, 6, 14, 10),
        [utc(2024, 4, 6, 14, 30), utc(2024, 4, 6, 15), utc(2024, 4, 6, 15, 30)],
    ),
    (
        "*/30 * * * *",
        LORD_HOWE,
        utc(2024, 10, 5, 15, 10),
        [utc(2024, 10, 5, 15, 30), utc(2024, 10, 5, 16)],
    ),
    # Dublin (negative DST in tzdata; offsets are what count): 01:00-01:59 skipped / repeated.
    ("30 1 * * *", DUBLIN, utc(2024, 3, 30, 12), [utc(2024, 3, 31, 1), utc(2024, 4, 1, 0, 30)]),
    (
        "30 1 * * *",
        DUBLIN,
        utc(2024, 10, 26, 12),
        [utc(2024, 10, 27, 0, 30), utc(2024, 10, 28, 1, 30)],
    ),
    (
        "*/30 * * * *",
        DUBLIN,
        utc(2024, 10, 27, 0, 10),
        [
            utc(2024, 10, 27, 0, 30),
            utc(2024, 10, 27, 1),
            utc(2024, 10, 27, 1, 30),
            utc(2024, 10, 27, 2),
        ],
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "expected"), TABLE)
def test_dst_table(expr: str, tz: ZoneInfo, after: datetime, expected: list[datetime]) -> None:
    assert upcoming(cron(expr, tz=tz), after, len(expected)) == expected


def test_restart_inside_the_repeated_hour() -> None:
    job = cron("*/30 * * * *", tz=NY)
    # 06:10Z is 01:10 EST, the second pass: the next slot is 01:30 EST, not 02:00.
    assert job.next_after(utc(2024, 11, 3, 6, 10)) == utc(2024, 11, 3, 6, 30)
    fixed = cron("30 1 * * *", tz=NY)
    assert fixed.next_after(utc(2024, 11, 3, 6, 10)) == utc(2024, 11, 4, 6, 30)


# -- the reference implementation itself must be right for the comparison to mean much --


def test_reference_parser() -> None:
    entry = parse("0 0 */2 * 1-7/3")
    assert entry.dom == frozenset(range(1, 32, 2))
    assert entry.dow == frozenset({1, 4, 0})
    assert entry.dom_star and not entry.dow_star and not entry.wildcard
    assert parse("*/15 3 * JAN-MAR *").month == frozenset({1, 2, 3})
    assert parse("@hourly").wildcard
    assert not parse("0 0 1 * 1").matches(datetime(2024, 1, 2))  # Tuesday the 2nd
    assert parse("0 0 1 * 1").matches(datetime(2024, 1, 8))  # OR: any Monday
    assert not parse("0 0 */2 * 1").matches(datetime(2024, 1, 8))  # AND: even day


def test_reference_day_extensions() -> None:
    """L, W, # and ? in the reference: hand-checked against a printed calendar."""
    d = date
    assert fire_days("0 0 1,15 * 1#1", d(2024, 2, 1), d(2024, 3, 1)) == [
        d(2024, 2, 1),
        d(2024, 2, 5),
        d(2024, 2, 15),
    ]
    assert fire_days("0 0 L * *", d(2024, 2, 1), d(2024, 3, 1)) == [d(2024, 2, 29)]
    assert fire_days("0 0 LW * *", d(2024, 3, 1), d(2024, 4, 1)) == [d(2024, 3, 29)]
    # 1 June 2024 is a Saturday: 1W moves forward; 31 March 2024 a Sunday: 31W moves back.
    assert fire_days("0 0 1W,15W * *", d(2024, 6, 1), d(2024, 7, 1)) == [
        d(2024, 6, 3),
        d(2024, 6, 14),
    ]
    assert fire_days("0 0 31W 3 *", d(2024, 1, 1), d(2025, 1, 1)) == [d(2024, 3, 29)]
    assert fire_days("0 0 * * 2#5", d(2024, 1, 1), d(2025, 1, 1)) == [
        d(2024, 1, 30),
        d(2024, 4, 30),
        d(2024, 7, 30),
        d(2024, 10, 29),
        d(2024, 12, 31),
    ]
    assert fire_days("0 0 * 2 4L", d(2024, 1, 1), d(2025, 1, 1)) == [d(2024, 2, 29)]
    assert fire_days("0 0 * * 5,6#3", d(2024, 1, 1), d(2024, 1, 22)) == [
        d(2024, 1, 5),
        d(2024, 1, 12),
        d(2024, 1, 19),
        d(2024, 1, 20),
    ]
    assert len(fire_days("0 0 * * *,sat#3", d(2024, 1, 1), d(2024, 2, 1))) == 31
    assert parse("0 0 ? * 1#1").dom_star
    assert fire_days("0 0 ? * 1#1", d(2024, 1, 1), d(2024, 3, 1)) == [d(2024, 1, 1), d(2024, 2, 5)]


def test_reference_simulator() -> None:
    start, end = utc(2024, 11, 2, 12), utc(2024, 11, 4)
    assert simulate("30 1 * * *", NY, start, end) == [utc(2024, 11, 3, 5, 30)]
    assert simulate("30 1 * * *", NY, utc(2024, 3, 9, 12), utc(2024, 3, 11)) == [
        utc(2024, 3, 10, 6, 30)
    ]
    assert simulate("30 2 * * *", NY, utc(2024, 3, 9, 12), utc(2024, 3, 11)) == [
        utc(2024, 3, 10, 7)
    ]
    assert simulate("0 * * * *", NY, utc(2024, 11, 3, 4, 30), utc(2024, 11, 3, 7, 30)) == [
        utc(2024, 11, 3, 5),
        utc(2024, 11, 3, 6),
        utc(2024, 11, 3, 7),
    ]
    assert transitions(LORD_HOWE, 2024) == [utc(2024, 4, 6, 15), utc(2024, 10, 5, 15, 30)]


# -- cron() against the reference daemon over whole transition days --

EXPRESSIONS = [
    "30 2 * * *",
    "30 1 * * *",
    "15 2 * * *",
    "59 1 * * *",
    "0 2 * * *",
    "0 3 * * *",
    "45 1 * * *",
    "0,30 2 * * *",
    "0 1-3 * * *",
    "15,45 1,2 * * *",
    "0-59/20 1,2 * * *",
    "1 3 * * 0-7",
    "0 2-3 * * sun",
    "30 2 */2 * *",
    "0 0 */2 * 1",
    "0 12 * * *",
    "59 23 * * *",
    "@daily",
    "*/30 * * * *",
    "*/15 * * * *",
    "*/7 1-3 * * *",
    "*/45 * * * *",
    "0 */2 * * *",
    "0 * * * *",
    "5 * * * *",
    "* * * * *",
    "* 2 * * *",
    "*/10 2 * * *",
    "30 0-4 * * *",
    "@hourly",
    # Transition days picked by L and #: last Sundays (Europe), 1st/2nd Sundays (NY, Lord Howe).
    "30 2 * * 0L",
    "30 1 * * sun#1,sun#2",
    "*/20 1-2 * * 0L,sun#1,7#2",
    "15 2 1,L * 0L",
    "45 1 LW * sun#1",
]
CASES = [(zone, moment) for zone in ZONES for moment in transitions(zone, 2024)]


@pytest.mark.parametrize(("tz", "transition"), CASES, ids=[f"{z.key}-{t:%m%d}" for z, t in CASES])
@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_matches_debian_cron(expr: str, tz: ZoneInfo, transition: datetime) -> None:
    start, end = transition - timedelta(hours=14), transition + timedelta(hours=14)
    expected = simulate(expr, tz, start, end)
    job = cron(expr, tz=tz)
    got: list[datetime] = []
    slot = job.next_after(start - timedelta(microseconds=1))
    while slot is not None and slot < end:
        got.append(slot)
        slot = job.next_after(slot)
    assert got == expected
