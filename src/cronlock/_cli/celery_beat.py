"""``python -m cronlock celery-beat -A proj``: a Celery app's beat schedule, sent from this
replica and coordinated with the others through the run ledger, without Celery's beat
process around it (cronlock.celery.run_beat on an event loop of its own)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from .._errors import CronlockError

__all__ = ("add_celery_parser", "run_celery_beat")


def add_celery_parser(verbs: Any) -> None:
    beat = verbs.add_parser(
        "celery-beat",
        help="send a Celery app's beat_schedule, once per slot across all replicas",
        description=(
            "Send the Celery app's beat_schedule from this replica, as many replicas as you "
            "like: the run ledger lets one of them send each slot's task. Settings come "
            "from the app's cronlock_* configuration; the options below override them."
        ),
    )
    beat.add_argument("-A", "--app", required=True, help="the Celery app, e.g. proj or proj:app")
    beat.add_argument("--dsn", help="PostgreSQL DSN (default: cronlock_dsn, then $CRONLOCK_DSN)")
    beat.add_argument("--mode", choices=("session", "lease"), help="default: cronlock_mode")
    beat.add_argument("--ledger", help="the ledger's table (default: cronlock_ledger)")
    beat.add_argument("--schema", help="the ledger's schema (default: cronlock_schema)")
    beat.add_argument("-l", "--loglevel", default="INFO", help="logging level (default: INFO)")


def _load_app(name: str) -> Any:
    try:
        from celery.app.utils import find_app
    except ImportError:
        raise CronlockError("celery-beat needs celery: pip install 'cronlock[celery]'") from None
    sys.path.insert(0, "")  # as `celery -A` does: the app's module from the working directory
    try:
        app = find_app(name)
    except Exception as exc:
        raise CronlockError(f"-A {name}: cannot load the Celery app: {exc}") from None
    # As Celery's beat does before it starts: the app's task modules, then the app.
    app.loader.init_worker()
    app.finalize()
    return app


def run_celery_beat(args: argparse.Namespace) -> int:
    level = getattr(logging, str(args.loglevel).upper(), None)
    if not isinstance(level, int):
        raise CronlockError(f"--loglevel: unknown level {args.loglevel!r}")
    logging.basicConfig(
        level=level, format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s", stream=sys.stderr
    )
    app = _load_app(args.app)
    from ..celery import BeatSettings, run_beat

    settings = BeatSettings.from_app(
        app, dsn=args.dsn, mode=args.mode, ledger=args.ledger, schema=args.schema
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await run_beat(app, settings, stop=stop)

    asyncio.run(main())
    return 0
