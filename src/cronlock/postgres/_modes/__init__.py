"""Where exclusion lives: the one place the coordination modes differ.

:class:`.base.Exclusion` is the seam; :mod:`.session`, :mod:`.lease` and :mod:`.bare`
implement it. This module is the only reader of a mode's name: :func:`exclusion_for`
chooses the implementation, :func:`checked_mode` checks the choice and :func:`source_for`
says where the connections come from. Nothing else asks which mode it is in.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._durations import Seconds, to_seconds
from ..._errors import ConfigError, PoolerDetected
from ..._logs import get_logger
from .._conn.source import ConnectionSource, Connector

if TYPE_CHECKING:
    from .._conn.source import Keepalives
    from .._sql.tables import LedgerTable
    from .base import Ballot, Exclusion, Mode

_logger = get_logger("cronlock.postgres")

__all__ = (
    "ballot_for",
    "check_pool_room",
    "checked_mode",
    "exclusion_for",
    "mode_through",
    "source_for",
)


def exclusion_for(
    mode: Mode, table: LedgerTable, *, ledger: bool, holder: str, lease: float
) -> Exclusion:
    """The exclusion of a locker of *mode* over *table*; without a *ledger*, the lock alone
    (the table then only names nothing: no statement touches it)."""
    if not ledger:
        from .bare import BareLocks

        return BareLocks()
    if mode == "lease":
        from .lease import LeaseRows

        return LeaseRows(table, holder=holder, lease=lease)
    from .session import SessionLocks

    return SessionLocks(table, holder=holder)


def mode_through(asked: str | None, pooler: str | None) -> tuple[Mode, str]:
    """The mode of connections that a pooler test (:func:`.session.pooler_seen`) answered
    *pooler* for, and what it excludes with (``"advisory locks"``, ``"leases"``): *asked*,
    else lease mode through a pooler and session mode on a server's own backend. Raises
    :class:`~cronlock.PoolerDetected` for session mode asked for through a pooler."""
    if asked is None:
        asked = "session" if pooler is None else "lease"
    if asked not in ("session", "lease"):
        raise ConfigError(f"mode must be 'session' or 'lease', got {asked!r}")
    if asked == "lease":
        return "lease", "leases"
    if pooler is not None:
        raise PoolerDetected(
            f"a connection pooler or proxy sits between this DSN and PostgreSQL ({pooler}): "
            "session advisory locks cannot work through it; use lease mode, or connect "
            "to the server directly"
        )
    return "session", "advisory locks"


def ballot_for(
    mode: Mode,
    name: str,
    *,
    beat: float,
    lease: float,
    takeover: float | None,
    idle_session_timeout: float,
    keepalives: Keepalives,
    application_name: str,
    table: str,
    schema: str | None,
) -> Ballot:
    """The ballot of a PostgresElector of *mode* for election *name* (settings checked)."""
    if mode not in ("session", "lease"):
        raise ConfigError(f"PostgresElector: mode must be 'session' or 'lease', not {mode!r}")
    if mode == "lease":
        from .lease import LeaseBallot

        return LeaseBallot(
            name,
            table=table,
            schema=schema,
            holder=application_name,
            beat=beat,
            lease=lease,
            takeover=takeover,
        )
    from .session import SessionBallot

    return SessionBallot(
        name,
        idle_session_timeout=idle_session_timeout,
        application_name=application_name,
        keepalives=keepalives,
        beat=beat,
        lease=lease,
        takeover=takeover,
    )


def checked_mode(mode: object, *, ledger: bool, lease: Seconds) -> float:
    """Check a locker's *mode* and its *lease*; return the lease in seconds."""
    if mode not in ("session", "lease"):
        raise ConfigError(f"PostgresLocker: mode must be 'session' or 'lease', got {mode!r}")
    if mode == "lease" and not ledger:
        raise ConfigError(
            "PostgresLocker: mode='lease' keeps its leases in the run ledger, so it needs "
            "ledger=True (got ledger=False)"
        )
    seconds = to_seconds(lease, field="lease", error=ConfigError)
    if seconds < 1.0:
        raise ConfigError(f"PostgresLocker: lease must be at least 1 second, got {lease!r}")
    return seconds


def source_for(
    mode: Mode,
    pool_or_dsn: Any,
    connect_kwargs: Mapping[str, Any] | None,
    application_name: str,
) -> ConnectionSource:
    """Where a locker or elector of *mode* gets its connections.

    A lease-mode connection of our own (given a DSN) has nothing set on it after connecting
    (a pooler would hand the setting on to other clients): its name is a startup parameter,
    which poolers accept, and asyncpg keeps no named prepared statements (which a
    transaction pooler cannot route), unless *connect_kwargs* say otherwise.
    """
    if mode == "lease" and isinstance(pool_or_dsn, str | Connector):
        settings = dict((connect_kwargs or {}).get("server_settings") or {})
        settings.setdefault("application_name", application_name)
        connect_kwargs = {
            "statement_cache_size": 0,
            **(connect_kwargs or {}),
            "server_settings": settings,
        }
    return ConnectionSource(pool_or_dsn, connect_kwargs)


def check_pool_room(pool: Any, *, mode: Mode, sessions: int) -> None:
    """Refuse, or warn about, an asyncpg *pool* too small for the locker and its owner.

    The pool is the application's too. In session mode the locker borrows up to
    *sessions* of its connections, for its lifetime: a pool of ``max_size <= sessions``
    could be left with none for the application (whose ``acquire()`` then waits forever,
    or until its timeout), so it raises :class:`cronlock.ConfigError`. In lease mode it
    borrows one per statement (a claim, a renewal every ``lease / 4``, upkeep), and gives it
    back: a pool of one connection is shared by turns, and a statement that waits for it
    longer than ``connect_timeout`` fails (a renewal that fails cancels the runs in
    flight), so it logs a WARNING. Anything but an asyncpg pool is not looked at.
    """
    asyncpg = sys.modules.get("asyncpg")  # whoever made a pool imported it
    if asyncpg is None or not isinstance(pool, asyncpg.Pool):
        return
    size: int = pool.get_max_size()
    if mode == "session" and sessions >= size:
        fewer = f", pass sessions={size - 1} or fewer" if size > 1 else ""
        raise ConfigError(
            f"PostgresLocker: the asyncpg pool has max_size={size}, and mode='session' "
            f"borrows up to sessions={sessions} of its connections for the locker's "
            f"lifetime, which could leave none for the application; create the pool with "
            f"max_size={sessions + 1} or more{fewer}, or pass a DSN so that the locker "
            "opens connections of its own"
        )
    if mode == "lease" and size < 2:
        _logger.warning(
            "PostgresLocker: the asyncpg pool has max_size=%d, and mode='lease' borrows a "
            "connection of it for each statement (claims, renewals, upkeep), so the locker "
            "and the application take turns on it; a statement that waits longer than "
            "connect_timeout for it fails, and a failed renewal cancels the runs in flight. "
            "Create the pool with max_size=2 or more, or pass a DSN so that the locker "
            "keeps a connection of its own",
            size,
        )
