"""A replica process for the coordination tests: one scheduler, one job, JSON lines out.

Run as ``python replica.py --dsn DSN --job NAME --id N --start EPOCH --slots K``. Each run
prints ``{"event": "start"|"end", "replica": N, "slot": ..., "t": time.time()}``; the
tests read the lines to check mutual exclusion, misses and failover.

``--start -``: the replica boots (imports, arguments), prints ``{"event": "booted"}`` and
reads its start epoch from a line of stdin, so a test can pick the first slot once every
replica has booted, however slowly a busy machine starts Python: nothing of a replica that
has not been given its start runs (no connection, no scheduler); ``--until-after S`` then
exits S seconds after that start (``--until`` names an epoch).

Options for the exactly-once measurements: ``--offset S`` runs the scheduler on a clock
S seconds ahead (negative: behind) of the real one, which fleet time corrects unless
``--host-clock`` (``fleet_clock=False``) is given; ``--hold-range LO HI`` makes each run
take a duration drawn from the slot (every replica draws the same one); ``--no-ledger``
uses the locker in lock-only mode; ``--trace`` also prints every acquire ("attempt", with
the real-time window of the call and its answer) and every lease release ("released").

Options for the crash tests: ``--table T`` names the ledger table; ``--recover`` sets the
job's ``recover=True``; a ``JobCrashed`` this replica emits is printed as "crashed" (with
the owner and whether it reruns the slot), and "running" once the scheduler started. A
``SlotsDecided`` is printed as "decided" (its range, fate, the slot coalesced into, reason).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg

from cronlock import (
    Event,
    ForeignWatchingLocker,
    JobCrashed,
    JobSkipped,
    LedgerLocker,
    LockFailed,
    LockHeldElsewhere,
    LockLost,
    LosableHold,
    RecordingHold,
    Refusal,
    RunContext,
    RunRecord,
    ScheduleNotingLocker,
    Scheduler,
    ServerClockLocker,
    SlotsDecided,
    SystemClock,
    every,
)
from cronlock._locking.protocols import CrashCallback, ForeignCallback
from cronlock.postgres import PostgresHold, PostgresLocker
from cronlock.testing import OffsetClock


def command(
    dsn: str, job: str, rid: int, start: float | None, slots: int, *extra: str
) -> list[str]:
    """The command line that starts one replica process (what the tests spawn); *start*
    ``None``: it reads its start from stdin once booted (``--start -``)."""
    return [
        sys.executable,
        __file__,
        "--dsn",
        dsn,
        "--job",
        job,
        "--id",
        str(rid),
        "--start",
        "-" if start is None else str(start),
        "--slots",
        str(slots),
        *extra,
    ]


def shorten_membership(every: float) -> None:
    """Heartbeats every *every* seconds and a members row's time to live three times that
    (15 and 45 s by default), in this process: a killed replica is taken for gone, and its
    run for crashed, within seconds instead of a minute."""
    from cronlock.postgres._locker import members
    from cronlock.postgres._sql import upkeep

    for module in (members, upkeep):
        vars(module).update(MEMBERS_EVERY=every, MEMBER_TTL=3 * every)


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def drawn(slot: datetime, low: float, high: float) -> float:
    """A duration in [low, high] derived from the slot alone, the same on every replica."""
    digest = hashlib.blake2b(slot.isoformat().encode(), digest_size=8).digest()
    return low + (high - low) * int.from_bytes(digest, "big") / 2**64


class _TracedLease:
    """Prints each release; forwards the rest. Every capability is a method of its own:
    the scheduler checks them on the class (once), where ``__getattr__`` shows nothing."""

    def __init__(self, lease: PostgresHold, rid: int, slot: float) -> None:
        self._lease = lease
        self._rid = rid
        self._slot = slot

    @property
    def lost(self) -> bool:
        return self._lease.lost

    def record(self, record: RunRecord) -> None:
        self._lease.record(record)

    def on_lost(self, callback: Callable[[BaseException | None], None]) -> None:
        self._lease.on_lost(callback)

    async def release(self) -> None:
        await self._lease.release()
        emit(event="released", replica=self._rid, slot=self._slot, t=time.time())


class _TracedLocker:
    """Prints each acquire's real-time window and answer; forwards the rest (explicitly,
    as for the lease: a ledger locker is recognised by its class)."""

    def __init__(self, locker: PostgresLocker, rid: int) -> None:
        self._locker = locker
        self._rid = rid

    async def last_claimed(self, job: str) -> datetime | None:
        return await self._locker.last_claimed(job)

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        return await self._locker.last_runs(job)

    async def history(self, job: str, limit: int = 20) -> list[RunRecord]:
        return await self._locker.history(job, limit)

    def on_crashed(self, callback: CrashCallback) -> None:
        self._locker.on_crashed(callback)

    def on_foreign_holder(self, callback: ForeignCallback) -> None:
        self._locker.on_foreign_holder(callback)

    def note_schedule(self, job: str, schedule: str, next_run: datetime | None) -> None:
        self._locker.note_schedule(job, schedule, next_run)

    async def read_server_clock(
        self, read: Callable[[], datetime]
    ) -> tuple[datetime, datetime, datetime]:
        return await self._locker.read_server_clock(read)

    async def acquire(self, job: str, slot: datetime) -> _TracedLease | Refusal:
        t0 = time.time()
        result = await self._locker.acquire(job, slot)
        t1 = time.time()
        answer = result if isinstance(result, str) else "granted"
        emit(event="attempt", replica=self._rid, slot=slot.timestamp(), t0=t0, t1=t1, result=answer)
        if isinstance(result, str):
            return result
        return _TracedLease(result, self._rid, slot.timestamp())


# The scheduler checks a locker's and a lease's capabilities on their classes: the tracing
# wrappers must keep every one of them, or --trace would change what it traces.
assert issubclass(_TracedLocker, LedgerLocker) and issubclass(_TracedLocker, ScheduleNotingLocker)
assert issubclass(_TracedLocker, ServerClockLocker)
assert issubclass(_TracedLocker, ForeignWatchingLocker)
assert issubclass(_TracedLease, RecordingHold) and issubclass(_TracedLease, LosableHold)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--start", required=True, help="epoch, or '-': read it from stdin")
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--hold", type=float, default=0.2, help="seconds each run takes")
    parser.add_argument("--hold-range", type=float, nargs=2, metavar=("LO", "HI"))
    parser.add_argument("--offset", type=float, default=0.0, help="clock offset, seconds")
    parser.add_argument("--host-clock", action="store_true", help="fleet_clock=False")
    parser.add_argument("--no-ledger", action="store_true", help="lock-only mode")
    parser.add_argument("--trace", action="store_true", help="print acquires and releases")
    parser.add_argument("--misfire-grace", type=float, help="default: one interval")
    parser.add_argument("--until", type=float, help="exit at this epoch (default: after stop)")
    parser.add_argument("--until-after", type=float, help="exit this many seconds after start")
    parser.add_argument("--table", help="ledger table (default: cronlock_runs)")
    parser.add_argument("--recover", action="store_true", help="rerun crashed slots")
    parser.add_argument("--mode", choices=("session", "lease"), default="session")
    parser.add_argument("--lease", type=float, default=20.0, help="lease mode: lease seconds")
    parser.add_argument("--schema", help="ledger schema (default: the search_path's)")
    parser.add_argument(
        "--pool", action="store_true", help="hand the locker an asyncpg pool, not the DSN"
    )
    parser.add_argument("--bare-keys", action="store_true", help="the seed's job_lock_key")
    parser.add_argument(
        "--members-every", type=float, help="seconds between members heartbeats (default 15)"
    )
    args = parser.parse_args()
    if args.members_every:
        shorten_membership(args.members_every)

    if args.start == "-":
        emit(event="booted", replica=args.id, t=time.time())
        given = sys.stdin.readline()  # nothing else runs yet: blocking the loop is harmless
        if not given.strip():
            return  # the test went away before giving a start
        args.start = given
    start = datetime.fromtimestamp(float(args.start), UTC)
    if args.until_after is not None:
        args.until = start.timestamp() + args.until_after
    stop = start + timedelta(seconds=args.interval * (args.slots - 1))
    pool = None
    if args.pool:
        # As a user behind a transaction pooler makes one (asyncpg needs no statement cache).
        pool = await asyncpg.create_pool(args.dsn, min_size=0, max_size=4, statement_cache_size=0)
    locker = PostgresLocker(
        pool or args.dsn,
        application_name=f"cronlock-test-replica-{args.id}",
        ledger=not args.no_ledger,
        mode=args.mode,
        lease=args.lease,
        bare_keys=args.bare_keys,
        **({"table": args.table} if args.table else {}),
        **({"schema": args.schema} if args.schema else {}),
    )
    real = SystemClock()
    clock = OffsetClock(args.offset) if args.offset else real
    scheduler = Scheduler(
        clock=clock,
        locker=_TracedLocker(locker, args.id) if args.trace else locker,
        stop_timeout=0,
        fleet_clock=False if args.host_clock else None,
    )
    longest = args.hold_range[1] if args.hold_range else max(args.hold, 0)

    async def work(ctx: RunContext) -> None:
        emit(event="start", replica=args.id, slot=ctx.slot.timestamp(), t=time.time())
        if args.hold < 0:
            await asyncio.Event().wait()  # hold the lock until killed
        hold = drawn(ctx.slot, *args.hold_range) if args.hold_range else args.hold
        await asyncio.sleep(hold)
        emit(event="end", replica=args.id, slot=ctx.slot.timestamp(), t=time.time())

    def report(event: Event) -> None:
        if isinstance(event, JobSkipped):
            emit(
                event="skipped",
                replica=args.id,
                slot=event.slot.timestamp(),
                reason=event.reason,
                t=time.time(),
            )
        elif isinstance(event, LockFailed):
            emit(
                event="lock_failed",
                replica=args.id,
                slot=event.slot.timestamp(),
                error=repr(event.exception),
            )
        elif isinstance(event, SlotsDecided):
            emit(
                event="decided",
                replica=args.id,
                slot=event.slot.timestamp(),
                last=event.last.timestamp(),
                fate=event.fate,
                into=None if event.into is None else event.into.timestamp(),
                reason=event.reason,
                t=time.time(),
            )
        elif isinstance(event, LockHeldElsewhere):
            emit(event="held_elsewhere", replica=args.id, holder=event.holder, t=time.time())
        elif isinstance(event, LockLost):
            emit(event="lock_lost", replica=args.id, slot=event.slot.timestamp(), t=time.time())
        elif isinstance(event, JobCrashed):
            emit(
                event="crashed",
                replica=args.id,
                slot=event.slot.timestamp(),
                owner=event.owner,
                recovered=event.recovered,
                t=time.time(),
            )

    scheduler.subscribe(report)
    scheduler.add_job(
        work,
        every(args.interval, anchor=start),
        name=args.job,
        start_at=start,
        stop_at=stop,
        misfire_grace=args.interval if args.misfire_grace is None else args.misfire_grace,
        recover=args.recover,
    )
    emit(event="ready", replica=args.id, t=time.time())
    async with locker, scheduler:
        emit(event="running", replica=args.id, t=time.time())
        if args.until is not None:
            await real.sleep_until(datetime.fromtimestamp(args.until, UTC))
        else:
            await clock.sleep_until(stop + timedelta(seconds=longest + 1.0))
    if pool is not None:
        await pool.close()
    emit(event="exit", replica=args.id, t=time.time(), **_counters(locker))


def _counters(locker: PostgresLocker) -> dict[str, int]:
    stats = locker.statistics()
    return {
        "granted": stats.granted,
        "statements": stats.statements,
        "connect_attempts": stats.connect_attempts,
        "connect_failures": stats.connect_failures,
    }


if __name__ == "__main__":
    asyncio.run(main())
