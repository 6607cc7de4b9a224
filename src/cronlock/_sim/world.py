"""The simulated world: one virtual clock, one server, processes stepped in time order.

:meth:`World.run_until` is the whole scheduler of the simulation: at each instant every
live, unfrozen process runs what is ready (in a fixed order), then the world's own events
due now (statements reaching the server, faults); when nothing is left at this instant,
time jumps to the earliest timer of any process or the world. Nothing reads real time,
nothing waits on real I/O, and every random draw comes from one seeded generator, so a
seed replays a run exactly.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import secrets
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from .loop import SimLoop, VirtualTime

if TYPE_CHECKING:
    from .server import Request, Session, SimServer

__all__ = ("Process", "SimClock", "World", "WorldStuck")

_EPOCH = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
_STEPS_AT_ONE_INSTANT = 200_000
"""Turns at one virtual instant before the world calls it a livelock."""


_ABANDONED: list[Process] = []
"""Processes of worlds that got stuck: kept for the life of the interpreter (rare)."""


class WorldStuck(RuntimeError):
    """The simulation cannot go on: a livelock at one instant, or a bug of the model."""


@dataclass(eq=False)
class Process:
    """One simulated process: its loop, identity, clock skew, life."""

    name: str
    pid: int
    host: str
    loop: SimLoop
    world: World
    alive: bool = True
    frozen_until: float = 0.0
    skew: float = 0.0
    connections: list[Any] = field(default_factory=list)
    keep: list[Any] = field(default_factory=list)
    """Tasks that would not end when the world did (kept from the garbage collector)."""

    def runnable(self) -> bool:
        """Alive and not frozen now."""
        return self.alive and self.frozen_until <= self.world.now

    def deliver(self, fn: Callable[[], None], *, delay: float | None = None) -> None:
        """Run *fn* on this process's loop after *delay* (a network hop by default)."""
        if not self.alive:
            return
        wait = self.world.latency() if delay is None else delay
        self.loop.call_at(self.world.clock.now + wait, fn)


class SimClock:
    """A process's wall clock: true virtual time plus its skew (a stepped clock); it follows
    real time, as a host's clock does, so fleet time measures it against the server's."""

    def __init__(self, process: Process) -> None:
        self._process = process

    @property
    def real_time(self) -> bool:
        """True: this clock moves with (virtual) real time."""
        return True

    def now(self) -> datetime:
        """The process's wall time."""
        world = self._process.world
        return world.at(world.clock.now + self._process.skew)

    async def sleep_until(self, deadline: datetime) -> None:
        """Sleep until this clock reads *deadline* (it may have been stepped meanwhile)."""
        import asyncio

        while True:
            left = (deadline - self.now()).total_seconds()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 60.0))


