"""A standalone run's claim of one slot in the run ledger: ``locked_run(..., slot=...)``.

The claim and the end are the ledger's own statements (:func:`claim_many_sql`,
:func:`finish_many_sql`) with arrays of one element, so that a script and a
:class:`PostgresLocker` on the same ledger agree on what "claimed" means, on the lock key
and on how a cancelled claim is given back: one rule, one place.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .._errors import ConfigError
from .._locking.protocols import Refusal
from ._sql.claims import claim_many_sql, finish_many_sql
from ._sql.tables import LedgerTable, migrate

__all__ = ("SlotClaim", "to_slot")


def to_slot(slot: object, name: str) -> datetime:
    """*slot* as an aware UTC datetime; a naive one or a non-datetime is refused."""
    if not isinstance(slot, datetime) or slot.utcoffset() is None:
        raise ConfigError(
            f"job {name!r}: slot must be an aware datetime (the instant the run stands for, "
            f"e.g. datetime.now(UTC).replace(second=0, microsecond=0)), got {slot!r}"
        )
    return slot.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """Job *name*'s claim of *slot* in *table*, taken and ended on one connection."""

    table: LedgerTable
    name: str
    slot: datetime
    create_table: bool

    @property
    def key(self) -> int:
        """The job's lock key in the ledger's namespace: the one a PostgresLocker takes."""
        return self.table.lock_key(self.name)

    async def claim(self, conn: Any) -> Refusal | None:
        """Lock and claim the slot; ``None`` when claimed (the lock is then held), else why
        not: ``"already_ran"`` (claimed before, by anyone, finished or not), ``"paused"``
        (paused fleet-wide) or ``"locked"`` (another session holds the job's lock)."""
        if self.create_table:
            await migrate(conn, self.table)
        row = await conn.fetchrow(
            claim_many_sql(self.table),
            [self.key],
            [self.name],
            [self.slot],
            socket.gethostname(),
            os.getpid(),
        )
        if row["started_at"] is not None:
            return None
        if row["paused"]:
            return "paused"
        if row["ran"] or row["got"]:  # got, but the insert conflicted: unlocked already
            return "already_ran"
        return "locked"

    async def end(self, conn: Any, *, outcome: str | None, error: str | None, undo: bool) -> bool:
        """Record *outcome* (or, with *undo*, delete the claim) and unlock, in one
        statement; whether the lock was still held."""
        row = await conn.fetchrow(
            finish_many_sql(self.table),
            [self.name],
            [self.slot],
            [outcome],
            [error],
            [self.key],
            [undo],
            socket.gethostname(),
            os.getpid(),
            [None],  # the body began as the claim was taken: the claim's start stands
        )
        return bool(row["released"])
