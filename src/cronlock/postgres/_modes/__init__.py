"""Where exclusion lives: the one place the coordination modes differ.

:class:`.base.Exclusion` is the seam; :mod:`.session`, :mod:`.lease` and :mod:`.bare`
implement it. This module is the only reader of a mode's name: :func:`exclusion_for`
chooses the implementation, :func:`checked_mode` checks the choice and :func:`source_for`
says where the connections come from. Nothing else asks which mode it is in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._durations import Seconds, to_seconds
from ..._errors import ConfigError
from .._conn.source import ConnectionSource

if TYPE_CHECKING:
    from .._conn.source import Keepalives
    from .._sql.tables import LedgerTable
    from .base import Ballot, Exclusion, Mode

__all__ = ("ballot_for", "checked_mode", "exclusion_for", "source_for")


def exclusion_for(mode: Mode, table: LedgerTable | None, *, holder: str, lease: float) -> Exclusion:
    """The exclusion of a locker of *mode* over *table* (``None``: ``ledger=False``)."""
    if table is None:
        from .bare import BareLocks

        return BareLocks()
    if mode == "lease":
        from .lease import LeaseRows

        return LeaseRows(table, holder=holder, lease=lease)
    from .session import SessionLocks

    return SessionLocks(table)


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
    if mode == "lease" and isinstance(pool_or_dsn, str):
        settings = dict((connect_kwargs or {}).get("server_settings") or {})
        settings.setdefault("application_name", application_name)
        connect_kwargs = {
            "statement_cache_size": 0,
            **(connect_kwargs or {}),
            "server_settings": settings,
        }
    return ConnectionSource(pool_or_dsn, connect_kwargs)
