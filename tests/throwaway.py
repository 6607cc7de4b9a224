"""The suite's throwaway schemas and databases on a server it is given: their names, which
of them a run that died (killed, say) left behind, and making and dropping them."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Iterable
from typing import Literal

__all__ = ("drop", "left_by_dead_runs", "make", "prefix")

Kind = Literal["schema", "database"]
_LISTED = {
    "schema": "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)",
    "database": "SELECT datname FROM pg_database WHERE starts_with(datname, $1)",
}
_DROP = {
    "schema": 'DROP SCHEMA IF EXISTS "{}" CASCADE',
    "database": 'DROP DATABASE IF EXISTS "{}" WITH (FORCE)',
}
_CREATE = {"schema": 'CREATE SCHEMA "{}"', "database": 'CREATE DATABASE "{}" TEMPLATE template0'}


def prefix() -> str:
    """``cronlock_test_<host>_``: this host's throwaway names (the pid of their run follows)."""
    host = hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()
    return f"cronlock_test_{host}_"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def left_by_dead_runs(names: Iterable[str]) -> list[str]:
    """Those of *names* made on this host by a run whose process is gone."""
    mine = prefix()
    return [
        name
        for name in names
        if name.startswith(mine)
        and (pid := name[len(mine) :].partition("_")[0]).isdigit()
        and not _alive(int(pid))
    ]


async def make(dsn: str, kind: Kind, name: str) -> None:
    """Create the *kind* *name* on *dsn*'s server, first dropping those of its kind that
    dead runs of this host left."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(_LISTED[kind], prefix())
        for left in left_by_dead_runs(row[0] for row in rows):
            await conn.execute(_DROP[kind].format(left))
        await conn.execute(_CREATE[kind].format(name))
    finally:
        await conn.close()


async def drop(dsn: str, kind: Kind, *names: str) -> None:
    """Drop the *kind* *names* on *dsn*'s server, if they are there."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for name in names:
            await conn.execute(_DROP[kind].format(name))
    finally:
        await conn.close()
