"""A simulated fleet: replicas running the real ``Scheduler`` and ``PostgresLocker`` against
the world's server, and what a user of them would see (their jobs' own effects, the events
they emit, the lines they log).

The jobs of a run (:data:`JOBS`) are what the issue's targets ask of a schedule: one every
second, one every 7 s, a cron, one with ``recover=True`` and one with retries. A job's body
writes its effect (start, end) the way a user's job would, with no help from cronlock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .._records import RunContext
from .conn import TrackedConnector
from .pool import SimPool
from .server import SimServer
from .statements.all import statements_for
from .world import Process, SimClock, World

__all__ = ("JOBS", "Effect", "Fleet", "JobSpec", "Replica", "Said")

Mode = Literal["session", "lease"]
LEDGER = "sim_runs"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job every replica defines."""

    name: str
    schedule: str
    """``every:<seconds>`` or ``cron:<expression>``."""
    body: float
    """Seconds its body takes."""
    options: dict[str, Any] = field(default_factory=dict)
    fails: int = 0
    """How many first attempts of each slot fail (the job with retries)."""


JOBS: tuple[JobSpec, ...] = (
    JobSpec("tick", "every:1", 0.2),
    JobSpec("seven", "every:7", 2.0),
    JobSpec("minutely", "cron:* * * * *", 1.0),
    JobSpec("recovering", "every:10", 4.0, {"recover": True, "misfire_grace": 30}),
    JobSpec("retrying", "every:5", 0.3, {"retries": 2, "retry_delay": 0.5}, fails=1),
)


@dataclass(frozen=True, slots=True)
class Effect:
    """What a job's body did, as it wrote it down itself."""

    kind: Literal["start", "end"]
    job: str
    slot: datetime
    attempt: int
    replica: str
    at: float


@dataclass(frozen=True, slots=True)
class Said:
    """An event a replica emitted, or a line it logged."""

    replica: str
    at: float
    what: Any
    """The event object, or a ``logging.LogRecord``."""


class Replica:
    """One replica process: a scheduler on the world's server, started and stopped by the
    world."""

    def __init__(self, fleet: Fleet, process: Process) -> None:
        self.fleet = fleet
        self.process = process
        self.stop = asyncio.Event()
        self.scheduler: Any = None
        self.stopped = False
        self.stopped_at: float | None = None
        """When its scheduler's ``async with`` ended (seconds into the run)."""
        self.pool: SimPool | None = None
        """The replica's asyncpg pool (a fleet with ``pool=True``), once open."""

    @property
    def name(self) -> str:
        """The process's name."""
        return self.process.name

    def start(self) -> None:
        """Start the replica's main task on its loop."""
        self.process.loop.create_task(self._main(), name=f"{self.name}-main")

    async def _main(self) -> None:
        from .. import Scheduler, cron, every
        from ..postgres import PostgresLocker

        fleet, world = self.fleet, self.fleet.world
        connector = TrackedConnector(world, self.process)
        given: Any = connector
        if fleet.pool:  # the user's own pool (min 1, max 4), handed to the locker
            self.pool = given = await SimPool(connector, min_size=1, max_size=4).open()
        locker = PostgresLocker(
            given,
            mode=fleet.mode,
            table=LEDGER,
            application_name=f"sim:{self.name}",
            **fleet.locker_options,
        )
        scheduler = Scheduler(locker=locker, clock=SimClock(self.process))
        self.scheduler = scheduler
        for spec in fleet.jobs:
            kind, _, value = spec.schedule.partition(":")
            schedule = every(float(value)) if kind == "every" else cron(value)
            scheduler.add_job(self._body(spec), schedule, name=spec.name, **spec.options)
        scheduler.subscribe(lambda event: fleet.said.append(Said(self.name, world.now, event)))
        async with scheduler:
            await self.stop.wait()
        self.stopped = True
        self.stopped_at = world.now
        if self.pool is not None:  # as `async with asyncpg.create_pool(...)` would
            await self.pool.close()

    def _body(self, spec: JobSpec) -> Callable[..., Any]:
        fleet, world, name = self.fleet, self.fleet.world, self.name

        async def body(ctx: RunContext) -> None:
            fleet.effects.append(Effect("start", spec.name, ctx.slot, ctx.attempt, name, world.now))
            try:
                await asyncio.sleep(spec.body)
            finally:  # a cancelled body ends too (a killed process runs no finally)
                if not fleet.ended:  # the end of the world is not judged
                    fleet.effects.append(
                        Effect("end", spec.name, ctx.slot, ctx.attempt, name, world.now)
                    )
            if ctx.attempt <= spec.fails:
                raise RuntimeError(f"attempt {ctx.attempt} fails, as this job's do")

        body.__name__ = spec.name
        return body


