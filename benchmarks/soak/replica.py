"""One replica of the soak: a service as users write it, a dozen jobs, effects on disk.

    python benchmarks/soak/replica.py --dsn DSN --mode lease --id 1 --effects FILE

Each run appends a ``start`` line to *FILE* (JSON: job, slot, attempt, replica, pid, true
wall time) as its first act and an ``end`` line as its last (``cancel`` when it was
cancelled): an append-only file written with one ``write(2)`` per line, so what a run did
outlives a SIGKILL of its process. What a user of the replica sees is appended the same
way, for the checker's oracle (``cronlock._sim.oracle``): an ``event`` line per event the
scheduler emitted (its class name and its job, slot, reason, recovered and attempt fields),
a ``log`` line per record of the ``cronlock`` logger at WARNING or above (its formatted
message), and an ``error`` line per exception that escaped a task of the loop. The jobs are
:data:`JOBS` (the checker reads the same table). ``ready`` is printed on stdout once the
scheduler runs; SIGTERM stops it cleanly (``stopped`` is printed, exit status 0). SIGUSR1
steps the replica's clock to the offset written in ``FILE.clock`` (seconds), as a host
clock step would.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cronlock import Event, RunContext, Scheduler, every
from cronlock.postgres import Keepalives, PostgresLocker
from cronlock.testing import OffsetClock


@dataclass(frozen=True)
class JobSpec:
    """One job of the soak: every *interval* s, its body sleeps *duration* s."""

    name: str
    interval: float
    duration: float
    recover: bool = False


JOBS = (
    *(JobSpec(f"quick-{i}", 1.0, 0.05) for i in range(1, 7)),
    JobSpec("half-1", 2.0, 0.3),
    JobSpec("half-2", 2.0, 0.3),
    JobSpec("slow-1", 1.0, 2.5),  # runs longer than its interval: slots between are skipped
    JobSpec("slow-2", 3.0, 7.0),
    JobSpec("slow-3", 2.0, 3.0),
    JobSpec("recovered", 5.0, 1.5, recover=True),
)
"""The soak's jobs: six quick ones every second, two every 2 s, three slow ones (runs
longer than their interval) and one with ``recover=True``."""

LEASE = float(inspect.signature(PostgresLocker).parameters["lease"].default)
"""Lease mode: cronlock's default lease (20 s; the soak passes none, and reads the default
here for the fault windows): renewed every 5 s, a run fenced 15 s after a renewal was sent.
A killed or cut-off replica's lease blocks its job for up to this long."""
HEARTBEAT = 2.0
"""Session mode: a lock session is checked every 2 s ..."""
STATEMENT_TIMEOUT = 2.0
"""... and a statement not answered within 2 s fails: a dead session is noticed in ~4 s."""
KEEPALIVES = Keepalives(idle=3, interval=1, count=3, user_timeout=6.0)
"""Session mode: the server drops a silent client's session after ~6 s."""
MISFIRE_GRACE = 30.0


class Effects:
    """The replica's append-only effects file: one ``write(2)`` per JSON line."""

    def __init__(self, path: str, replica: int) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._replica = replica
        self._pid = os.getpid()

    def write(self, kind: str, **more: object) -> None:
        fields: dict[str, object] = {"e": kind, "rep": self._replica, "pid": self._pid}
        fields["t"] = time.time()  # true time: the effects are judged against one clock
        fields.update(more)
        os.write(self._fd, (json.dumps(fields, default=str) + "\n").encode())


EVENT_FIELDS = ("job", "slot", "reason", "recovered", "attempt", "last", "fate", "into")
"""The fields of an event the checker's oracle reads (those the event has)."""


def event_line(effects: Effects, event: Event) -> None:
    """An ``event`` line: the event's class name and its :data:`EVENT_FIELDS`; the slot as
    ISO 8601 (every instant: a ``SlotsDecided``'s ``last`` and ``into`` too), an exception
    by its class name (``why``), for the post-mortem."""
    fields: dict[str, object] = {"name": type(event).__name__}
    for name in EVENT_FIELDS:
        if hasattr(event, name):
            value = getattr(event, name)
            fields[name] = value.isoformat() if isinstance(value, datetime) else value
    exception = getattr(event, "exception", None)
    if exception is not None:
        fields["why"] = type(exception).__name__
    effects.write("event", **fields)


class Heard(logging.Handler):
    """Every record of the ``cronlock`` logger at WARNING or above, as a ``log`` line."""

    def __init__(self, effects: Effects) -> None:
        super().__init__(logging.WARNING)
        self._effects = effects

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is still heard
            message = f"{record.msg!r} % {record.args!r}"
        self._effects.write(
            "log", level=record.levelno, logger=record.name, msg=message, at=record.created
        )


def job_body(effects: Effects, spec: JobSpec) -> Callable[[RunContext], Awaitable[None]]:
    """The task of *spec*: record the start, work for its duration, record the end."""

    async def run(context: RunContext) -> None:
        this = {"job": spec.name, "slot": context.slot.isoformat(), "attempt": context.attempt}
        effects.write("start", **this)
        try:
            await asyncio.sleep(spec.duration)
        except asyncio.CancelledError:
            effects.write("cancel", **this)
            raise
        effects.write("end", **this)

    run.__name__ = spec.name.replace("-", "_")
    return run


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--mode", choices=("session", "lease"), required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--effects", required=True)
    args = parser.parse_args()
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(created).3f r{args.id} %(levelname)s %(name)s: %(message)s",
    )
    effects = Effects(args.effects, args.id)
    logging.getLogger("cronlock").addHandler(Heard(effects))
    clock = OffsetClock(0)
    locker = PostgresLocker(
        args.dsn,
        mode=args.mode,  # lease mode: the default lease (LEASE)
        heartbeat=HEARTBEAT,
        statement_timeout=STATEMENT_TIMEOUT,
        keepalives=KEEPALIVES,
        application_name=f"cronlock-soak-{args.id}",
    )
    scheduler = Scheduler(locker=locker, clock=clock, stop_timeout=3)
    for spec in JOBS:
        scheduler.add_job(
            job_body(effects, spec),
            every(spec.interval),
            name=spec.name,
            recover=spec.recover,
            misfire_grace=MISFIRE_GRACE,
        )

    scheduler.subscribe(lambda event: event_line(effects, event))

    def step_clock() -> None:
        with open(args.effects + ".clock") as f:
            clock.offset = timedelta(seconds=float(f.read()))
        logging.getLogger("soak").warning("clock stepped to %+.3f s", clock.offset.total_seconds())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def escaped(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exception = context.get("exception")
        what = repr(exception) if exception is not None else str(context.get("message"))
        effects.write("error", msg=f"{context.get('message')}: {what}")
        loop.default_exception_handler(context)

    loop.set_exception_handler(escaped)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, step_clock)
    async with scheduler:
        print("ready", flush=True)
        await stop.wait()
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
