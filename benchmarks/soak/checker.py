"""The soak's checker: every slot of the judged window, matched to the runs that were for it.

It reads what the replicas did (their effects files: a ``start`` line as a run's first act,
``end`` as its last, ``cancel`` when it was cancelled), what the nemesis did (its faults,
each with the window in which it may cost slots), and judges:

- **duplicates**: a slot with two *finished* runs (``end`` lines). Must be 0, but for a
  ``recover=True`` job inside a fault window: its run may have finished while the fault
  kept its outcome from the ledger (a partition, a server crash), and another replica then
  reruns the slot as crashed. That is the documented price of ``recover=True`` (at least
  once, for idempotent jobs), reported as **recovered twice**.
- **overlaps**: two runs of one job, by different processes, in progress at the same
  instant. Must be 0 outside partitions; reported inside them.
- **misses outside fault windows**: a slot with no run, while no run of its job was in
  progress (then the slot was skipped by the overlap rule, as designed) and outside every
  fault's window. Must be 0.
- **misses inside fault windows**: the same inside a window, counted by the fault's kind:
  the price of each kind of fault.
- **unrecovered**: slots of a ``recover=True`` job whose only runs never finished.

A run with no ``end`` or ``cancel`` line ended when its process was killed (the nemesis
logs the pid), or else is taken to have lasted its job's duration. Only the standard
library is used, so the unit tests can feed it made-up effects.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BUSY_EARLY = 0.3
"""A run that ended up to this long before a slot still made its claim find the job busy
(claims go out ``claim_ahead`` early, and take a round trip)."""
BUSY_LATE = 0.5
"""A run that started up to this long after a slot may have been claimed before it."""
WINDOW_BEFORE = 1.0
"""A fault's window opens this long before it: a claim committed just before a kill (or a
cut, a pause) belongs to a run that never wrote its first line."""


@dataclasses.dataclass(frozen=True)
class Job:
    """What the checker needs of a job: its interval (slots at multiples of it since the
    epoch), its body's duration and whether it opted in to recovery."""

    name: str
    interval: float
    duration: float
    recover: bool = False


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault the nemesis injected: *kind* on *replica* (``None``: the server) from
    *start* to *end* (true wall time), costing slots until *window_end*. *pids* are the
    processes it killed."""

    kind: str
    replica: int | None
    start: float
    end: float
    window_end: float
    pids: tuple[int, ...] = ()
    detail: str = ""

    def covers(self, t: float) -> bool:
        return self.start - WINDOW_BEFORE <= t <= self.window_end


@dataclasses.dataclass
class Run:
    job: str
    slot: float
    replica: int
    pid: int
    start: float
    end: float | None = None
    outcome: str = "unfinished"  # end, cancel, killed, unfinished


@dataclasses.dataclass
class Verdict:
    """What the checker found; :attr:`failures` lists the rules broken (empty: passed)."""

    judged_from: float
    judged_to: float
    slots: int = 0
    ran: int = 0
    busy: int = 0
    duplicates: list[str] = dataclasses.field(default_factory=list)
    recovered_twice: list[str] = dataclasses.field(default_factory=list)
    double_starts: int = 0
    overlaps_outside: list[str] = dataclasses.field(default_factory=list)
    overlaps_inside: list[str] = dataclasses.field(default_factory=list)
    misses_outside: list[str] = dataclasses.field(default_factory=list)
    misses_inside: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    unrecovered: list[str] = dataclasses.field(default_factory=list)
    faults: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    runs: int = 0
    cancelled: int = 0
    killed: int = 0

    @property
    def failures(self) -> list[str]:
        found = []
        if self.duplicates:
            found.append(f"{len(self.duplicates)} slot(s) finished twice: {self.duplicates[:5]}")
        if self.overlaps_outside:
            found.append(
                f"{len(self.overlaps_outside)} overlap(s) outside partitions: "
                f"{self.overlaps_outside[:5]}"
            )
        if self.misses_outside:
            found.append(
                f"{len(self.misses_outside)} slot(s) missed outside fault windows: "
                f"{self.misses_outside[:5]}"
            )
        return found

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["misses_inside"] = dict(self.misses_inside)
        data["faults"] = dict(self.faults)
        data["failures"] = self.failures
        return data


def read_effects(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The lines of the effects files (a torn last line, cut by a SIGKILL, is dropped)."""
    records: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return records