class _Heard(logging.Handler):
    """Every record the library logs at INFO and above, with the replica that logged it."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(logging.INFO)
        self._fleet = fleet

    def emit(self, record: logging.LogRecord) -> None:
        world = self._fleet.world
        where = world.current.name if world.current is not None else "world"
        self._fleet.said.append(Said(where, world.now, record))


class Fleet:
    """*replicas* replicas of one mode, one server, the jobs, and what they did and said."""

    def __init__(
        self,
        world: World,
        *,
        mode: Mode,
        replicas: int = 3,
        jobs: tuple[JobSpec, ...] = JOBS,
        locker_options: dict[str, Any] | None = None,
        pool: bool = False,
    ) -> None:
        from ..postgres._sql.tables import LedgerTable

        self.world = world
        self.mode = mode
        self.jobs = jobs
        self.locker_options = dict(locker_options or {})
        self.pool = pool
        """Each replica hands its locker an asyncpg pool of its own (min 1, max 4), as
        ``PostgresLocker(pool, ...)``, rather than a connector (as a DSN). Lease mode only:
        the library refuses a pool of max_size 4 in session mode (``check_pool_room``)."""
        self.table = LedgerTable(LEDGER)
        world.server = SimServer(world, statements_for(self.table))
        self.effects: list[Effect] = []
        self.ended = False
        """The run is over: the world is ending (nothing the jobs do now is judged)."""
        self.ledger: list[dict[str, Any]] = []
        """The ledger's rows once the replicas stopped (before the world ended)."""
        self.said: list[Said] = []
        self.replicas = [Replica(self, world.spawn(f"r{i}")) for i in range(replicas)]
        self._heard = _Heard(self)

    def running(self, job: str) -> Process | None:
        """The process whose body of *job* started last and has not ended, if any."""
        open_: dict[tuple[str, datetime, int], str] = {}
        for effect in self.effects:
            if effect.job != job:
                continue
            key = (effect.replica, effect.slot, effect.attempt)
            if effect.kind == "start":
                open_[key] = effect.replica
            else:
                open_.pop(key, None)
        names = list(open_.values())
        for replica in self.replicas:
            if names and replica.name == names[-1] and replica.process.alive:
                return replica.process
        return None

    def run(self, seconds: float, *, quiet: float = 0.0, stop: bool = True) -> None:
        """Start every replica, run the world for *seconds*, then *quiet* more seconds, and
        stop the replicas still alive."""
        logger = logging.getLogger("cronlock")
        logger.addHandler(self._heard)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            with self.world.installed():
                for replica in self.replicas:
                    self.world.current = replica.process
                    try:
                        replica.start()
                    finally:
                        self.world.current = None
                self.world.run_until(seconds + quiet)
                if stop:
                    for replica in self.replicas:
                        if replica.process.alive:
                            replica.process.loop.call_soon(replica.stop.set)
                    self.world.run_until(self.world.now + 30.0)
                self.ledger = list(self.world.server.db.table("runs").values())
                self.ended = True
                logger.removeHandler(self._heard)
                logger.setLevel(logging.CRITICAL + 1)  # the end of the world is not news
                self.world.close()
        finally:
            logger.removeHandler(self._heard)
            logger.setLevel(level)
