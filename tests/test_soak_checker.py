"""The soak's checker (benchmarks/soak/checker.py) on made-up effects: it must catch what
it exists to catch (a slot finished twice, an overlap, a miss outside every fault window,
a miss inside one that nothing explains although its grace outlasted the fault, a claim
that never ran) and must not blame the explained price of a fault or the overlap rule's
skips on cronlock."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

CHECKER = Path(__file__).resolve().parents[1] / "benchmarks" / "soak" / "checker.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("cronlock_soak_checker", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checker = _load()
QUICK = checker.Job("quick", 1.0, 0.05)
SLOW = checker.Job("slow", 1.0, 2.5)
RECOVERED = checker.Job("recovered", 5.0, 1.0, recover=True)
T0 = 1_000_000.0


def run(
    job: str, slot: float, rep: int, start: float, end: float | None, kind: str = "end"
) -> list[dict[str, Any]]:
    """The effects lines of one run (no end line when *end* is None)."""
    lines = [{"e": "start", "job": job, "slot": slot, "rep": rep, "pid": 100 + rep, "t": start}]
    if end is not None:
        lines.append({"e": kind, "job": job, "slot": slot, "rep": rep, "pid": 100 + rep, "t": end})
    return lines


def every_slot(job: Any, first: float, last: float, rep: int = 0) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    slot = first
    while slot < last:
        lines += run(job.name, slot, rep, slot + 0.01, slot + 0.01 + job.duration)
        slot += job.interval
    return lines


def said(e: str, job: str, slot: float, rep: int, t: float, **more: Any) -> dict[str, Any]:
    """One line of a replica's effects besides a run's (``skip``, ``lockfailed``, ``lost``)."""
    return {"e": e, "job": job, "slot": slot, "rep": rep, "pid": 100 + rep, "t": t, **more}


def judge(
    lines: list[dict[str, Any]],
    faults: list[Any] = [],  # noqa: B006
    jobs: Any = (QUICK,),
    ledger: list[Any] | None = None,
) -> Any:
    return checker.check(lines, faults, list(jobs), T0, T0 + 10, ledger)


def test_every_slot_once_passes() -> None:
    verdict = judge(every_slot(QUICK, T0, T0 + 10))
    assert (verdict.slots, verdict.ran, verdict.failures) == (10, 10, [])


def test_a_slot_finished_twice_fails() -> None:
    lines = every_slot(QUICK, T0, T0 + 10) + run("quick", T0 + 3, 1, T0 + 3.02, T0 + 3.1)
    verdict = judge(lines)
    assert len(verdict.duplicates) == 1 and "quick@" in verdict.duplicates[0]
    assert verdict.failures


def test_a_slot_started_twice_but_finished_once_is_not_a_duplicate() -> None:
    # A run cut off (cancelled: its lock was lost) and the slot's rerun elsewhere.
    lines = [line for line in every_slot(QUICK, T0, T0 + 10) if line["slot"] != T0 + 3]
    lines += run("quick", T0 + 3, 0, T0 + 3.01, T0 + 3.02, kind="cancel")
    lines += run("quick", T0 + 3, 1, T0 + 3.5, T0 + 3.6)
    verdict = judge(lines)
    assert (verdict.duplicates, verdict.double_starts, verdict.failures) == ([], 1, [])


def test_a_miss_outside_every_fault_window_fails() -> None:
    lines = [line for line in every_slot(QUICK, T0, T0 + 10) if line["slot"] != T0 + 5]
    verdict = judge(lines)
    assert verdict.misses_outside == [f"quick@{T0 + 5:.3f}"] and verdict.failures


# -- misses inside fault windows: a failure unless explained ----------------------------------

MISSED = T0 + 5
"""The slot the tests of misses leave out."""
RESTART = checker.Fault("restart", None, T0 + 4.5, T0 + 5.5, T0 + 9.0, outage_end=T0 + 8.0)


def missing(slot: float = MISSED) -> list[dict[str, Any]]:
    """Every slot of QUICK run once, but *slot*."""
    return [line for line in every_slot(QUICK, T0, T0 + 10) if line["slot"] != slot]


def test_a_miss_inside_a_window_whose_grace_outlasted_the_outage_fails() -> None:
    verdict = judge(missing(), [RESTART])
    assert (verdict.misses_outside, dict(verdict.misses_inside)) == ([], {"restart": 1})
    assert dict(verdict.unexplained_inside) == {"restart": 1}
    assert verdict.unexplained[0].startswith(f"quick@{MISSED:.0f} (restart")
    assert verdict.failures


def test_a_miss_whose_grace_ran_out_before_the_outage_ended_is_explained() -> None:
    short = checker.Job("quick", 1.0, 0.05, grace=2.0)  # slot + 2 s < the outage's end
    verdict = judge(missing(), [RESTART], jobs=(short,))
    assert dict(verdict.explained) == {"restart": {"grace ran out": 1}}
    assert verdict.failures == []
    # The outage's end, not the window's (which counts the lease too), is what the grace
    # must outlast: an outage over within the grace owes the slot a run.
    lease_long = checker.Fault("restart", None, T0 + 4.5, T0 + 5.5, T0 + 40.0, outage_end=T0 + 6.0)
    later = checker.Job("quick", 1.0, 0.05, grace=2.0)
    assert judge(missing(), [lease_long], jobs=(later,)).unexplained


def test_a_fault_of_an_older_soak_ends_its_outage_with_its_window() -> None:
    old = checker.Fault("restart", None, T0 + 4.5, T0 + 5.5, T0 + 9.0)
    assert old.over == T0 + 9.0
    verdict = judge(missing(), [old], jobs=(checker.Job("quick", 1.0, 0.05, grace=3.0),))
    assert dict(verdict.explained) == {"restart": {"grace ran out": 1}}


def test_a_miss_whose_job_was_found_locked_is_held() -> None:
    # The job's lock (or lease) was held by a cut-off replica when the others claimed it.
    lines = [*missing(), said("skip", "quick", MISSED, 1, MISSED - 0.1, reason="locked")]
    verdict = judge(lines, [RESTART])
    assert dict(verdict.explained) == {"restart": {"held": 1}}
    assert verdict.failures == []
    # already_ran is no explanation: the slot ran nowhere.
    lines = [*missing(), said("skip", "quick", MISSED, 1, MISSED - 0.1, reason="already_ran")]
    assert judge(lines, [RESTART]).unexplained


def test_a_slot_claimed_by_a_killed_replica_is_explained_by_the_ledger() -> None:
    kill = checker.Fault("kill", 0, T0 + 5.2, T0 + 5.3, T0 + 7.0, (100,), outage_end=T0 + 5.3)
    claim = checker.Claim("quick", MISSED, pid=100)  # claimed, then killed before it began
    verdict = judge(missing(), [kill], ledger=[claim])
    assert dict(verdict.explained) == {"kill": {"claimed by a killed replica": 1}}
    assert (verdict.lost_claims, verdict.failures) == ([], [])
    assert judge(missing(), [kill]).unexplained  # without the ledger: nothing explains it
    survivor = checker.Claim("quick", MISSED, pid=101)  # r1, never killed: a lost claim
    verdict = judge(missing(), [kill], ledger=[survivor])
    assert verdict.unexplained and len(verdict.lost_claims) == 1


def test_a_misfire_reported_although_the_outage_ended_within_the_grace_fails() -> None:
    lines = [
        *missing(),
        said("skip", "quick", MISSED, 1, MISSED + 0.2, reason="locked"),
        said("skip", "quick", MISSED, 2, MISSED + 9.0, reason="misfire"),
    ]
    verdict = judge(lines, [RESTART])
    assert verdict.unexplained and "r2 skip misfire" in verdict.unexplained[0]
    short = checker.Job("quick", 1.0, 0.05, grace=2.0)  # its grace did run out
    assert judge(lines, [RESTART], jobs=(short,)).failures == []


def test_a_slot_owed_across_an_outage_coalesces_into_a_later_owed_one() -> None:
    # r1's claim of the slot never reached the server, nor did its claim of the next slot:
    # it keeps only the latest owed slot of a job, which ran late.
    lines = [line for line in missing() if line["slot"] != MISSED + 1]
    lines += run("quick", MISSED + 1, 1, MISSED + 3.1, MISSED + 3.2)
    owed = [
        said("lockfailed", "quick", MISSED, 1, MISSED + 0.5, why="LockUnavailable"),
        said("lockfailed", "quick", MISSED + 1, 1, MISSED + 1.1, why="SessionLost"),
    ]
    verdict = judge(lines + owed, [RESTART])
    assert dict(verdict.explained) == {"restart": {"coalesced": 1}}
    assert verdict.failures == []
    # Only the failed claim of the slot itself, the later slot run by another replica: r1
    # owed the slot and fired no later one, so it should have claimed it again.
    others = [line for line in missing() if line["slot"] != MISSED + 1]
    others += run("quick", MISSED + 1, 2, MISSED + 3.1, MISSED + 3.2)
    assert judge(others + owed[:1], [RESTART]).unexplained
    # r1 owed the slot, and the next slot's claim got through first (r1 ran it): the
    # owed slot coalesced into it.
    assert dict(judge(lines + owed[:1], [RESTART]).explained) == {"restart": {"coalesced": 1}}
    # The later slot's claim failed on another replica, which ran it too: not what r1 owed.
    elsewhere = {**owed[1], "rep": 2, "pid": 102}
    assert judge([*others, owed[0], elsewhere], [RESTART]).unexplained
    # A claim the server answered with an error is not owed.
    refused = {**owed[0], "why": "ServerError"}
    assert judge([*lines, refused, owed[1]], [RESTART]).unexplained
    # The slot's claim went through afterwards (r1's last word on it): not coalesced.
    answered = said("skip", "quick", MISSED, 1, MISSED + 2.0, reason="already_ran")
    assert judge([*lines, *owed, answered], [RESTART]).unexplained


def test_a_slot_skipped_everywhere_behind_a_claim_in_flight_that_ran_late_is_explained() -> None:
    # The claims of the slot before hung across the outage (in flight: the job counts as
    # running), so each replica skipped the slot by the overlap rule; the slot before ran
    # after it. Its claims refused instead (no late run): the slot ran nowhere, a failure.
    lines = [line for line in missing() if line["slot"] != MISSED - 1]
    lines += [
        said("skip", "quick", MISSED, rep, MISSED + 0.001, reason="overlap") for rep in (0, 1, 2)
    ]
    late = run("quick", MISSED - 1, 1, MISSED + 0.7, MISSED + 0.75)
    verdict = judge(lines + late, [RESTART])
    assert dict(verdict.explained) == {"restart": {"behind a late run": 1}}
    assert verdict.failures == []
    this = f"quick@{MISSED:.0f} "
    assert any(u.startswith(this) for u in judge(lines, [RESTART]).unexplained)
    # A replica that said something else of the slot (its claim failed, and was never
    # made again) had no run in flight: not explained.
    owed = said("lockfailed", "quick", MISSED, 2, MISSED + 0.5, why="LockUnavailable")
    assert judge([*lines, *late, owed], [RESTART]).unexplained


def test_a_miss_counts_for_the_last_fault_to_begin_before_it() -> None:
    pause = checker.Fault("pause", 1, T0 + 1.0, T0 + 2.0, T0 + 9.0, outage_end=T0 + 9.0)
    verdict = judge(missing(), [pause, RESTART])
    assert dict(verdict.misses_inside) == {"restart": 1}


# -- the ledger's claims ----------------------------------------------------------------------


def test_a_claim_its_live_claimer_never_started_is_a_lost_run_even_outside_windows() -> None:
    # The fleet took the slot as claimed (already_ran to the others); nobody ran it.
    lines = [*missing(), said("skip", "quick", MISSED, 1, MISSED, reason="already_ran")]
    claims = [checker.Claim("quick", MISSED, pid=100, outcome="lock_lost")]
    verdict = judge(lines, ledger=claims)
    assert len(verdict.lost_claims) == 1 and "claimed by pid 100" in verdict.lost_claims[0]
    assert verdict.failures
    # A claim whose own process ran the slot is as it should be; a claim naming another
    # process than the one that ran the slot is lost too.
    ran = [checker.Claim("quick", T0 + 1, pid=100)]
    assert judge(every_slot(QUICK, T0, T0 + 10), ledger=ran).lost_claims == []
    other = [checker.Claim("quick", T0 + 1, pid=101)]
    assert len(judge(every_slot(QUICK, T0, T0 + 10), ledger=other).lost_claims) == 1


def test_a_claim_whose_lock_was_lost_before_it_began_may_coalesce_into_a_later_slot() -> None:
    # r0 claimed the slot ahead, lost its lock before the run began (a "lost" line), and
    # went on to run the next slots: the slot was owed again and coalesced into them.
    lost = said("lost", "quick", MISSED, 0, MISSED - 0.05, why="LockError(...)")
    lines = [*missing(), lost, said("skip", "quick", MISSED, 1, MISSED, reason="already_ran")]
    claims = [checker.Claim("quick", MISSED, pid=100, outcome="lock_lost")]
    verdict = judge(lines, ledger=claims)
    assert (verdict.lost_claims, verdict.lost_then_coalesced) == ([], 1)
    # Inside a fault's window, the miss is explained the same way (the other replicas were
    # told already_ran: only the claimer's loss and its later slots explain it).
    verdict = judge(lines, [RESTART], ledger=claims)
    assert (verdict.unexplained, verdict.failures) == ([], [])
    assert verdict.explained["restart"]["coalesced"] == 1
    # It fired no later slot (the others ran them): the slot was lost, a failure.
    others = [line for line in missing() if line["slot"] <= MISSED]
    others += [{**line, "rep": 1, "pid": 101} for line in every_slot(QUICK, MISSED + 1, T0 + 10)]
    verdict = judge([*others, lost], ledger=claims)
    assert len(verdict.lost_claims) == 1 and verdict.failures


def test_a_claim_recorded_whose_answer_never_came_may_coalesce_into_a_later_slot() -> None:
    # r0's claim reached the server but its answer did not (a partition: StatementTimeout),
    # and r0 fired the next slots: the slot was owed and coalesced (seed 2410212484).
    failed = said("lockfailed", "quick", MISSED, 0, MISSED + 2, why="StatementTimeout")
    lines = [*missing(), failed, said("skip", "quick", MISSED, 1, MISSED, reason="already_ran")]
    claims = [checker.Claim("quick", MISSED, pid=100, outcome=None)]
    verdict = judge(lines, ledger=claims)
    assert (verdict.lost_claims, verdict.unanswered_then_coalesced) == ([], 1)
    # Claimed again by r0 and told already_ran (its own claim): lost, a failure.
    again = said("skip", "quick", MISSED, 0, MISSED + 2.5, reason="already_ran")
    verdict = judge([*lines, again], ledger=claims)
    assert len(verdict.lost_claims) == 1 and verdict.failures
    # A failure for another reason than the server (LockHeldElsewhere, say) excuses nothing.
    other = {**failed, "why": "LockError"}
    verdict = judge([*missing(), other], ledger=claims)
    assert len(verdict.lost_claims) == 1 and verdict.failures


def test_slots_that_ran_without_a_claim_in_the_ledger_are_reported() -> None:
    # After a failover, claims the standby had not received are gone: reported, no failure.
    claims = [checker.Claim("quick", T0 + k, pid=100) for k in range(9)]
    verdict = judge(every_slot(QUICK, T0, T0 + 10), ledger=claims)
    assert (verdict.unledgered, verdict.failures) == ([f"quick@{T0 + 9:.0f}"], [])


def test_the_ledger_as_run_py_saves_it_is_read(tmp_path: Path) -> None:
    row = {
        "job": "quick", "slot": T0, "host": "vm", "pid": 100, "started_at": T0 + 0.01,
        "finished_at": None, "outcome": None, "attempt": 1, "holder": "cronlock-soak-0:ab",
    }  # fmt: skip
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps([row]))
    assert checker.read_ledger(path) == [checker.Claim(**row)]


def test_a_window_opens_a_moment_before_its_fault() -> None:
    # A claim committed just before a kill belongs to a run that never wrote a line.
    lines = [line for line in every_slot(QUICK, T0, T0 + 10) if line["slot"] != T0 + 5]
    kill = checker.Fault("kill", 0, T0 + 5.5, T0 + 5.6, T0 + 6.0, (100,))
    assert judge(lines, [kill]).misses_outside == []
    late = checker.Fault("kill", 0, T0 + 6.5, T0 + 6.6, T0 + 7.0, (100,))
    assert judge(lines, [late]).misses_outside != []


def test_slots_skipped_while_the_job_ran_are_not_misses() -> None:
    # slow runs 2.5 s every 1 s: each run covers the next two slots (the overlap rule).
    lines: list[dict[str, Any]] = []
    for slot in (T0, T0 + 3, T0 + 6, T0 + 9):
        lines += run("slow", slot, int(slot) % 2, slot + 0.01, slot + 2.51)
    verdict = judge(lines, jobs=(SLOW,))
    assert (verdict.ran, verdict.busy, verdict.misses_outside) == (4, 6, [])


def test_overlapping_runs_of_one_job_on_two_replicas_fail_outside_partitions() -> None:
    lines = run("slow", T0, 0, T0 + 0.01, T0 + 2.51) + run("slow", T0 + 2, 1, T0 + 2.0, T0 + 4.5)
    lines += run("slow", T0 + 5, 0, T0 + 5.0, T0 + 7.5) + run("slow", T0 + 8, 0, T0 + 8, T0 + 10.5)
    verdict = judge(lines, jobs=(SLOW,))
    assert len(verdict.overlaps_outside) == 1 and verdict.failures
    partition = checker.Fault("partition", 0, T0 + 1.0, T0 + 1.5, T0 + 3.0)
    verdict = judge(lines, [partition], jobs=(SLOW,))
    assert (len(verdict.overlaps_outside), len(verdict.overlaps_inside)) == (0, 1)
    assert verdict.failures == []


def test_a_killed_run_ends_when_its_process_was_killed() -> None:
    # No end line: the run ended at the kill, so the next replica's run does not overlap it.
    lines = run("slow", T0, 0, T0 + 0.01, None) + run("slow", T0 + 2, 1, T0 + 2.0, T0 + 4.5)
    lines += run("slow", T0 + 5, 1, T0 + 5, T0 + 7.5) + run("slow", T0 + 8, 1, T0 + 8, T0 + 10.5)
    kill = checker.Fault("kill", 0, T0 + 1.0, T0 + 1.1, T0 + 2.0, (100,))
    verdict = judge(lines, [kill], jobs=(SLOW,))
    assert (verdict.overlaps_outside, verdict.killed) == ([], 1)
    # Without the kill on record the run is taken to have lasted 2.5 s: they overlap.
    assert judge(lines, jobs=(SLOW,)).overlaps_outside


def test_a_recovered_slot_that_never_finished_is_reported() -> None:
    lines = run("recovered", T0, 0, T0 + 0.01, None) + run("recovered", T0 + 5, 1, T0 + 5, T0 + 6)
    kill = checker.Fault("kill", 0, T0 + 0.5, T0 + 0.6, T0 + 2.0, (100,))
    verdict = judge(lines, [kill], jobs=(RECOVERED,))
    assert verdict.unrecovered == [f"recovered@{T0:.0f}"]


def test_a_torn_last_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "effects-0.jsonl"
    line = json.dumps(run("quick", T0, 0, T0, T0 + 0.05)[0])
    path.write_text(line + "\n" + line[:17])
    assert checker.read_effects([path]) == [json.loads(line)]


@pytest.mark.parametrize(("start", "stop", "expected"), [(0.5, 3.0, [1.0, 2.0]), (1.0, 2.0, [1.0])])
def test_slots_are_multiples_of_the_interval_since_the_epoch(
    start: float, stop: float, expected: list[float]
) -> None:
    assert checker.slots_between(QUICK, start, stop) == expected


def test_a_recovered_slot_finished_twice_inside_a_fault_window_is_its_documented_price() -> None:
    # Its run finished while a partition kept the outcome from the ledger; another replica
    # reran the slot as crashed (recover=True is at least once). Outside a window: a failure.
    lines = run("recovered", T0, 0, T0 + 0.01, T0 + 1.0) + run("recovered", T0, 1, T0 + 7, T0 + 8)
    lines += run("recovered", T0 + 5, 1, T0 + 5, T0 + 6)
    partition = checker.Fault("partition", 0, T0 + 0.5, T0 + 7.0, T0 + 9.0)
    verdict = judge(lines, [partition], jobs=(RECOVERED,))
    assert (len(verdict.recovered_twice), verdict.duplicates, verdict.failures) == (1, [], [])
    verdict = judge(lines, jobs=(RECOVERED,))
    assert len(verdict.duplicates) == 1 and verdict.failures


def test_a_slot_whose_outage_outlasted_the_soak_is_not_owed() -> None:
    # A failover in the soak's last seconds: its outage is over after the replicas were
    # stopped, so the slot due in it could not run (seed 1415912310: twelve slots).
    lines = [line for line in every_slot(QUICK, T0, T0 + 10) if line["slot"] != T0 + 9]
    failed = said("lockfailed", "quick", T0 + 9, 0, T0 + 9.4, why="LockUnavailable")
    late = checker.Fault("failover", None, T0 + 8.5, T0 + 9.5, T0 + 30.0, outage_end=T0 + 20.0)
    verdict = judge([*lines, failed], [late])
    assert (verdict.unexplained, verdict.failures) == ([], [])
    assert verdict.explained["failover"]["outage outlasted the soak"] == 1
    # Over before the soak stopped, the same slot is owed: a failure.
    early = checker.Fault("failover", None, T0 + 8.5, T0 + 9.5, T0 + 30.0, outage_end=T0 + 9.8)
    assert judge([*lines, failed], [early]).unexplained


def test_a_slot_due_while_a_claim_of_the_one_before_hung_is_coalesced() -> None:
    # The claim of the slot before hung on the server across this slot (it failed after
    # it): cronlock owed this slot without a word; a later slot was fired.
    lines = [line for line in missing() if line["slot"] != MISSED - 1]
    hung = said("lockfailed", "quick", MISSED - 1, 0, MISSED + 0.7, why="StatementTimeout")
    assert dict(judge([*lines, hung], [RESTART]).explained) == {"restart": {"coalesced": 2}}
    # A standby's skip of the slot changes nothing: it left the slot to the racers, whose
    # claims hung (lease mode, seed 182497113: seven slots judged missed).
    standby = said("skip", "quick", MISSED, 1, MISSED - 0.1, reason="standby")
    verdict = judge([*lines, hung, standby], [RESTART])
    assert (dict(verdict.explained), verdict.unexplained) == ({"restart": {"coalesced": 2}}, [])
    # The claim failed before the slot: nothing hung across it, the slot is a miss.
    early = {**hung, "t": MISSED - 0.5}
    assert judge([*lines, early], [RESTART]).unexplained
    assert judge([*lines, early, standby], [RESTART]).unexplained
