"""One simulated run: a fleet, its faults, the run, the verdict, and the line that replays it.

A run has a fault phase (the staged faults fall in it) and a quiet phase after it, in which
nothing goes wrong and everything owed must happen ("safety, then liveness"): the slots
judged are those due in the fault phase and the start of the quiet one, and the verdict is
read once the quiet phase is over.
"""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, field
from typing import Literal

from .faults import Fault, apply, draw
from .fleet import JOBS, Fleet, JobSpec
from .oracle import JobView, Judged, Violation, judge
from .verdict import Verdicts
from .world import World, WorldStuck

__all__ = ("Plan", "Result", "plan_for_seed", "run_plan", "views_of")

Mode = Literal["session", "lease"]
WARMUP = 3.0
"""Seconds after the start before slots are judged (the replicas are starting)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What to run: the mode, the seed, the replicas, the faults and the phases."""

    mode: Mode
    seed: int
    faults: tuple[Fault, ...] = ()
    replicas: int = 3
    seconds: float = 120.0
    quiet: float = 90.0
    jobs: tuple[JobSpec, ...] = JOBS
    name: str = ""
    readings: tuple[float, ...] = ()
    """Instants (seconds into the run) at which an operator runs ``status --check``
    (:mod:`.verdict`); the run lasts until the last one."""
    pool: bool = False
    """Each replica's locker is given an asyncpg pool (min 1, max 4) rather than a DSN."""

    def command(self) -> str:
        """The one-line command that replays this run."""
        if self.name:
            return f"python benchmarks/simulate.py --mode {self.mode} --scenario {self.name}"
        faults = " ".join(f"--fault {shlex.quote(f.text())}" for f in self.faults)
        pool = " --pool" if self.pool else ""
        return (
            f"python benchmarks/simulate.py --mode {self.mode}{pool} --seed {self.seed} {faults}"
        ).strip()


@dataclass(slots=True)
class Result:
    """A run's verdict and what explains it."""

    plan: Plan
    judged: Judged
    trace: list[str] = field(default_factory=list)
    statements: int = 0

    @property
    def ok(self) -> bool:
        """No violation."""
        return not self.judged.violations


def views_of(jobs: tuple[JobSpec, ...]) -> list[JobView]:
    """What the oracle is told of *jobs*: their names, schedules and the options a user set."""
    return [
        JobView(
            spec.name,
            spec.schedule,
            grace=float(spec.options.get("misfire_grace", 60.0)),
            retries=int(spec.options.get("retries", 0)),
            overlap=str(spec.options.get("overlap", "skip")),
            recover=bool(spec.options.get("recover", False)),
            alert_after=spec.options.get("alert_after"),
        )
        for spec in jobs
    ]


def plan_for_seed(
    seed: int, mode: Mode, *, replicas: int = 3, seconds: float = 120.0, pool: bool = False
) -> Plan:
    """The random schedule of *seed*: its faults drawn from the seed alone (a pooled plan
    may draw ``pool_exhaustion`` too)."""
    faults = draw(random.Random(seed), replicas=replicas, seconds=seconds, pool=pool)
    return Plan(mode, seed, tuple(faults), replicas=replicas, seconds=seconds, pool=pool)


def run_plan(plan: Plan) -> Result:
    """Run *plan* in a world of its own and judge it."""
    world = World(plan.seed)
    fleet = Fleet(world, mode=plan.mode, replicas=plan.replicas, jobs=plan.jobs, pool=plan.pool)
    for fault in plan.faults:
        apply(fault, fleet)
    verdicts = Verdicts(fleet, plan.readings) if plan.readings else None
    quiet = max(plan.quiet, max(plan.readings, default=0.0) + 5.0 - plan.seconds)
    stuck: str | None = None
    try:
        fleet.run(plan.seconds, quiet=quiet)
    except WorldStuck as exc:  # a busy loop of the library: time could not go on
        stuck = f"{exc}; at {world.now:.3f}s"
        world.abandon()
    gone = {p.name: 0.0 for p in world.processes if not p.alive}
    for line in world.trace:
        for p in world.processes:
            if line.endswith(f"{p.name} killed"):
                gone[p.name] = float(line.split()[0])
    disruptions = [f.window() for f in plan.faults if f.kind not in ("clock_step",)]
    views = views_of(plan.jobs)
    # A fleet gone (every replica stopped, the "stop" fault, or killed) owes no slot after
    # it: nothing is left to run one. What must be said of them then is the status's
    # verdict (the gone-ok rule, judged at the plan's readings).
    ends = [r.stopped_at if r.stopped_at is not None else gone.get(r.name) for r in fleet.replicas]
    fleet_gone = None if None in ends else max(e for e in ends if e is not None)
    end = plan.seconds + min(plan.quiet, 10.0)
    stops = [f.at for f in plan.faults if f.kind == "stop"]
    end = min([end, *stops, *([] if fleet_gone is None else [fleet_gone])])
    ledger = fleet.ledger
    judged = judge(
        jobs=views,
        epoch=world.epoch,
        window=(WARMUP, end),
        settled=world.now,
        effects=fleet.effects,
        said=fleet.said,
        ledger=ledger,
        disruptions=disruptions,
        gone=gone,
        killed={(p.host, p.pid) for p in world.processes if p.name in gone},
        frozen=world.freezes,
        errors=world.errors[: world.errors_closed],
        readings=[] if verdicts is None else [(r.at, r.verdicts()) for r in verdicts.readings],
        fleet_gone=fleet_gone,
    )
    if stuck is not None:
        judged.violations.insert(0, Violation("livelock", "-", None, stuck))
    return Result(plan, judged, world.trace, world.server.statements_run)