class World:
    """The virtual clock, the processes, the server, and the log of what happened."""

    def __init__(self, seed: int, *, epoch: datetime = _EPOCH) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = VirtualTime()
        self.epoch = epoch
        self.processes: list[Process] = []
        self._server: SimServer | None = None
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.current: Process | None = None
        self.errors: list[str] = []
        self.freezes: list[tuple[str, float, float]] = []
        """Each freeze: the process, from when, until when (seconds)."""
        self.errors_closed = 0
        """How many of :attr:`errors` came before the world began to end (judged)."""
        self.trace: list[str] = []
        self.latency_range = (0.0005, 0.002)
        self._instants: dict[float, datetime] = {}

    @property
    def server(self) -> SimServer:
        """The database server (the fleet sets it)."""
        if self._server is None:
            raise WorldStuck("this world has no server")
        return self._server

    @server.setter
    def server(self, server: SimServer) -> None:
        self._server = server

    @property
    def now(self) -> float:
        """Virtual seconds since the start."""
        return self.clock.now

    def at(self, seconds: float) -> datetime:
        """The true instant *seconds* into the run (remembered for a while: the processes'
        clocks and the server's read the same few instants many times over)."""
        found = self._instants.get(seconds)
        if found is None:
            if len(self._instants) >= 4096:
                self._instants.clear()
            found = self._instants[seconds] = self.epoch + timedelta(seconds=seconds)
        return found

    def latency(self) -> float:
        """One network hop's delay, drawn from the seed."""
        low, high = self.latency_range
        return low + (high - low) * self.rng.random()

    def log(self, text: str) -> None:
        """Note *text* in the run's trace (printed for a failure)."""
        self.trace.append(f"{self.now:10.4f} {text}")

    def error(self, text: str) -> None:
        """Something the library must never do happened (an exception escaped a task)."""
        self.errors.append(f"{self.now:.4f} {text}")

    # -- processes ----------------------------------------------------------------------

    def spawn(self, name: str) -> Process:
        """A new process with a loop of its own."""
        index = len(self.processes)
        loop = SimLoop(self.clock, name, self.error)
        process = Process(name, 40000 + index, f"sim-host-{index}", loop, self)
        self.processes.append(process)
        return process

    def kill(self, process: Process) -> None:
        """SIGKILL: the process stops at once; the kernel closes its sockets (the server
        notices each session's end as soon as the FIN arrives)."""
        if not process.alive:
            return
        process.alive = False  # never stepped again; what it was doing stays where it was
        for conn in process.connections:
            if self._server is not None and not conn.is_closed():
                self.server.client_gone(conn._session)
        self.log(f"{process.name} killed")

    def freeze(self, process: Process, seconds: float) -> None:
        """SIGSTOP for *seconds*: nothing of the process runs; its sessions stay open."""
        process.frozen_until = max(process.frozen_until, self.now + seconds)
        self.freezes.append((process.name, self.now, self.now + seconds))
        self.log(f"{process.name} frozen for {seconds}s")

    def close(self) -> None:
        """End the world: the server goes away, every process (the killed ones too: their
        coroutines must end somewhere) has its tasks cancelled and run to their end, with
        time moving on, so nothing is left for the garbage collector to close outside a
        loop. What happens now is not judged."""
        import asyncio

        server = self._server
        if server is not None:
            server.up = False
            for session in list(server.sessions.values()):
                server.end_session(session, "the world ends")
        for process in self.processes:
            process.alive, process.frozen_until = True, 0.0
            for task in asyncio.all_tasks(process.loop):
                task.cancel()
        self.errors_closed = len(self.errors)
        self.run_until(self.now + 300.0)
        for process in self.processes:
            pending = asyncio.all_tasks(process.loop)
            if pending:  # still not done: drop them where no finally can run any more
                process.keep.extend(pending)
            process.loop.abandon()
            process.loop.close()

    def abandon(self) -> None:
        """End a world that cannot go on (:class:`WorldStuck`): every loop is dropped as it
        is (their tasks are kept from the garbage collector, which would run their
        ``finally`` outside any loop)."""
        import asyncio

        for process in self.processes:
            process.keep.extend(asyncio.all_tasks(process.loop))
            process.loop.abandon()
            process.loop.close()
        _ABANDONED.extend(self.processes)

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the world's own events ---------------------------------------------------------

    def call_at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        """Run *fn(*args)* at virtual time *when* (not before now)."""
        now = self.clock.now
        heapq.heappush(self._events, (now if now > when else when, next(self._seq), fn, args))

    def send(self, session: Session, request: Request) -> None:
        """A statement leaves its client; it reaches the server after a hop."""
        self.call_at(self.clock.now + self.latency(), self.server.arrive, session, request)

    # -- running ------------------------------------------------------------------------

    def run_until(self, until: float) -> None:
        """Run the world up to virtual time *until*."""
        clock, events, processes = self.clock, self._events, self.processes
        turns = 0

        def delivering() -> bool:  # something of the world's own is due at this instant
            return bool(events) and events[0][0] <= clock.now

        while True:
            now = clock.now
            progressed = False
            for process in processes:
                if not process.alive or process.frozen_until > now:
                    continue
                # SimLoop.due, inlined: this test runs for every process at every instant.
                loop: Any = process.loop
                scheduled = loop._scheduled
                if loop._ready or (scheduled and scheduled[0]._when <= now):
                    self.current = process
                    try:
                        turns += loop.step(_STEPS_AT_ONE_INSTANT, delivering)
                    finally:
                        self.current = None
                    progressed = True
            while events and events[0][0] <= now:
                _, _, fn, args = heapq.heappop(events)
                fn(*args)
                progressed = True
            if progressed:
                turns += 1
                if turns > _STEPS_AT_ONE_INSTANT:
                    raise WorldStuck(f"no progress of time at {now:.6f}s (a livelock)")
                continue
            turns = 0
            upcoming = self._next_instant()
            if upcoming is None or upcoming > until:
                clock.now = max(now, until)
                return
            clock.now = upcoming

    def _next_instant(self) -> float | None:
        now = self.clock.now
        best = self._events[0][0] if self._events else None
        for process in self.processes:
            if not process.alive:
                continue
            frozen_until = process.frozen_until
            if frozen_until > now:
                when: float | None = frozen_until
            else:
                # SimLoop.next_timer, inlined when the earliest timer is live (the usual
                # case: this runs for every process each time the world's clock moves).
                loop: Any = process.loop
                scheduled = loop._scheduled
                if scheduled and not scheduled[0]._cancelled:
                    when = scheduled[0]._when
                else:
                    when = loop.next_timer()
            if when is not None and (best is None or when < best):
                best = when
        return best

    # -- the process-wide patches a run needs -------------------------------------------

    @contextmanager
    def installed(self) -> Iterator[None]:
        """Make this process's globals deterministic and per simulated process while the
        world runs: the pid and host name each simulated process sees, the random draws,
        the tokens, and the monotonic clock the library's leases read."""
        from .. import _clock
        from .._core import planner
        from ..postgres._locker import failover

        saved: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, value: Any) -> None:
            saved.append((owner, name, getattr(owner, name)))
            setattr(owner, name, value)

        real_pid = os.getpid
        rng = self.rng

        def pid() -> int:
            return self.current.pid if self.current is not None else real_pid()

        def host() -> str:
            return self.current.host if self.current is not None else "sim-world"

        class _Random:
            Random = staticmethod(lambda: random.Random(rng.getrandbits(64)))

        patch(os, "getpid", pid)
        patch(socket, "gethostname", host)
        patch(secrets, "token_hex", lambda n=16: rng.getrandbits(8 * n).to_bytes(n, "big").hex())
        patch(secrets, "token_bytes", lambda n=16: rng.getrandbits(8 * n).to_bytes(n, "big"))
        patch(_clock, "_monotonic", lambda: self.clock.now)
        patch(failover, "_now", lambda: self.at(self.clock.now))
        patch(planner, "random", _Random)
        state = random.getstate()
        random.seed(rng.getrandbits(64))
        logging.raiseExceptions = False
        try:
            yield
        finally:
            random.setstate(state)
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)
