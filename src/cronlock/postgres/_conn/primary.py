"""A server that cannot take writes is not the primary: a replica must not coordinate there.

A hot standby answers reads and takes session advisory locks, but they are its own: a
replica connected to a standby would exclude only the replicas on that same standby, and
its claims fail (SQLSTATE 25006, ``read_only_sql_transaction``). A DSN without
``target_session_attrs=read-write`` lands there whenever the host it names first is a
standby: a cluster's hosts listed in a fixed order after a failover, a reader endpoint.
So every connection a locker or an elector sets up is looked at once
(:func:`refuse_read_only`, part of each mode's set-up, :mod:`.._modes`), and a statement
answered 25006 later (the server was made read-only meanwhile) is the same news
(:func:`read_only`): the connection is dropped, and it is said once, with the fix, then
retried with the usual backoff (:mod:`.backoff`), never logged per slot.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..._errors import LockError
from .._sql.failover import SERVER_SQL
from .._sql.sessions import READ_ONLY_SQL

__all__ = ("FIX", "NotPrimary", "Server", "read_only", "refuse_read_only", "server_of")

FIX = (
    "session locks and the run ledger need the primary: list the cluster's hosts in the "
    "DSN with target_session_attrs=read-write "
    "(postgresql://host1,host2/db?target_session_attrs=read-write), or connect through an "
    "endpoint that always leads to the primary (docs/guides/failover.md)"
)
"""What to do about it, said with every :class:`NotPrimary`."""

READ_ONLY_SQLSTATE = "25006"


class NotPrimary(LockError):
    """The server is read-only (a standby, or transactions read-only): not the primary."""


async def refuse_read_only(conn: Any) -> None:
    """Raise :class:`NotPrimary` unless *conn*'s server takes writes (one round trip)."""
    row = await conn.fetchrow(READ_ONLY_SQL)
    if row["recovery"]:
        raise NotPrimary(f"the server is a standby (in recovery), not the primary; {FIX}")
    if row["read_only"]:
        raise NotPrimary(
            f"the server's transactions are read-only (default_transaction_read_only is "
            f"on): it takes no writes; {FIX}"
        )


def read_only(exc: BaseException) -> bool:
    """Whether *exc* (or its cause) is the server refusing a write: SQLSTATE 25006."""
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is None:
        return False
    refused = asyncpg.ReadOnlySQLTransactionError
    return isinstance(exc, refused) or isinstance(exc.__cause__, refused)


@dataclass(frozen=True, slots=True)
class Server:
    """Which server a connection reached (:func:`server_of`)."""

    identity: str
    """``"<system identifier>/<timeline>"``: a promoted standby keeps the system identifier
    and starts a new timeline; another cluster has another system."""
    started: datetime | None
    """When its postmaster started: the same server restarted (onto a restored snapshot,
    maybe) has the same identity and another start."""

    def __str__(self) -> str:
        return self.identity


async def server_of(conn: Any) -> Server | None:
    """Which server *conn* is on (one round trip), or ``None`` when the server will not say
    (a role that may not read it, a server without WAL functions): a primary that changed
    is then not noticed. A connection that fails meanwhile raises as any statement of a
    set-up does."""
    import asyncpg  # loaded already: the connection came from it

    try:
        row = await conn.fetchrow(SERVER_SQL)
    except asyncpg.PostgresError:
        return None
    if row["timeline"] is None:
        return None
    return Server(f"{row['system'] or '?'}/{int(row['timeline'], 16)}", row["started"])
