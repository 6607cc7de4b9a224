"""Properties every schedule must have, whatever the zone: the slot contract of DESIGN §1."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import given, settings
from hypothesis import strategies as st

from cronlock._schedules.calendar import daily, monthly, weekly
from cronlock._schedules.cron import cron
from cronlock._schedules.interval import every
from cronlock._schedules.schedule import Schedule
from cronlock._schedules.tz import first_instant_after

ZONES = [
    ZoneInfo(name)
    for name in (
        "UTC",
        "America/New_York",
        "Europe/Berlin",
        "Australia/Lord_Howe",
        "Europe/Dublin",
        "Asia/Kolkata",
    )
]
EXPRESSIONS = [
    "* * * * *",
    "*/15 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "30 1 * * *",
    "0,30 2 * * *",
    "*/7 1-3 * * *",
    "59 1 * * *",
    "0 */2 * * *",
    "15 2 * * *",
    "0 0 */2 * 1",
    "0 0 29 2 *",
    "0 9 * * mon-fri",
    "0 0 L * *",
    "@weekly",
    "0 0 1 * 1",
    "0 0 1,15 * 1#1",
    "30 2 * * 0L",
    "*/30 1-3 * * 5,sun#2",
    "0 12 LW,15W * ?",
]
zones = st.sampled_from(ZONES)
UTC_ZONE = ZoneInfo("UTC")
# Instants around the years schedules run in, with microseconds; DST days are dense enough
# over 2000-2050 that a few hundred examples hit them, and the explicit ones below force it.
instants = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2050, 1, 1), timezones=st.just(UTC)
)
near_transitions = st.builds(
    lambda day, minutes: day + timedelta(minutes=minutes),
    st.sampled_from(
        [
            datetime(2024, 3, 10, 7, tzinfo=UTC),
            datetime(2024, 11, 3, 6, tzinfo=UTC),
            datetime(2024, 3, 31, 1, tzinfo=UTC),
            datetime(2024, 10, 27, 1, tzinfo=UTC),
            datetime(2024, 4, 6, 15, tzinfo=UTC),
            datetime(2024, 10, 5, 15, 30, tzinfo=UTC),
        ]
    ),
    st.integers(-36 * 60, 36 * 60),
)
times = st.builds(
    lambda h, m, s: f"{h:02}:{m:02}:{s:02}",
    st.integers(0, 23),
    st.sampled_from([0, 15, 30, 59]),
    st.sampled_from([0, 0, 30]),
)

schedules: st.SearchStrategy[Schedule] = st.one_of(
    st.builds(lambda e, z: cron(e, tz=z), st.sampled_from(EXPRESSIONS), zones),
    st.builds(
        lambda s, z: cron(s, seconds=True, tz=z),
        st.sampled_from(["*/20 * * * * *", "30 30 2 * * *", "0 */5 1,2 * * *"]),
        zones,
    ),
    st.builds(
        lambda us, anchor: every(timedelta(microseconds=us), anchor=anchor),
        st.integers(1, 10**12),
        instants,
    ),
    st.builds(
        lambda at, n, z: daily(at, every=n, tz=z),
        st.lists(times, min_size=1, max_size=3),
        st.integers(1, 5),
        zones,
    ),
    st.builds(
        lambda on, at, n, z: weekly(on, at, every=n, tz=z),
        st.lists(st.integers(0, 6), min_size=1, max_size=3),
        times,
        st.integers(1, 3),
        zones,
    ),
    st.builds(
        lambda on, at, n, z: monthly(on, at, every=n, tz=z),
        st.lists(st.integers(1, 31) | st.integers(-31, -1), min_size=1, max_size=3),
        times,
        st.integers(1, 4),
        zones,
    ),
)


def _check(schedule: Schedule, start: datetime, fraction: float) -> None:
    slots: list[datetime] = []
    current = start
    for _ in range(4):
        slot = schedule.next_after(current)
        assert slot is not None
        assert slot.tzinfo is UTC
        assert slot > current
        slots.append(slot)
        current = slot
    assert slots == sorted(set(slots))  # strictly increasing
    # A restart anywhere between two slots (or between the start and the first slot)
    # yields the same next slot as iterating: that is what lets replicas agree.
    previous = start
    for slot in slots:
        between = previous + (slot - previous) * fraction
        between = min(max(between, previous), slot - timedelta(microseconds=1))
        assert schedule.next_after(between) == slot
        assert schedule.next_after(slot - timedelta(microseconds=1)) == slot
        previous = slot


@settings(max_examples=300, deadline=None)
@given(schedules, instants, st.floats(0, 1))
def test_slot_contract(schedule: Schedule, start: datetime, fraction: float) -> None:
    _check(schedule, start, fraction)


@settings(max_examples=300, deadline=None)
@given(schedules, near_transitions, st.floats(0, 1))
def test_slot_contract_around_dst(schedule: Schedule, start: datetime, fraction: float) -> None:
    _check(schedule, start, fraction)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(EXPRESSIONS), zones, near_transitions)
def test_slots_are_wall_matches_or_dst_moves(expr: str, tz: ZoneInfo, start: datetime) -> None:
    """Away from a gap a slot's local time matches the expression; same for both passes."""
    job = cron(expr, tz=tz)
    slot = job.next_after(start)
    assert slot is not None
    local = slot.astimezone(tz)
    just_before = (slot - timedelta(seconds=1)).astimezone(tz)
    if local.utcoffset() == just_before.utcoffset():
        # Not at a transition instant, so not a gap-shifted fixed-time slot.
        assert cron(expr, tz=UTC_ZONE).next_after(
            local.replace(tzinfo=UTC) - timedelta(microseconds=1)
        ) == local.replace(tzinfo=UTC)


@given(
    st.sampled_from(EXPRESSIONS),
    zones,
    st.lists(near_transitions | instants, min_size=1, max_size=6),
    st.lists(st.floats(0, 1), min_size=1, max_size=4),
)
def test_a_crons_remembered_answers_are_its_answers(
    expr: str, tz: ZoneInfo, starts: list[datetime], fractions: list[float]
) -> None:
    # next_after remembers spans (thousands of tenants share an expression): whatever was
    # asked before, each answer is the one worked out afresh, at the instants asked and at
    # instants inside the spans they made (the overdue verdict asks from such instants).
    schedule = cron(expr, tz=tz)

    def afresh(after: datetime) -> datetime | None:
        return first_instant_after(after, tz, schedule._walls_from, fixed=schedule.fixed_time)

    for start in starts:
        slot = schedule.next_after(start)
        assert slot == afresh(start)
        assert slot is not None
        for fraction in fractions:
            inside = start + (slot - start) * fraction
            assert schedule.next_after(inside) == afresh(inside)
        assert schedule.next_after(slot) == afresh(slot)
        assert cron(expr, tz=tz).next_after(start) == slot  # an equal schedule shares them
