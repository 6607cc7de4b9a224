"""A replica process for the election tests: one PostgresElector, JSON lines out.

Run as ``python elector_replica.py --dsn DSN --name ELECTION --id N``. It samples
``is_leader()`` every ``--sample`` seconds and prints each transition:

- ``{"event": "leader", "id": N, "t": T}``: leading since at most *T* (``time.time()`` of
  the last sample that still said follower: the interval is widened, never narrowed);
- ``{"event": "follower", "id": N, "t": T}``: no longer leading at *T* (first such sample);
- ``{"event": "demoted", "id": N, "t": T, "reason": ...}``: an ``on_demoted`` callback.

SIGTERM closes the elector cleanly and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time

from cronlock.postgres import PostgresElector


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--sample", type=float, default=0.01)
    parser.add_argument("--mode", choices=("session", "lease"), default="session")
    parser.add_argument("--schema")
    args = parser.parse_args()

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    elector = PostgresElector(
        args.dsn,
        name=args.name,
        poll_interval=args.poll,
        application_name=f"cronlock-test-elector-{args.id}",
        mode=args.mode,
        schema=args.schema,
    )
    elector.on_demoted(
        lambda reason: emit(event="demoted", id=args.id, t=time.time(), reason=str(reason))
    )
    async with elector:
        emit(event="ready", id=args.id, t=time.time())
        leading = False
        last_follower_sample = time.time()
        while not stop.is_set():
            now_leading = await elector.is_leader()
            now = time.time()
            if now_leading and not leading:
                emit(event="leader", id=args.id, t=last_follower_sample, seen=now)
            elif leading and not now_leading:
                emit(event="follower", id=args.id, t=now)
            leading = now_leading
            if not leading:
                last_follower_sample = now
            await asyncio.sleep(args.sample)
        if leading:
            # Closing demotes before it frees the lock: the interval ends here at the latest.
            await elector.close()
            emit(event="follower", id=args.id, t=time.time())
    emit(event="closed", id=args.id, t=time.time(), stats=str(elector.statistics()))


if __name__ == "__main__":
    asyncio.run(main())