def runs_of(records: Iterable[dict[str, Any]], faults: Sequence[Fault]) -> list[Run]:
    """The runs the records describe, each with its end (or its process's kill)."""
    killed_at = {pid: f.start for f in faults for pid in f.pids}
    runs: dict[tuple[int, str, float], Run] = {}
    for r in records:
        kind = r["e"]
        key = (r["pid"], r["job"], r["slot"])
        if kind == "start":
            runs[key] = Run(r["job"], r["slot"], r["rep"], r["pid"], r["t"])
        elif kind in ("end", "cancel") and key in runs:
            runs[key].end = r["t"]
            runs[key].outcome = kind
    for run in runs.values():
        if run.end is None and run.pid in killed_at and killed_at[run.pid] >= run.start:
            run.end, run.outcome = killed_at[run.pid], "killed"
    return list(runs.values())


def slots_between(job: Job, start: float, stop: float) -> list[float]:
    """The slots of *job* in [start, stop): multiples of its interval since the epoch."""
    first = math.ceil(start / job.interval)
    last = math.ceil(stop / job.interval)
    return [round(k * job.interval, 6) for k in range(first, last)]


def check(
    records: Iterable[dict[str, Any]],
    faults: Sequence[Fault],
    jobs: Sequence[Job],
    judged_from: float,
    judged_to: float,
) -> Verdict:
    """Judge the slots of *jobs* in [judged_from, judged_to) (see the module's rules)."""
    verdict = Verdict(judged_from, judged_to)
    verdict.faults.update(f.kind for f in faults)
    runs = runs_of(records, faults)
    by_job: dict[str, list[Run]] = collections.defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    partitions = [f for f in faults if f.kind == "partition"]
    for job in jobs:
        mine = sorted(by_job.get(job.name, ()), key=lambda run: run.start)
        _overlaps(job, mine, partitions, verdict)
        _slots(job, mine, faults, verdict)
    judged = [r for r in runs if judged_from <= r.slot < judged_to]
    verdict.runs = len(judged)
    verdict.cancelled = sum(r.outcome == "cancel" for r in judged)
    verdict.killed = sum(r.outcome == "killed" for r in judged)
    return verdict


def _end(job: Job, run: Run) -> float:
    return run.end if run.end is not None else run.start + job.duration


def _overlaps(job: Job, runs: Sequence[Run], partitions: Sequence[Fault], v: Verdict) -> None:
    for i, a in enumerate(runs):
        a_end = _end(job, a)
        for b in runs[i + 1 :]:
            if b.start >= a_end:
                break
            if b.pid == a.pid or not (v.judged_from <= b.slot < v.judged_to):
                continue
            what = (
                f"{job.name}: slot {a.slot:.0f} on r{a.replica} ({a.start:.3f}-{a_end:.3f}) "
                f"and slot {b.slot:.0f} on r{b.replica} from {b.start:.3f}"
            )
            inside = any(p.covers(b.start) or p.covers(a_end) for p in partitions)
            (v.overlaps_inside if inside else v.overlaps_outside).append(what)


def _busy(job: Job, runs: Sequence[Run], starts: list[float], longest: float, t: float) -> bool:
    """Whether a run of *job* was in progress around instant *t* (its claim found it busy)."""
    i = bisect.bisect_right(starts, t + BUSY_LATE) - 1
    while i >= 0 and starts[i] >= t - BUSY_EARLY - longest:
        if _end(job, runs[i]) >= t - BUSY_EARLY:
            return True
        i -= 1
    return False


def _slots(job: Job, runs: Sequence[Run], faults: Sequence[Fault], v: Verdict) -> None:
    for_slot: dict[float, list[Run]] = collections.defaultdict(list)
    for run in runs:
        for_slot[round(run.slot, 6)].append(run)
    starts = [run.start for run in runs]  # *runs* are in order of start
    longest = max((_end(job, run) - run.start for run in runs), default=0.0)
    for slot in slots_between(job, v.judged_from, v.judged_to):
        v.slots += 1
        mine = for_slot.get(slot, [])
        if mine:
            v.ran += 1
            finished = [r for r in mine if r.outcome == "end"]
            if len(finished) > 1:
                what = f"{job.name}@{slot:.0f} finished on " + ", ".join(
                    f"r{r.replica}/pid {r.pid} at {r.end:.3f}" for r in finished
                )
                first = min(_end(job, r) for r in finished)
                if job.recover and any(f.covers(first) for f in faults):
                    v.recovered_twice.append(what)
                else:
                    v.duplicates.append(what)
            if len(mine) > 1:
                v.double_starts += 1
            if job.recover and not finished:
                v.unrecovered.append(f"{job.name}@{slot:.0f}")
            continue
        if _busy(job, runs, starts, longest, slot):
            v.busy += 1
            continue
        window = next((f for f in faults if f.covers(slot)), None)
        if window is None:
            v.misses_outside.append(f"{job.name}@{slot:.3f}")
        else:
            v.misses_inside[window.kind] += 1
