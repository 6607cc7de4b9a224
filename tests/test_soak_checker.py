"""The soak's checker (benchmarks/soak/checker.py) on made-up effects: it must catch what
it exists to catch (a slot finished twice, an overlap, a miss outside every fault window)
and must not blame a fault's price or the overlap rule's skips on cronlock."""

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


def judge(lines: list[dict[str, Any]], faults: list[Any] = [], jobs: Any = (QUICK,)) -> Any:  # noqa: B006
    return checker.check(lines, faults, list(jobs), T0, T0 + 10)


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


def test_a_miss_outside_every_fault_window_fails_and_inside_one_is_its_price() -> None:
    lines = [line for line in every_slot(QUICK, T0, T0 + 10) if line["slot"] != T0 + 5]
    assert judge(lines).misses_outside == [f"quick@{T0 + 5:.3f}"]
    kill = checker.Fault("kill", 0, T0 + 4.5, T0 + 4.6, T0 + 6.0, (100,))
    verdict = judge(lines, [kill])
    assert (verdict.misses_outside, dict(verdict.misses_inside)) == ([], {"kill": 1})
    assert verdict.failures == []


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
