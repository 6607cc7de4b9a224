"""Where the dashboard's connections come from: the service's pool, or a DSN, bounded.

Given a pool, a request borrows one of its connections (the pool's ``max_size`` bounds
them). Given a DSN, a request opens a connection of its own and closes it after, but at
most *max_connections* are open at once, whatever the number of requests: the others wait
for one (up to :data:`WAIT` seconds, then the page says the database is unavailable), so
a burst of anonymous requests cannot exhaust the server's ``max_connections``. An action
counts as one of them while it runs (FleetControl opens its own connection from a DSN).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

from starlette.exceptions import HTTPException

from .._errors import LockError
from ..postgres._conn.errors import backend_errors, ledger_missing
from ..postgres._conn.source import ConnectionSource
from ..postgres._sql.tables import LedgerTable

__all__ = ("APPLICATION_NAME", "WAIT", "Source", "Unavailable")

_logger = logging.getLogger("cronlock.web")

APPLICATION_NAME = "cronlock-web"
"""The ``application_name`` of the connections opened from a DSN that names none."""
WAIT = 10.0
"""Seconds a request waits for a connection (a free slot, then the connect) at most."""


class Unavailable(Exception):
    """The database could not be read; the page says so, without the details."""


class Source:
    """The dashboard's database: *source* a pool or a DSN (then at most *bound* at once)."""

    def __init__(self, source: Any, table: LedgerTable, bound: int) -> None:
        self.source = source
        self.table = table
        self._slots = asyncio.Semaphore(bound)
        self._settings: dict[str, str] = {}
        if isinstance(source, str) and "application_name" not in parse_qs(urlsplit(source).query):
            self._settings["application_name"] = APPLICATION_NAME
        # No named prepared statements from a DSN: it works through a transaction pooler.
        self._lender = ConnectionSource(
            source,
            {"statement_cache_size": 0, "server_settings": self._settings or None}
            if isinstance(source, str)
            else None,
        )

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of the *bound* connections a DSN may have open (nothing for a pool)."""
        if not isinstance(self.source, str):
            yield
            return
        try:
            await asyncio.wait_for(self._slots.acquire(), WAIT)
        except TimeoutError as exc:
            _logger.warning("dashboard: no free database connection in %.0f s", WAIT)
            raise Unavailable from exc
        try:
            yield
        finally:
            self._slots.release()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection for one request's reads; database errors become a 503."""
        try:
            async with self.slot():
                with backend_errors("dashboard: the database could not be read"):
                    async with self._lender.lend(timeout=WAIT, keep_on_server_error=True) as conn:
                        yield conn
        except LockError as exc:
            if ledger_missing(exc):
                raise HTTPException(
                    503,
                    f"no current run ledger {self.table.runs} here: start a replica, or run "
                    "'python -m cronlock migrate --dsn ...' to create or upgrade it",
                ) from exc
            # Logged for the operator (never with a DSN's password); the page never shows
            # it (it may name hosts or users).
            _logger.warning("%s", exc)
            raise Unavailable from exc
