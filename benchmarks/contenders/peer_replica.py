"""One replica of the peers benchmark (benchmarks/peers.py), for any of its contenders.

    python peer_replica.py arq --replica 0 --ns bench_x --jobs 50 --first 1700000000 \
        --interval 1 --out r0.jsonl [--offset 0.15] [--dsn DSN] [--redis HOST:PORT]
    python peer_replica.py procrastinate --setup ...      # once, before the replicas
    python peer_replica.py arq --teardown ...             # once, after them

Runs in the contender's own virtualenv (only the standard library here; the contender's
module, ``p_<name>.py``, imports its library). Every one of the N jobs is due every
*interval* seconds (1: every second; 60: once a minute, at *first*'s second), each run's
slot as the library itself reports it (arq's unique job id, procrastinate's ``timestamp``,
APScheduler 4's ``scheduled_fire_time``, cronlock's ``RunContext.slot``). Each run appends
``{"j": job, "slot": epoch, "t": start}`` to *--out* at once; *start* is true time: with
``--offset S`` the driver runs this process under libfaketime S seconds ahead, so
``time.time()`` here reads S too far and S is taken off. Prints ``ready`` once the
scheduler or worker is started, and runs until SIGTERM or until its parent goes away.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from typing import IO, Any

from lifecycle import stop_when_told


class Recorder:
    """The replica's JSONL file: one line per run, written through as it happens."""

    def __init__(self, path: str, offset: float) -> None:
        self._file: IO[str] = open(path, "a", buffering=1)  # noqa: SIM115 (lives as we do)
        self._offset = offset

    def __call__(self, job: int, slot: float) -> None:
        start = time.time() - self._offset  # first thing: the run's start in true time
        self._file.write(json.dumps({"j": job, "slot": slot, "t": start}) + "\n")

    def close(self) -> None:
        self._file.close()


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("contender")
    parser.add_argument("--setup", action="store_true", help="create what the run needs")
    parser.add_argument("--teardown", action="store_true", help="remove what the run left")
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="127.0.0.1:6379")
    parser.add_argument("--ns", required=True, help="schema, queue or key prefix of this run")
    parser.add_argument("--replica", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--first", type=int, default=0, help="the first measured slot")
    parser.add_argument("--interval", type=int, default=1, choices=(1, 60))
    parser.add_argument("--offset", type=float, default=0.0, help="this host clock's skew")
    parser.add_argument("--out", default=os.devnull)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    return parser.parse_args()


async def main() -> int:
    opts = options()
    module: Any = importlib.import_module(f"p_{opts.contender}")
    if opts.setup:
        await module.setup(opts)
        return 0
    if opts.teardown:
        await module.teardown(opts)
        return 0
    faked = os.environ.get("FAKETIME") if "faketime" in os.environ.get("LD_PRELOAD", "") else None
    if float(faked or 0.0) != opts.offset:  # a start would be recorded off by the difference
        print(f"--offset={opts.offset} but FAKETIME={faked!r}", file=sys.stderr)
        return 2
    record = Recorder(opts.out, opts.offset)
    stop, watch = stop_when_told(opts.max_seconds, 0.5)

    def ready() -> None:
        print("ready", flush=True)

    try:
        await module.run(opts, record, ready, stop)
    finally:
        watch.cancel()
        record.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
