"""``python -m cronlock demo``: replica processes share one every-second job, shown live.

The parent picks a backend (PostgreSQL when a server answers, else a FileLocker), starts
the replicas (``python -m cronlock _replica ...``, dispatched before the public parser so
it never shows in ``--help``) and prints each slot as soon as every replica reported it:
who ran it and who skipped it, and why. ``--skew`` sets the replicas' clocks apart, the
case where a lock alone runs a slot twice and the run ledger does not (the replicas read
their own clocks, ``fleet_clock=False``: fleet time would correct the skew).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .._clock import SystemClock
from .._dsn import connect_failure
from .._errors import CronlockError

__all__ = ("add_demo_parser", "replica_main", "run_demo")

JOB = "cronlock-demo-tick"
# Tried when neither --dsn nor CRONLOCK_DSN names a server: the usual local/Docker default.
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
# Each replica says it is ready once it has imported and built its locker (a moment, or
# many on a busy machine); the first slot is then this far ahead, for every replica alike.
_LEAD_SECONDS = 1
# How long the parent waits for a replica to be ready before giving up on the demo.
_BOOT_LIMIT = 120.0
# How long after a slot (plus the slowest clock's lag) its line waits for late reports.
_REPORT_GRACE = 2.0
# How the parent connects: no named prepared statements (a transaction pooler lends each
# transaction another client's server connection, where they would clash).
_CONNECT: dict[str, Any] = {
    "timeout": 3,
    "statement_cache_size": 0,
    "server_settings": {"application_name": "cronlock-demo"},
}
# The DSN goes to the replicas in the environment, not on their command lines (`ps`).
_DSN_ENV = "_CRONLOCK_DEMO_DSN"
_REASONS = {
    "already_ran": "already ran",
    "locked": "locked",
    "misfire": "too late",
    "overlap": "still running",
    "not_leader": "not leader",
    "lock_error": "lock error",
}


def add_demo_parser(verbs: Any) -> None:
    """Register the ``demo`` verb (its replicas are started through :func:`replica_main`)."""
    demo = verbs.add_parser(
        "demo",
        help="run N replica processes of one every-second job; show who runs each slot",
        description="Run N replica processes of one every-second job and show, live, which "
        "replica ran each slot and why the others skipped it. Uses PostgreSQL when a "
        f"server answers (--dsn, else $CRONLOCK_DSN, else {LOCAL_DSN}), in a throwaway "
        "schema dropped at the end; otherwise a FileLocker in a temporary directory. "
        "Exit status 1 if a slot ran twice or not at all.",
    )
    demo.add_argument("--replicas", type=int, default=3, help="processes, 1 to 32 (default: 3)")
    demo.add_argument("--duration", type=int, default=10, help="seconds (default: 10)")
    demo.add_argument("--dsn", help="PostgreSQL DSN (default: $CRONLOCK_DSN, then the local one)")
    demo.add_argument(
        "--locker",
        choices=("postgres", "file"),
        help="insist on a backend (default: postgres when a server answers, else file)",
    )
    demo.add_argument(
        "--mode",
        choices=("session", "lease"),
        help="PostgresLocker's mode (default: lease through a connection pooler, else session)",
    )
    demo.add_argument(
        "--lock-only",
        action="store_true",
        help="PostgreSQL advisory locks without the run ledger (can run a slot twice)",
    )
    demo.add_argument(
        "--skew",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="replica clocks are 0, -SKEW, -2*SKEW, ... seconds off (default: 0, at most 2)",
    )


# -- the parent ------------------------------------------------------------------------------


@dataclass
class _Backend:
    """What the replicas coordinate through, and what to clean up afterwards."""

    line: str
    args: list[str]
    dsn: str | None = None
    schema: str | None = None  # the throwaway schema of the ledger, dropped at the end
    notes: list[str] = field(default_factory=list)


def run_demo(args: argparse.Namespace) -> int:
    """Run ``demo``: check the options, choose the backend, run the replicas, clean up."""
    if not 1 <= args.replicas <= 32:
        raise CronlockError(f"--replicas must be between 1 and 32, got {args.replicas}")
    if not 1 <= args.duration <= 3600:
        raise CronlockError(f"--duration must be between 1 and 3600, got {args.duration}")
    if not 0 <= args.skew <= 2:
        raise CronlockError(f"--skew must be between 0 and 2 seconds, got {args.skew}")
    if args.locker == "file" and (args.dsn or args.lock_only or args.mode):
        flag = "--dsn" if args.dsn else "--lock-only" if args.lock_only else "--mode"
        raise CronlockError(f"{flag} needs PostgreSQL, not --locker file")
    if args.lock_only and args.mode is not None:
        # Advisory locks without a ledger are session mode's (leases live in the ledger).
        raise CronlockError("--lock-only takes session advisory locks: leave --mode out")
    with tempfile.TemporaryDirectory(prefix="cronlock-demo-") as lockdir:
        backend = asyncio.run(_choose_backend(args, lockdir))
        try:
            # Ctrl-C cancels _parent, which stops the replicas; the schema is dropped below,
            # on a fresh event loop, so that cleanup never runs inside a cancelled task.
            return asyncio.run(_parent(args, backend))
        finally:
            if backend.schema is not None:
                assert backend.dsn is not None
                asyncio.run(_drop_schema(backend.dsn, backend.schema))


async def _choose_backend(args: argparse.Namespace, lockdir: str) -> _Backend:
    file_backend = _Backend(
        f"backend: FileLocker (flock and a slot ledger) in {lockdir}", ["--lockdir", lockdir]
    )
    if args.locker == "file":
        return file_backend
    if args.dsn:
        dsn, source = args.dsn, "--dsn"
    elif os.environ.get("CRONLOCK_DSN"):
        dsn, source = os.environ["CRONLOCK_DSN"], "CRONLOCK_DSN"
    else:
        dsn, source = LOCAL_DSN, f"the default {LOCAL_DSN}"
    # Asked for PostgreSQL in so many words: failing to get it is an error, not a fallback.
    insisted = bool(args.dsn) or args.locker == "postgres" or args.lock_only or bool(args.mode)
    try:
        mode = "session" if args.lock_only else args.mode
        return await _postgres_backend(dsn, source, mode=mode, lock_only=args.lock_only)
    except CronlockError as exc:
        if insisted:
            raise
        hint = "" if args.dsn or source == "CRONLOCK_DSN" else "; pass --dsn to use a server"
        file_backend.notes.append(f"  not PostgreSQL: {exc}{hint}")
        return file_backend


async def _postgres_backend(
    dsn: str, source: str, *, mode: str | None, lock_only: bool
) -> _Backend:
    try:
        import asyncpg
    except ImportError:
        raise CronlockError(
            "asyncpg is not installed: pip install 'cronlock[postgres]' "
            "(from a clone, until cronlock is on PyPI: pip install -e '.[postgres]')"
        ) from None
    from ..postgres._conn.hosts import addresses, shown
    from ..postgres._modes import mode_through
    from ..postgres._modes.session import pooler_seen
    from ..postgres._sql.schema import DESCRIBE_SERVER_SQL, migrate
    from ..postgres._sql.tables import DEFAULT_TABLE, LedgerTable

    try:
        # No named prepared statements: through a transaction pooler they would clash with
        # other clients' on the server connection this one is lent.
        conn = await asyncpg.connect(dsn, **_CONNECT)
    except Exception as exc:  # bad syntax, refused, auth, unknown database: one clear line
        # Never the DSN's password, which a parse error may quote (cronlock._dsn).
        reason = connect_failure(dsn, exc)
        raise CronlockError(f"cannot connect to PostgreSQL with {source}: {reason}") from None
    try:
        try:
            where = await conn.fetchrow(DESCRIBE_SERVER_SQL)
            pooler = await pooler_seen(conn)
        except Exception as exc:
            raise CronlockError(
                f"cannot read the server's version with {source}: {exc!r}"
            ) from None
        try:
            chosen, excludes = mode_through(mode, pooler)
        except CronlockError as exc:
            hint = (
                "--lock-only takes session advisory locks: leave it out to run the demo "
                "in lease mode"
                if lock_only
                else "leave --mode out, or pass --mode lease"
            )
            raise CronlockError(f"{exc} ({hint})") from None
        # The address is the DSN's, as given (a pooler's, not the server's behind it): the
        # server describes only itself, and its port would hide the pooler. No password.
        found = addresses(dsn, _CONNECT)
        address = ", ".join(shown(a) for a in found) if found else "the DSN's address"
        server = f"PostgreSQL {where['version'].split()[0]}, database {where['db']} on {address}"
        origin = "the default address" if source.startswith("the default") else source
        through = "" if pooler is None else ", through a connection pooler"
        if lock_only:
            return _Backend(
                f"backend: {server} (from {origin}): advisory locks only, no run ledger",
                ["--lock-only"],
                dsn=dsn,
            )
        schema = f"cronlock_demo_{secrets.token_hex(4)}"
        try:
            await migrate(conn, LedgerTable(DEFAULT_TABLE, schema))
        except Exception as exc:
            raise CronlockError(f"cannot create a schema for the demo's ledger: {exc!r}") from None
        return _Backend(
            f"backend: {server} (from {origin}){through}: {excludes} and the run ledger, "
            f"in schema {schema} (dropped at the end)",
            ["--schema", schema, "--mode", chosen],
            dsn=dsn,
            schema=schema,
        )
    finally:
        await conn.close()


async def _drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    from ..postgres._sql.schema import DROP_LOCK_TIMEOUT_SQL, drop_schema_sql
    from ..postgres._sql.tables import DEFAULT_TABLE, LedgerTable, quote_ident

    try:
        conn = await asyncpg.connect(dsn, **{**_CONNECT, "timeout": 10})
        try:
            # One transaction: through a pooler, a setting outside one would stay on the
            # server connection for its next client.
            async with conn.transaction():
                await conn.execute(DROP_LOCK_TIMEOUT_SQL)
                await conn.execute(drop_schema_sql(LedgerTable(DEFAULT_TABLE, schema)))
        finally:
            await conn.close()
    except Exception as exc:
        print(
            f"cronlock: warning: could not drop the demo's schema {schema} ({exc}); "
            f"drop it with: DROP SCHEMA {quote_ident(schema)} CASCADE",
            file=sys.stderr,
        )


# (replica, report) pairs from the replicas' output; (replica, None) when one's output ends.
_Reports = asyncio.Queue[tuple[int, dict[str, Any] | None]]


@dataclass
class _Slot:
    ran: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)

    def reported(self) -> int:
        return len(set(self.ran) | set(self.skipped))


async def _parent(args: argparse.Namespace, backend: _Backend) -> int:
    clock = SystemClock()
    offsets = [-k * args.skew for k in range(args.replicas)]
    print(backend.line)
    for note in backend.notes:
        print(note)
    clocks = "" if not args.skew else ", clocks " + ", ".join(f"{o:+.2f}s" for o in offsets)
    print(
        f"{args.replicas} replica(s), job {JOB!r} every second for {args.duration}s"
        f"{clocks}; times in UTC",
        flush=True,
    )
    env = {**os.environ}
    if backend.dsn is not None:
        env[_DSN_ENV] = backend.dsn
    procs: list[asyncio.subprocess.Process] = []
    queue: _Reports = asyncio.Queue()
    readers: list[asyncio.Task[None]] = []
    try:
        for i, offset in enumerate(offsets, start=1):
            cmd = ["-m", "cronlock", "_replica", "--id", str(i)]
            cmd += ["--duration", str(args.duration), f"--offset={offset}", *backend.args]
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            procs.append(proc)
        # The first slot is fixed once every replica is ready, so that a slow start (a
        # busy machine) costs no replica its first slots.
        try:
            async with asyncio.timeout(_BOOT_LIMIT):
                for proc in procs:
                    await _ready(proc)
        except TimeoutError:
            raise CronlockError(f"the replicas were not ready within {_BOOT_LIMIT:.0f}s") from None
        start = math.ceil(clock.now().timestamp()) + _LEAD_SECONDS
        for i, proc in enumerate(procs, start=1):
            assert proc.stdin is not None
            proc.stdin.write(f"{start}\n".encode())
            await proc.stdin.drain()
            readers.append(asyncio.create_task(_read(i, proc, queue), name=f"replica-{i} out"))
        slots = await _show(args, start, queue)
        for proc in procs:  # each replica stops on its own about 2 s after the last slot
            await proc.wait()
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    return _summary(args, slots, procs)


async def _ready(proc: asyncio.subprocess.Process) -> None:
    """Wait for a replica's ready line (it ends with nothing said: it failed to start)."""
    assert proc.stdout is not None
    async for raw in proc.stdout:
        if raw.strip() == b'{"ready": true}':
            return
    raise CronlockError(f"a replica exited before it was ready (status {await proc.wait()})")


