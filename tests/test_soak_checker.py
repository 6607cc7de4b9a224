"""The soak's checker (benchmarks/soak/checker.py): a thin adapter from the soak's evidence
(effects files, the nemesis's faults, the ledger) to the simulator's oracle
(``cronlock._sim.oracle.judge``), whose violations fail the run unless their rule is a
known defect of today's code under the run's fault kinds (``cronlock._sim.scenarios``).
Made-up evidence: a clean run passes, a duplicate fails, a silent slot is a known finding
under a fault kind that lists it and a failure under one that does not; and what a replica
writes (replica.py) is what the checker reads."""

from __future__ import annotations

import importlib.util
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pytest

from cronlock import JobCrashed, JobSkipped, LockFailed, LockUnavailable
from cronlock._sim.scenarios import known_rules

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"cronlock_soak_{name}", SOAK / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


checker = _load("checker")
QUICK = checker.Job("quick", 1.0, 0.05)
RECOVERED = checker.Job("recovered", 5.0, 1.0, recover=True)
T0 = 1_000_000.0
MODE: Final = "session"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


def line(e: str, rep: int, t: float, **more: Any) -> dict[str, Any]:
    """One line of replica *rep*'s effects file (its process: pid ``100 + rep``)."""
    return {"e": e, "rep": rep, "pid": more.pop("pid", 100 + rep), "t": t, **more}


def run(
    job: str, slot: float, rep: int, start: float, end: float | None, attempt: int = 1, **more: Any
) -> list[dict[str, Any]]:
    """The lines of one run (no end line when *end* is None)."""
    fields = {"job": job, "slot": iso(slot), "attempt": attempt, **more}
    lines = [line("start", rep, start, **fields)]
    if end is not None:
        lines.append(line("end", rep, end, **fields))
    return lines


def said(rep: int, t: float, name: str, job: str, slot: float, **more: Any) -> dict[str, Any]:
    """An ``event`` line: replica *rep* emitted event *name* of *job*'s *slot*."""
    return line("event", rep, t, name=name, job=job, slot=iso(slot), **more)


def every_slot(job: Any, first: float, last: float, skip: tuple[float, ...] = ()) -> list[Any]:
    """A run of every slot of *job* in [first, last) on replica 0, but *skip*'s."""
    lines: list[dict[str, Any]] = []
    slot = first
    while slot < last:
        if slot not in skip:
            lines += run(job.name, slot, 0, slot + 0.01, slot + 0.01 + job.duration)
        slot += job.interval
    return lines


def row(job: str, slot: float, outcome: str | None = "succeeded", pid: int = 100) -> dict[str, Any]:
    """A ledger row as run.py saves it."""
    return {"job": job, "slot": iso(slot), "host": "vm", "pid": pid, "outcome": outcome}


