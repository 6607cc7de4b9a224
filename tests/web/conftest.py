"""The dashboard's tests: a real PostgreSQL (the coordination tests' fixtures) and a
ledger seeded through the ledger's own statements."""

from __future__ import annotations

from ..postgres.conftest import pg_dsn as pg_dsn
from ..postgres.conftest import pg_server as pg_server

__all__ = ("pg_dsn", "pg_server")