async def _read(replica: int, proc: asyncio.subprocess.Process, queue: _Reports) -> None:
    """Forward one replica's reports (JSON lines) to *queue*; ``None`` at its end."""
    assert proc.stdout is not None
    try:
        async for raw in proc.stdout:
            try:
                report = json.loads(raw)
            except ValueError:
                continue  # not a report (a stray print); ignored
            if isinstance(report, dict):
                queue.put_nowait((replica, report))
    finally:
        queue.put_nowait((replica, None))


async def _show(args: argparse.Namespace, start: int, queue: _Reports) -> dict[float, _Slot]:
    """Print each slot once every replica reported it (or its reports are overdue)."""
    clock = SystemClock()
    slots = {float(start + k): _Slot() for k in range(args.duration)}
    lag = (args.replicas - 1) * args.skew
    running = args.replicas
    for when, slot in slots.items():
        deadline = when + lag + _REPORT_GRACE
        while slot.reported() < args.replicas and running:
            left = deadline - clock.now().timestamp()
            if left <= 0:
                break
            try:
                replica, report = await asyncio.wait_for(queue.get(), left)
            except TimeoutError:
                break
            if report is None:
                running -= 1
                continue
            into = slots.get(float(report.get("slot", -1)))
            if into is None:
                continue
            if report.get("ran"):
                into.ran.append(replica)
            else:
                into.skipped[replica] = str(report.get("skipped", "?"))
        print(_line(when, slot, args.replicas), flush=True)
    return slots