def ledger_of(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger of the runs *lines* describe: one row per slot started, succeeded."""
    seen = {(r["job"], r["slot"]): r["pid"] for r in lines if r["e"] == "start"}
    return [{**row(job, 0.0, pid=pid), "slot": slot} for (job, slot), pid in seen.items()]


def fault(kind: str, start: float, end: float, pids: tuple[int, ...] = ()) -> Any:
    return checker.Fault(kind, 0, start, end, end + 10, pids)


def judge(
    lines: list[dict[str, Any]],
    faults: list[Any] = [],  # noqa: B006
    jobs: Any = (QUICK,),
    ledger: list[dict[str, Any]] | None = None,
    mode: str = MODE,
) -> Any:
    return checker.check(
        lines,
        faults,
        list(jobs),
        mode=mode,
        judged_from=T0,
        judged_to=T0 + 10,
        settled=T0 + 40,
        ledger=ledger_of(lines) if ledger is None else ledger,
    )


def kind_where(silent_known: bool) -> str:
    """A soak fault kind under which a silent slot is (or is not) a known defect today."""
    for kind, sims in checker.SIM_KINDS.items():
        if ("silent" in known_rules(MODE, set(sims))) == silent_known:
            return str(kind)
    pytest.skip(f"no fault kind whose known rules {'' if silent_known else 'do not '}list silent")


def test_every_slot_once_passes() -> None:
    verdict = judge(every_slot(QUICK, T0, T0 + 10))
    assert (verdict.judged.slots, verdict.judged.ran, verdict.failures) == (10, 10, [])
    assert verdict.known == []
    assert all(counts == (0, 0) for counts in verdict.counts().values())


def test_a_slot_started_twice_fails() -> None:
    lines = every_slot(QUICK, T0, T0 + 10) + run("quick", T0 + 3, 1, T0 + 3.5, T0 + 3.55)
    verdict = judge(lines)
    assert [v.rule for v in verdict.new] == ["twice"]
    assert verdict.failures and "quick" in verdict.failures[0]
    assert verdict.counts()["twice"] == (1, 0)


def test_a_duplicate_fails_under_faults_whose_known_rules_do_not_list_it() -> None:
    lines = every_slot(QUICK, T0, T0 + 10) + run("quick", T0 + 3, 1, T0 + 3.5, T0 + 3.55)
    kind = next(
        k for k, sims in checker.SIM_KINDS.items() if "twice" not in known_rules(MODE, set(sims))
    )
    verdict = judge(lines, [fault(kind, T0 + 2, T0 + 4)])
    assert [v.rule for v in verdict.new] == ["twice"]


def test_a_silent_slot_under_a_fault_that_lists_it_is_a_known_finding() -> None:
    kind = kind_where(silent_known=True)
    verdict = judge(every_slot(QUICK, T0, T0 + 10, skip=(T0 + 5,)), [fault(kind, T0 + 4.5, T0 + 6)])
    assert verdict.failures == []
    assert [(v.rule, v.slot) for v in verdict.known] == [
        ("silent", datetime.fromtimestamp(T0 + 5, UTC))
    ]
    assert verdict.counts()["silent"] == (0, 1)
    assert "silent" in verdict.allowed


def test_a_silent_slot_under_a_fault_that_does_not_list_it_fails() -> None:
    kind = kind_where(silent_known=False)
    verdict = judge(every_slot(QUICK, T0, T0 + 10, skip=(T0 + 5,)), [fault(kind, T0 + 4.5, T0 + 6)])
    assert [v.rule for v in verdict.new] == ["silent"]
    assert verdict.counts()["silent"] == (1, 0)


def test_a_silent_slot_without_faults_fails() -> None:
    verdict = judge(every_slot(QUICK, T0, T0 + 10, skip=(T0 + 5,)))
    assert [v.rule for v in verdict.new] == ["silent"]


def test_a_fate_a_user_can_see_is_no_violation() -> None:
    """A slot skipped with a reason that is a fate (an event), and one a WARNING names, are
    explained; a skip that says someone else ran it (``locked``) is not."""
    lines = every_slot(QUICK, T0, T0 + 10, skip=(T0 + 3, T0 + 5, T0 + 7))
    lines.append(said(1, T0 + 3.01, "JobSkipped", "quick", T0 + 3, reason="overlap"))
    message = f"job 'quick' slot {iso(T0 + 5)}: missed: the server could not be reached"
    lines.append(line("log", 1, T0 + 40, level=logging.WARNING, logger="cronlock", msg=message))
    lines.append(said(1, T0 + 7.01, "JobSkipped", "quick", T0 + 7, reason="locked"))
    verdict = judge(lines)
    assert verdict.judged.explained == 2
    assert [(v.rule, v.slot) for v in verdict.new] == [
        ("silent", datetime.fromtimestamp(T0 + 7, UTC))
    ]


def test_a_killed_process_ends_its_runs_and_its_claims_are_judged() -> None:
    """A run whose process was killed ended then (no overlap with the run after it); its
    ledger row without an outcome is ``unfinished`` (known under ``kill`` today or not: the
    verdict follows the table)."""
    lines = every_slot(checker.Job("long", 2.0, 1.5), T0, T0 + 10, skip=(T0 + 4, T0 + 6))
    lines += run("long", T0 + 4, 1, T0 + 4.01, None, pid=555)
    lines += run("long", T0 + 6, 2, T0 + 6.01, T0 + 7.51)  # after the killed run's 1.5 s
    ledger = [*ledger_of(lines), row("long", T0 + 4, outcome=None, pid=555)]  # the last wins
    kill = fault("kill", T0 + 4.5, T0 + 4.6, pids=(555,))
    verdict = judge(lines, [kill], (checker.Job("long", 2.0, 1.5),), ledger=ledger)
    assert {v.rule for v in verdict.judged.violations} == {"unfinished"}
    assert verdict.killed == 1
    unfinished_known = "unfinished" in known_rules(MODE, {"kill"})
    assert bool(verdict.known) == unfinished_known and bool(verdict.new) != unfinished_known


def test_a_rerun_announced_and_never_begun_is_a_lie() -> None:
    lines = every_slot(RECOVERED, T0, T0 + 10)
    lines.append(said(1, T0 + 6, "JobCrashed", "recovered", T0 + 5, recovered=True))
    verdict = judge(lines, jobs=(RECOVERED,))
    assert [v.rule for v in verdict.judged.violations] == ["lie"]


def test_an_error_line_is_the_oracles_error() -> None:
    lines = every_slot(QUICK, T0, T0 + 10)
    lines.append(line("error", 2, T0 + 4, msg="Task exception was never retrieved: KeyError()"))
    verdict = judge(lines, [fault(kind_where(silent_known=True), T0 + 3, T0 + 4)])
    assert [v.rule for v in verdict.new] == ["error"]


def test_a_ledger_row_that_ran_with_no_body_fails() -> None:
    """The checker's own check: the ledger says a run succeeded that no body started."""
    lines = every_slot(QUICK, T0, T0 + 10, skip=(T0 + 2,))
    verdict = judge(lines, ledger=[*ledger_of(lines), row("quick", T0 + 2)])
    assert verdict.new == []  # the row's outcome is a fate the oracle accepts
    assert len(verdict.soak["ledger-ran"]) == 1
    assert verdict.failures == [verdict.failures[0]] and "ledger-ran" in verdict.failures[0]


def test_fault_kinds_map_to_the_simulators() -> None:
    """Every kind the nemesis injects has the simulator's names (run.py's KINDS)."""
    from cronlock._sim.faults import KINDS

    assert set(checker.SIM_KINDS) == {
        "kill", "pause", "partition", "reset", "restart", "clock", "failover", "switchover"
    }  # fmt: skip
    assert {sim for sims in checker.SIM_KINDS.values() for sim in sims} <= set(KINDS)
    verdict = judge(every_slot(QUICK, T0, T0 + 10), [fault("partition", T0 + 2, T0 + 3)])
    assert verdict.kinds == ["hang", "reset"]
    assert set(verdict.allowed) == known_rules(MODE, {"hang", "reset"})


def test_what_a_replica_writes_is_what_the_checker_reads(tmp_path: Path) -> None:
    """replica.py's lines (its events, its WARNINGs, its runs), read back by the checker, are
    objects of the events' class names with their fields, and log records."""
    replica = _load("replica")
    path = tmp_path / "effects-0.jsonl"
    effects = replica.Effects(str(path), 0)
    slot = datetime.fromtimestamp(T0 + 1, UTC)
    replica.event_line(effects, JobSkipped("quick", slot, "overlap"))
    replica.event_line(effects, JobCrashed("quick", slot, "vm:1", slot, recovered=True))
    replica.event_line(effects, LockFailed("quick", slot, LockUnavailable("down")))
    heard = replica.Heard(effects)
    logger = logging.getLogger("cronlock.soak-test")
    logger.addHandler(heard)
    try:
        logger.warning("job %r slot %s: missed", "quick", slot.isoformat())
        logger.info("not heard")
    finally:
        logger.removeHandler(heard)
    effects.write("start", job="quick", slot=slot.isoformat(), attempt=2)
    records = checker.read_effects([path])
    seen = checker.evidence(records, [], [], T0)
    events = [s.what for s in seen.said if not isinstance(s.what, logging.LogRecord)]
    assert [type(e).__name__ for e in events] == ["JobSkipped", "JobCrashed", "LockFailed"]
    assert (events[0].job, events[0].slot, events[0].reason) == ("quick", slot, "overlap")
    assert events[1].recovered is True
    logs = [s.what for s in seen.said if isinstance(s.what, logging.LogRecord)]
    assert [r.getMessage() for r in logs] == [f"job 'quick' slot {slot.isoformat()}: missed"]
    assert logs[0].levelno == logging.WARNING
    assert [(e.kind, e.slot, e.attempt, e.replica) for e in seen.effects] == [
        ("start", slot, 2, f"r0/{records[-1]['pid']}")
    ]
