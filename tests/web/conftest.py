"""The dashboard's tests: a real PostgreSQL (the coordination tests' fixtures) and a
ledger seeded through the ledger's own statements.

The modules of this folder that share one costly thing at module scope (a browser with a
fleet of replicas, a seeded ledger, a server) are each an ``xdist_group``: under ``pytest
-n N --dist loadgroup`` one worker runs all of a module's tests, so it is made once, not
once per worker (tests/conftest.py makes the groups work on pytest 9.2).
"""

from __future__ import annotations

from ..postgres.conftest import pg_dsn as pg_dsn
from ..postgres.conftest import pg_server as pg_server

__all__ = ("pg_dsn", "pg_server")