def _line(when: float, slot: _Slot, replicas: int) -> str:
    label = datetime.fromtimestamp(when, UTC).strftime("%H:%M:%S")
    ran = ", ".join(f"replica-{r}" for r in sorted(slot.ran))
    if not slot.ran:
        text = "MISSED"
    elif len(slot.ran) == 1:
        text = f"ran on {ran}"
    else:
        text = f"ran on {ran}  DUPLICATE x{len(slot.ran) - 1}"
    if slot.skipped:
        skips = sorted(slot.skipped.items())
        text += "  skipped: " + ", ".join(
            f"replica-{r} ({_REASONS.get(why, why)})" for r, why in skips
        )
    silent = [r for r in range(1, replicas + 1) if r not in slot.ran and r not in slot.skipped]
    if silent:
        text += "  no report: " + ", ".join(f"replica-{r}" for r in silent)
    return f"  {label}  {text}"


def _summary(
    args: argparse.Namespace, slots: dict[float, _Slot], procs: Sequence[asyncio.subprocess.Process]
) -> int:
    runs = sum(len(s.ran) for s in slots.values())
    duplicates = sum(max(len(s.ran) - 1, 0) for s in slots.values())
    missed = sum(1 for s in slots.values() if not s.ran)
    if duplicates and args.lock_only:
        print(
            "a lock alone let replicas whose clocks lag run a slot again after it was "
            "released; without --lock-only the run ledger skips them (already ran)"
        )
    print(f"slots {len(slots)}, runs {runs}, duplicates {duplicates}, missed {missed}")
    failed = [p.returncode for p in procs if p.returncode]
    if failed:
        print(f"cronlock: error: {len(failed)} replica(s) exited with an error", file=sys.stderr)
        return 1
    return 0 if duplicates == missed == 0 else 1


