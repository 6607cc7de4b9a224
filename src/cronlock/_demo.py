"""``python -m cronlock demo``: several replica processes, one job, each slot run once."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from typing import Any

from ._clock import SystemClock
from ._errors import CronlockError

__all__ = ("add_demo_parser", "replica_main", "run_demo")

JOB = "cronlock-demo-tick"
# Replicas need a moment to import and start; the first slot is this far ahead.
_BOOT_SECONDS = 3


def add_demo_parser(verbs: Any) -> None:
    """Register the ``demo`` verb (its replicas run through :func:`replica_main`)."""
    demo = verbs.add_parser(
        "demo", help="run N replica processes of one every-second job and count duplicates"
    )
    demo.add_argument("--replicas", type=int, default=3, help="processes (default: 3)")
    demo.add_argument("--duration", type=int, default=10, help="seconds (default: 10)")
    demo.add_argument("--dsn", help="coordinate through PostgreSQL (default: a FileLocker)")
    demo.add_argument(
        "--lock-only",
        action="store_true",
        help="with --dsn: advisory locks without the run ledger (can run a slot twice)",
    )


def replica_main(argv: list[str]) -> int:
    """``python -m cronlock _replica ...``: one replica of the demo (not a public verb)."""
    replica = argparse.ArgumentParser(prog="cronlock _replica")
    replica.add_argument("--id", type=int, required=True)
    replica.add_argument("--start", type=float, required=True)
    replica.add_argument("--duration", type=int, required=True)
    replica.add_argument("--lockdir")
    replica.add_argument("--dsn")
    replica.add_argument("--lock-only", action="store_true")
    asyncio.run(_replica(replica.parse_args(argv)))
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """Run ``demo``: the parent, which starts ``_replica`` children."""
    if not 1 <= args.replicas <= 32:
        raise CronlockError(f"--replicas must be between 1 and 32, got {args.replicas}")
    if not 1 <= args.duration <= 3600:
        raise CronlockError(f"--duration must be between 1 and 3600, got {args.duration}")
    if args.lock_only and not args.dsn:
        raise CronlockError("--lock-only needs --dsn")
    if args.dsn:
        asyncio.run(_check_dsn(args.dsn))
    with tempfile.TemporaryDirectory(prefix="cronlock-demo-") as lockdir:
        return _parent(args, lockdir)


async def _check_dsn(dsn: str) -> None:
    try:
        import asyncpg
    except ImportError:
        raise CronlockError("--dsn needs asyncpg: pip install 'cronlock[postgres]'") from None
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CronlockError(f"cannot connect to PostgreSQL with --dsn: {reason}") from None
    await conn.close()


def _parent(args: argparse.Namespace, lockdir: str) -> int:
    start = math.ceil(SystemClock().now().timestamp()) + _BOOT_SECONDS
    backend = f"FileLocker in {lockdir}"
    if args.dsn:
        backend = "PostgreSQL advisory locks" + ("" if args.lock_only else " and run ledger")
    print(f"{args.replicas} replicas, job {JOB!r} every second for {args.duration}s, {backend}")
    procs = []
    for i in range(1, args.replicas + 1):
        cmd = [
            sys.executable,
            "-m",
            "cronlock",
            "_replica",
            "--id",
            str(i),
            "--start",
            str(start),
            "--duration",
            str(args.duration),
        ]
        cmd += ["--dsn", args.dsn] if args.dsn else ["--lockdir", lockdir]
        cmd += ["--lock-only"] if args.lock_only else []
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
        )
    runs: dict[float, list[int]] = {}
    for proc in procs:
        out, _ = proc.communicate()
        for line in out.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            runs.setdefault(record["slot"], []).append(record["replica"])
    expected = [start + k for k in range(args.duration)]
    duplicates = missed = 0
    for slot in expected:
        who = sorted(runs.get(slot, []))
        label = datetime.fromtimestamp(slot, UTC).strftime("%H:%M:%S")
        if not who:
            missed += 1
            print(f"  {label} UTC  MISSED")
        elif len(who) > 1:
            duplicates += len(who) - 1
            print(f"  {label} UTC  DUPLICATE: replicas {', '.join(map(str, who))}")
        else:
            print(f"  {label} UTC  replica {who[0]}")
    total = sum(len(v) for v in runs.values())
    print(f"slots {len(expected)}, runs {total}, duplicates {duplicates}, missed {missed}")
    failed = [p.returncode for p in procs if p.returncode]
    if failed:
        print(f"cronlock: error: {len(failed)} replica(s) exited with an error", file=sys.stderr)
        return 1
    return 0 if duplicates == missed == 0 else 1


async def _replica(args: argparse.Namespace) -> None:
    from ._filelock import FileLocker
    from ._interval import every
    from ._locking import Locker
    from ._records import RunContext
    from ._scheduler import Scheduler

    start = datetime.fromtimestamp(args.start, UTC)
    stop = start + timedelta(seconds=args.duration - 1)  # inclusive: `duration` slots
    locker: Locker
    if args.dsn:
        from .postgres import PostgresLocker

        # The ledger (default) creates its table on first use; --lock-only needs none.
        locker = PostgresLocker(args.dsn, ledger=not args.lock_only)
    else:
        locker = FileLocker(args.lockdir)

    async def tick(ctx: RunContext) -> None:
        print(json.dumps({"replica": args.id, "slot": ctx.slot.timestamp()}), flush=True)
        await asyncio.sleep(0.05)

    clock = SystemClock()
    scheduler = Scheduler(locker=locker, clock=clock)
    scheduler.add_job(tick, every(1), name=JOB, start_at=start, stop_at=stop, misfire_grace=5)
    async with scheduler:
        await clock.sleep_until(stop + timedelta(seconds=1.5))
    close = getattr(locker, "close", None)
    if close is not None:
        await close()
