"""Keys the processes of a fleet share, kept in the ledger's ``<table>_secrets`` table.

The first process that needs a key makes it (32 random bytes) and every other one reads
the same row: ``INSERT ... ON CONFLICT DO NOTHING`` then ``SELECT``, so processes asking
at the same moment all end up with the one key that won. A key is never logged; anyone
who may read the ledger's tables may read it (they may pause and trigger jobs anyway).
"""

from __future__ import annotations

import secrets
from typing import Any

from .._sql.tables import LedgerTable
from .._sql.upkeep import make_secret_sql, read_secret_sql

__all__ = ("KEY_BYTES", "fleet_secret")

KEY_BYTES = 32


async def fleet_secret(conn: Any, table: LedgerTable, name: str) -> bytes:
    """The fleet's key *name*, made by the first caller (one read when it exists)."""
    select = read_secret_sql(table)
    value = await conn.fetchval(select, name)
    if value is None:
        # Two statements, not one: a statement's snapshot would not see the row a racing
        # process committed meanwhile, which is the one its ON CONFLICT kept.
        await conn.execute(make_secret_sql(table), name, secrets.token_bytes(KEY_BYTES))
        value = await conn.fetchval(select, name)
    return bytes(value)