# -- one replica -----------------------------------------------------------------------------


def replica_main(argv: Sequence[str]) -> int:
    """``python -m cronlock _replica ...``: one replica of the demo; reports JSON lines."""
    parser = argparse.ArgumentParser(prog="cronlock _replica")
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--duration", type=int, required=True)
    parser.add_argument("--offset", type=float, default=0.0)
    parser.add_argument("--lockdir")
    parser.add_argument("--schema")
    parser.add_argument("--lock-only", action="store_true")
    parser.add_argument("--mode", default="session")
    args = parser.parse_args(argv)
    try:
        asyncio.run(_replica(args))
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: leave quietly
        return 130
    return 0


def _report(replica: int, slot: datetime, **what: object) -> None:
    print(json.dumps({"replica": replica, "slot": slot.timestamp(), **what}), flush=True)


async def _replica(args: argparse.Namespace) -> None:
    from .._events import Event, JobSkipped, LockFailed
    from .._locking.files import FileLocker
    from .._locking.protocols import Locker, Resource
    from .._records import RunContext
    from .._scheduler import Scheduler
    from .._schedules.interval import every
    from ..testing import OffsetClock

    locker: Locker
    if args.lockdir is None:
        from ..postgres import PostgresLocker

        # The parent created the ledger in its schema; --lock-only needs none.
        locker = PostgresLocker(
            os.environ[_DSN_ENV],
            mode=args.mode,
            ledger=not args.lock_only,
            schema=args.schema,
            create_table=False,
            application_name=f"cronlock-demo:replica-{args.id}",
        )
    else:
        locker = FileLocker(args.lockdir)

    async def tick(ctx: RunContext) -> None:
        _report(args.id, ctx.slot, ran=True)
        await asyncio.sleep(0.05)

    def skipped(event: Event) -> None:
        if isinstance(event, JobSkipped):
            _report(args.id, event.slot, skipped=event.reason)
        elif isinstance(event, LockFailed):
            _report(args.id, event.slot, skipped="lock_error")

    # Ready: the parent answers with the first slot (epoch seconds), the same for all.
    print(json.dumps({"ready": True}), flush=True)
    start = datetime.fromtimestamp(float(await asyncio.to_thread(sys.stdin.readline)), UTC)
    stop = start + timedelta(seconds=args.duration - 1)  # inclusive: `duration` slots
    clock = OffsetClock(args.offset)  # this replica's clock, args.offset seconds off
    # Fleet time would measure the skew against the server's clock and correct it: the
    # demo shows what host clocks that disagree do to a lock, so it reads them as they are.
    scheduler = Scheduler(locker=locker, clock=clock, fleet_clock=False)
    scheduler.subscribe(skipped, JobSkipped, LockFailed)
    scheduler.add_job(tick, every(1), name=JOB, start_at=start, stop_at=stop, misfire_grace=5)
    try:
        async with scheduler:
            await clock.sleep_until(stop + timedelta(seconds=1.5))
    finally:
        # The scheduler closes the locker it was given; this covers a failed start.
        if isinstance(locker, Resource) and not locker.closed:
            await locker.close()
