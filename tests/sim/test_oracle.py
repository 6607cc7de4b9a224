"""The oracle judges from what a user sees, and each of its rules can fail."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cronlock import JobCrashed, JobSkipped
from cronlock._sim.fleet import Effect, Said
from cronlock._sim.oracle import JobView, Judged, judge

EPOCH = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
TICK = JobView("tick", "every:1", grace=60.0)


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


def ran(
    job: str, slot: float, begin: float, end: float, replica: str = "r0", attempt: int = 1
) -> list[Effect]:
    return [
        Effect("start", job, at(slot), attempt, replica, begin),
        Effect("end", job, at(slot), attempt, replica, end),
    ]


@dataclass
class Case:
    effects: list[Effect]
    said: list[Said]
    ledger: list[dict[str, Any]]

    def judge(
        self,
        jobs: tuple[JobView, ...] = (TICK,),
        window: tuple[float, float] = (0.0, 5.0),
        disruptions: tuple[tuple[float, float], ...] = (),
        frozen: tuple[tuple[str, float, float], ...] = (),
    ) -> Judged:
        return judge(
            jobs=jobs,
            epoch=EPOCH,
            window=window,
            settled=100.0,
            effects=self.effects,
            said=self.said,
            ledger=self.ledger,
            disruptions=disruptions,
            gone={},
            frozen=frozen,
        )


def all_ran() -> list[Effect]:
    return [e for s in range(5) for e in ran("tick", s, s + 0.001, s + 0.2)]


def rules(judged: Judged) -> list[str]:
    return [v.rule for v in judged.violations]


def test_every_slot_ran_once_is_clean() -> None:
    judged = Case(all_ran(), [], []).judge()
    assert judged.slots == 5 and judged.ran == 5 and not judged.violations


def test_a_slot_run_twice_is_a_violation() -> None:
    effects = all_ran() + ran("tick", 2, 2.5, 2.6, replica="r1")
    assert "twice" in rules(Case(effects, [], []).judge())


def test_two_runs_at_once_are_a_violation() -> None:
    effects = [e for s in range(5) for e in ran("tick", s, s, s + 1.5)]
    assert "overlap" in rules(Case(effects, [], []).judge())


def test_a_frozen_body_runs_nothing_but_what_it_does_once_awake_counts() -> None:
    """r1 runs slot 0 and is stopped from 0.5 s to 3.5 s; r0 runs slot 2 meanwhile."""
    frozen = (("r1", 0.5, 3.5),)
    slow = JobView("slow", "every:2", grace=60.0)
    meanwhile = ran("slow", 2, 2.0, 3.0, replica="r0")
    # Cancelled as it wakes: it did nothing while r0 ran.
    woken = ran("slow", 0, 0.0, 3.5, replica="r1") + meanwhile
    assert "overlap" not in rules(Case(woken, [], []).judge((slow,), (0.0, 3.0), frozen=frozen))
    # Not a freeze: the same spans are two runs at once.
    assert "overlap" in rules(Case(woken, [], []).judge((slow,), (0.0, 3.0)))
    # Awake, it goes on while r0's run of slot 2 still runs (now from 3.0 s to 5.0 s).
    later = ran("slow", 0, 0.0, 4.0, replica="r1") + ran("slow", 2, 3.0, 5.0, replica="r0")
    assert "overlap" in rules(Case(later, [], []).judge((slow,), (0.0, 3.0), frozen=frozen))
    # A run that starts and ends at one instant inside another's span still started
    # while that one ran.
    inside = ran("slow", 0, 0.0, 2.0, replica="r0") + ran("slow", 2, 1.0, 1.0, replica="r1")
    assert "overlap" in rules(Case(inside, [], []).judge((slow,), (0.0, 3.0)))


def test_a_slot_lost_without_a_word_is_a_violation() -> None:
    effects = [e for e in all_ran() if e.slot != at(3)]
    judged = Case(effects, [], []).judge()
    assert rules(judged) == ["silent"]


def test_a_locked_skip_is_not_a_fate() -> None:
    effects = [e for e in all_ran() if e.slot != at(3)]
    said = [Said("r1", 3.0, JobSkipped("tick", at(3), "locked"))]
    assert rules(Case(effects, said, []).judge()) == ["silent"]


def test_an_overlap_skip_is_a_fate() -> None:
    effects = [e for e in all_ran() if e.slot != at(3)]
    said = [Said("r0", 3.0, JobSkipped("tick", at(3), "overlap"))]
    assert not Case(effects, said, []).judge().violations


def test_a_ledger_outcome_is_a_fate_and_an_unfinished_row_is_a_violation() -> None:
    effects = [e for e in all_ran() if e.slot != at(3)]
    crashed = {"job": "tick", "slot": at(3), "outcome": "crashed", "host": "h", "pid": 1}
    assert not Case(effects, [], [crashed]).judge().violations
    unfinished = {**crashed, "outcome": None}
    assert sorted(rules(Case(effects, [], [unfinished]).judge())) == ["silent", "unfinished"]


def test_a_killed_replicas_last_claim_may_stay_unfinished_only_once_the_fleet_is_gone() -> None:
    row = {"job": "tick", "slot": at(4), "outcome": None, "host": "h", "pid": 1}
    effects = all_ran()

    def judged(fleet_gone: float | None) -> list[str]:
        return rules(
            judge(
                jobs=(TICK,),
                epoch=EPOCH,
                window=(0.0, 5.0),
                settled=100.0,
                effects=effects,
                said=[],
                ledger=[row],
                disruptions=(),
                gone={"r0": 4.5},
                killed={("h", 1)},
                fleet_gone=fleet_gone,
            )
        )

    assert judged(None) == ["unfinished"]  # a replica lives on: it must mark the claim
    assert judged(4.5) == []  # nobody is left to


def test_a_warning_naming_a_range_is_a_fate_but_its_one_run_must_have_run() -> None:
    line = logging.LogRecord(
        "cronlock", logging.WARNING, __file__, 1,
        "job %r: missed slots from %s to %s coalesced into one run",
        ("tick", at(1).isoformat(), at(3).isoformat()), None,
    )  # fmt: skip
    one_run = [e for e in all_ran() if e.slot not in (at(1), at(2))]  # slot 3 ran, late
    assert not Case(one_run, [Said("r0", 3.5, line)], []).judge().violations
    # The one run (slot 3) skipped, later slots running all the same: 1 and 2 were
    # coalesced into nothing, and nothing says what became of 3.
    effects = [e for e in all_ran() if e.slot not in (at(1), at(2), at(3))]
    judged = Case(effects, [Said("r0", 3.5, line)], []).judge()
    assert sorted(rules(judged)) == ["late", "late", "silent"]


def test_a_slot_given_up_though_its_disruption_ended_within_grace_is_late() -> None:
    effects = [e for e in all_ran() if e.slot != at(3)]
    said = [Said("r0", 3.0, JobSkipped("tick", at(3), "misfire"))]
    case = Case([e for e in effects if e.slot < at(3)], said, [])
    assert "late" in rules(case.judge(disruptions=((2.5, 3.5),)))
    assert not case.judge(window=(0.0, 4.0)).violations  # no disruption staged: a fate


def test_a_rerun_said_but_not_begun_is_a_lie() -> None:
    said = [Said("r1", 50.0, JobCrashed("tick", at(2), "h:1", at(2), True))]
    assert "lie" in rules(Case(all_ran(), said, []).judge())
    rerun = ran("tick", 2, 51.0, 51.2, replica="r1", attempt=2)
    judged = Case(all_ran() + rerun, said, []).judge(
        jobs=(JobView("tick", "every:1", recover=True),)
    )
    assert "lie" not in rules(judged)


def test_a_rerun_said_then_retracted_at_warning_is_no_lie() -> None:
    said = [Said("r1", 50.0, JobCrashed("tick", at(2), "h:1", at(2), True))]
    retraction = logging.LogRecord(
        "cronlock", logging.WARNING, __file__, 1,
        "job %r slot %s: the crashed run is not run again after all: %s",
        ("tick", at(2).isoformat(), "its row was finished meanwhile"), None,
    )  # fmt: skip
    assert "lie" not in rules(Case(all_ran(), [*said, Said("r1", 52.0, retraction)], []).judge())
    # A retraction said before the announcement does not count.
    assert "lie" in rules(Case(all_ran(), [Said("r1", 49.0, retraction), *said], []).judge())


def test_a_gone_fleet_read_ok_past_its_alert_grace_is_a_violation() -> None:
    # The fleet ran slots 0-4 and was gone at 4.5 s: slot 5 did not run; alert_after 10.
    job = JobView("tick", "every:1", alert_after=10.0)
    case = Case(all_ran(), [], [])

    def judged(*readings: tuple[float, str]) -> Judged:
        return judge(
            jobs=(job,),
            epoch=EPOCH,
            window=(0.0, 5.0),
            settled=100.0,
            effects=case.effects,
            said=[],
            ledger=[],
            disruptions=(),
            gone={},
            readings=[(at, {"tick": said}) for at, said in readings],
            fleet_gone=4.5,
        )

    assert rules(judged((20.0, "ok"))) == ["gone-ok"]
    assert rules(judged((30.0, "failing"))) == ["gone-ok"]
    # Before the grace has passed, anything goes; after it, overdue (or absent) is right.
    assert not judged((12.0, "ok"), (20.0, "overdue"), (200.0, "absent")).violations


def test_a_rerun_told_the_attempt_of_the_run_it_reruns_is_an_attempt_violation() -> None:
    said = [Said("r1", 50.0, JobCrashed("tick", at(2), "h:1", at(2), True))]
    rerun = ran("tick", 2, 51.0, 51.2, replica="r1", attempt=1)
    judged = Case(all_ran() + rerun, said, []).judge(
        jobs=(JobView("tick", "every:1", recover=True),)
    )
    assert rules(judged) == ["attempt"]  # the rerun itself is not "twice": it was announced
