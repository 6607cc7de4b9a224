"""Faults as data: what goes wrong, when, for how long, to whom; drawn from a seed or
written in a scenario.

A fault is a frozen value with a one-line text (:meth:`Fault.text`) that
:func:`parse_fault` reads back, so that a failing run can be replayed from its line. Each
seed draws its own mix of fault kinds and their number ("swarm testing": some seeds only
kill, some only lose answers, some everything), which finds more than one uniform mix.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from .fleet import Fleet

__all__ = ("KINDS", "POOLED_KINDS", "Fault", "apply", "draw", "parse_fault")

Kind = Literal[
    "reset",
    "reply_lost",
    "hang",
    "table_lock",
    "stall",
    "crash",
    "failover",
    "restore",
    "kill",
    "freeze",
    "clock_step",
    "stop",
    "pool_exhaustion",
]

KINDS: tuple[Kind, ...] = tuple(k for k in get_args(Kind) if k not in ("stop", "pool_exhaustion"))
"""The kinds a random schedule draws from (``stop``, the whole fleet stopped, ends a run:
scenarios use it; a pooled plan draws ``pool_exhaustion`` too: :data:`POOLED_KINDS`)."""

POOLED_KINDS: tuple[Kind, ...] = (*KINDS, "pool_exhaustion")
"""The kinds a random schedule of a fleet on asyncpg pools draws from: the user's own code
may also hold every connection of a replica's pool for a while."""

