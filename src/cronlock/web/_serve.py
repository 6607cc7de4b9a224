"""``python -m cronlock web --dsn ... --port 8080``: the dashboard on its own, read-only.

It reads the ledger through a small pool it owns (closed when the server stops), so it
needs no scheduler in the process. Actions are never enabled here: to allow them, mount
:func:`cronlock.web.app` with an ``authorize`` callable in your own service.
"""

from __future__ import annotations

import argparse
import asyncio

import asyncpg
import uvicorn

from .._dsn import answered, connect_failure, target_of
from .._errors import CronlockError, LedgerUnreadable
from ..postgres._sql.tables import DEFAULT_TABLE
from ._app import app

__all__ = ("serve",)


def serve(args: argparse.Namespace) -> int:
    """Serve the dashboard until interrupted; errors are raised as :class:`CronlockError`."""
    if not 0 < args.port < 65536:
        raise CronlockError(f"--port must be 1 to 65535, got {args.port}")
    if not args.refresh > 0:
        raise CronlockError(f"--refresh must be a positive number of seconds, got {args.refresh}")
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    try:
        pool = await asyncpg.create_pool(
            args.dsn,
            min_size=1,
            max_size=4,
            timeout=10,
            statement_cache_size=0,  # it works through a transaction pooler too
            server_settings={"application_name": "cronlock-web"},
        )
    except Exception as exc:  # bad syntax, refused, auth, unknown database: one clear line
        # Never the DSN's password, which a parse error may quote (cronlock._dsn).
        reason = connect_failure(args.dsn, exc)
        source = args.dsn_source
        # A server or network's answer: exit status 3; a DSN asyncpg refused: 2 (usage).
        kind = LedgerUnreadable if target_of(args.dsn).clean and answered(exc) else CronlockError
        raise kind(f"cannot connect to PostgreSQL with {source}: {reason}") from None
    try:
        dashboard = app(
            pool, table=args.table or DEFAULT_TABLE, schema=args.schema, refresh=args.refresh
        )
        config = uvicorn.Config(
            dashboard, host=args.host, port=args.port, lifespan="off", log_level="warning"
        )
        server = uvicorn.Server(config)
        print(
            f"cronlock dashboard (read-only) on http://{args.host}:{args.port}/ ; Ctrl-C stops",
            flush=True,
        )
        await server.serve()
    finally:
        await pool.close()
    return 0
