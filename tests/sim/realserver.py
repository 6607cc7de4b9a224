"""What the agreement tests share: the real server's DSN, and a throwaway ledger on it."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from cronlock.postgres._sql.schema import ledger_ddl
from cronlock.postgres._sql.tables import LedgerTable

__all__ = ("server_dsn", "throwaway_ledger")


def server_dsn() -> str:
    """``CRONLOCK_TEST_DSN``: the real server the model is checked against (CI: required)."""
    dsn = os.environ.get("CRONLOCK_TEST_DSN")
    if not dsn:
        if os.environ.get("CI"):
            pytest.fail("CRONLOCK_TEST_DSN is not set", pytrace=False)
        pytest.skip("CRONLOCK_TEST_DSN is not set: the agreement tests need a real server")
    return dsn


@contextlib.asynccontextmanager
async def throwaway_ledger(
    prefix: str, *, sessions: int = 2, table: str = "runs"
) -> AsyncIterator[tuple[LedgerTable, list[Any]]]:
    """A ledger *table* in a schema of its own (``<prefix>_<random>``) on the real server,
    and *sessions* connections to it (their time zone UTC); the schema is dropped after."""
    dsn = server_dsn()
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    conns = [await asyncpg.connect(dsn, server_settings={"timezone": "UTC"})]
    try:
        conns += [
            await asyncpg.connect(dsn, server_settings={"timezone": "UTC"})
            for _ in range(sessions - 1)
        ]
        await conns[0].execute(f'CREATE SCHEMA "{schema}"')
        ledger = LedgerTable(table, schema=schema)
        for statement in ledger_ddl(ledger):
            await conns[0].execute(statement)
        yield ledger, conns
    finally:
        for conn in conns[1:]:
            await conn.close()
        await conns[0].execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conns[0].close()