_PER_REPLICA = {"reset", "reply_lost", "hang", "kill", "freeze", "clock_step", "pool_exhaustion"}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: *kind* at *at* seconds into the run, lasting *seconds*, to replica
    *replica* (for the kinds that strike one), losing *commits* (a failover), stepping a
    clock by *step* seconds, or restoring the snapshot taken *back* seconds earlier."""

    kind: Kind
    at: float
    seconds: float = 0.0
    replica: int = 0
    commits: int = 0
    step: float = 0.0
    back: float = 0.0
    job: str = ""
    """For ``kill``/``freeze``: strike the replica running this job then, whichever it is."""

    def text(self) -> str:
        """``kind@at`` and the fields that differ from their defaults: ``stall@12.5,seconds=10``."""
        parts = [f"{self.kind}@{self.at:g}"]
        for f in fields(self)[2:]:
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(
                    f"{f.name}={value}" if isinstance(value, str) else f"{f.name}={value:g}"
                )
        return ",".join(parts)

    def window(self) -> tuple[float, float]:
        """When the disruption lasts, as far as the fault itself goes (a dead holder's
        session or lease may outlive it: the oracle does not assume how long)."""
        return (self.at, self.at + self.seconds)


def parse_fault(text: str) -> Fault:
    """Read back :meth:`Fault.text`."""
    head, *rest = text.strip().split(",")
    kind, _, at = head.partition("@")
    if kind not in (*POOLED_KINDS, "stop"):
        raise ValueError(f"unknown fault kind {kind!r} in {text!r}")
    values: dict[str, Any] = {}
    for item in rest:
        name, _, value = item.partition("=")
        known: dict[str, Any] = {f.name: f.default for f in fields(Fault)[2:]}
        if name not in known:
            raise ValueError(f"unknown fault field {name!r} in {text!r}")
        default = known[name]
        values[name] = value if isinstance(default, str) else type(default)(float(value))
    return Fault(kind, float(at), **values)


def draw(rng: random.Random, *, replicas: int, seconds: float, pool: bool = False) -> list[Fault]:
    """1-5 faults of a mix of 1-4 kinds this seed chose, within the first *seconds*
    (*pool*: the replicas run on asyncpg pools, which their users may exhaust)."""
    kinds = rng.sample(POOLED_KINDS if pool else KINDS, rng.randint(1, 4))
    faults = []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(kinds)
        at = round(rng.uniform(5.0, seconds - 10.0), 3)
        replica = rng.randrange(replicas) if kind in _PER_REPLICA else 0
        fault = Fault(kind, at, replica=replica)
        if kind in ("table_lock", "stall", "pool_exhaustion"):
            fault = replace(fault, seconds=round(rng.uniform(1.0, 15.0), 3))
        elif kind == "hang":
            fault = replace(fault, seconds=round(rng.uniform(1.0, 10.0), 3))
        elif kind == "crash":
            fault = replace(fault, seconds=round(rng.uniform(0.5, 5.0), 3))
        elif kind == "failover":
            fault = replace(
                fault, seconds=round(rng.uniform(1.0, 5.0), 3), commits=rng.randint(0, 20)
            )
        elif kind == "restore":
            fault = replace(
                fault, seconds=round(rng.uniform(0.2, 1.0), 3), back=round(rng.uniform(2, 15), 3)
            )
        elif kind == "freeze":
            fault = replace(fault, seconds=round(rng.uniform(1.0, 40.0), 3))
        elif kind == "clock_step":
            fault = replace(fault, step=round(rng.choice((-1, 1)) * rng.uniform(1.0, 30.0), 3))
        faults.append(fault)
    return sorted(faults, key=lambda f: f.at)


def apply(fault: Fault, fleet: Fleet) -> None:
    """Schedule *fault* in *fleet*'s world."""
    world = fleet.world
    server = world.server
    process = fleet.replicas[fault.replica % len(fleet.replicas)].process

    def claim_of(name: str) -> object:
        # The next claim of the struck replica: a statement its handler module says is one.
        def armed(request: object, session: object) -> bool:
            statements = server.statements
            handler = statements.lookup(request.sql)  # type: ignore[attr-defined]
            return session.client == name and handler in statements.claims  # type: ignore[attr-defined]

        return armed

    def strike() -> None:
        nonlocal process
        world.log(f"fault {fault.text()}")
        kind = fault.kind
        if fault.job:
            running = fleet.running(fault.job)
            if running is None:
                world.log(f"fault {fault.text()}: nobody runs {fault.job!r} now; not struck")
                return
            process = running
        if kind == "reset":
            for session in list(server.sessions.values()):
                if session.client == process.name:
                    server.end_session(session, "the connection was reset")
        elif kind == "reply_lost":
            server.reply_lost.append(claim_of(process.name))  # type: ignore[arg-type]
        elif kind == "hang":
            server.reply_hang.append((claim_of(process.name), fault.seconds))  # type: ignore[arg-type]
        elif kind == "table_lock":
            server.table_locks[fleet.table.runs] = world.now + fault.seconds
        elif kind == "stall":
            server.stalled_until = max(server.stalled_until, world.now + fault.seconds)
        elif kind == "crash":
            server.crash(fault.seconds)
        elif kind == "failover":
            server.crash(fault.seconds, lose=fault.commits, new_identity=True)
        elif kind == "restore":
            server.crash(fault.seconds)
            if snapshots:
                server.db.restore(snapshots[0])
        elif kind == "kill":
            world.kill(process)
        elif kind == "freeze":
            world.freeze(process, fault.seconds)
        elif kind == "clock_step":
            process.skew += fault.step
        elif kind == "pool_exhaustion":
            exhaust(process)
        elif kind == "stop":
            for replica in fleet.replicas:
                replica.process.loop.call_soon(replica.stop.set)

    def exhaust(process: Any) -> None:
        # The user's own code on that replica takes every connection of its pool (waiting
        # for those lent to the locker) and holds them until the fault's end.
        pool = next((r.pool for r in fleet.replicas if r.process is process), None)
        if pool is None or not process.alive or pool.is_closing():
            world.log(f"fault {fault.text()}: {process.name} has no open pool; not struck")
            return
        until = fault.at + fault.seconds

        async def hog() -> None:
            import asyncio

            import asyncpg

            held: list[Any] = []
            try:
                while len(held) < pool.get_max_size() and world.now < until:
                    try:
                        held.append(await pool.acquire(timeout=until - world.now))
                    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                        await asyncio.sleep(0.5)  # the server is away: the user's code retries
                if world.now < until:
                    world.log(f"{process.name}: the user's code holds all {len(held)} connections")
                    await asyncio.sleep(until - world.now)
            finally:
                for conn in held:
                    await pool.release(conn)

        process.loop.create_task(hog(), name="user-holds-the-pool")

    snapshots: list[Any] = []
    if fault.kind == "restore":
        world.call_at(
            max(0.0, fault.at - fault.back),
            lambda: snapshots.append(server.db.snapshot()),
        )
    world.call_at(fault.at, strike)
