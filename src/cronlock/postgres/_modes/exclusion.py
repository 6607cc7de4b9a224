"""The one seam between the two coordination modes: where a locker's exclusion lives.

Everything else of the backend (the ledger's schema and reads, batching, upkeep, fleet
control and views) is shared. What differs is here:

- **Session locks** (``mode="session"``, the seed's recipe): a session advisory lock on a
  dedicated connection says who runs a job; the server releases it the moment the session
  dies, so a dropped session loses the leases on it, and a crashed run is an unfinished row
  whose claiming backend is gone from ``pg_stat_activity``.
- **Lease rows** (``mode="lease"``): a row of the leases table whose expiry, in the server's
  time, is in the future says who runs a job (:mod:`._leasesql`). No statement depends on
  its session, so a dropped connection loses nothing; a holder that cannot renew in time
  ends its run (:mod:`._renewal`), and a crashed run is an unfinished row whose lease
  expired.

Each form gives the statements of its mode and the extra arguments they take, so callers
send ``sql, *base, *form.extra`` without asking which mode they are in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..._durations import Seconds, to_seconds
from ..._errors import ConfigError
from .._conn.borrowed import PooledStatements
from .._conn.dedicated import LockSession
from .._conn.source import ConnectionSource, Keepalives
from .._locker.crashes import crashed_sql, recover_sql
from .._sql.claims import claim_many_sql, finish_many_sql
from .._sql.leases import (
    lease_claim_many_sql,
    lease_crashed_sql,
    lease_finish_many_sql,
    lease_late_finish_sql,
    lease_recover_sql,
)
from .._sql.tables import LedgerTable

__all__ = (
    "Exclusion",
    "Mode",
    "checked_mode",
    "exclusion_for",
    "lease_rows",
    "make_sessions",
    "session_locks",
    "source_for",
)

Mode = Literal["session", "lease"]
"""``PostgresLocker(mode=...)``: where exclusion lives (see :mod:`._exclusion`)."""


@dataclass(frozen=True, slots=True)
class Exclusion:
    """The statements of one mode over one ledger, and what sets the modes apart."""

    mode: Mode
    session_bound: bool
    """Whether leases live in the session they were granted on (lost when it drops)."""
    claim_sql: str
    """Claims of many slots: ``$1``-``$5`` (keys, jobs, slots, host, pid), then :attr:`extra`."""
    finish_sql: str
    """Ends of many runs: ``$1``-``$9``, then :attr:`holder_args`."""
    recover_sql: str
    """The rerun of one crashed run: ``$1``-``$5``, then :attr:`extra`."""
    crashed_sql: str
    """Mark crashed runs: ``$1`` host, ``$2`` pid, then :attr:`holder_args`."""
    late_finish_sql: str
    """Late outcomes: ``$1``-``$9``, then :attr:`holder_args`."""
    extra: tuple[object, ...] = ()
    """Lease mode: (holder, lease seconds); session mode: nothing."""
    table: LedgerTable | None = None
    """The ledger these statements use."""
    lease: float = 0.0
    """Lease mode: seconds a lease lasts on the server (session mode: 0)."""

    @property
    def holder_args(self) -> tuple[object, ...]:
        """The holder alone, for statements that take no lease seconds."""
        return self.extra[:1]


def session_locks(table: LedgerTable) -> Exclusion:
    """Session advisory locks over *table* (``mode="session"``)."""
    return Exclusion(
        mode="session",
        session_bound=True,
        claim_sql=claim_many_sql(table),
        finish_sql=finish_many_sql(table),
        recover_sql=recover_sql(table),
        crashed_sql=crashed_sql(table),
        late_finish_sql=table.late_finish_sql,
        table=table,
    )


def lease_rows(table: LedgerTable, *, holder: str, lease: float) -> Exclusion:
    """Lease rows over *table* (``mode="lease"``), held as *holder* for *lease* seconds."""
    return Exclusion(
        mode="lease",
        session_bound=False,
        claim_sql=lease_claim_many_sql(table),
        finish_sql=lease_finish_many_sql(table),
        recover_sql=lease_recover_sql(table),
        crashed_sql=lease_crashed_sql(table),
        late_finish_sql=lease_late_finish_sql(table),
        extra=(holder, lease),
        table=table,
        lease=lease,
    )


def exclusion_for(
    mode: Mode, table: LedgerTable | None, *, holder: str, lease: float
) -> Exclusion | None:
    """The exclusion of a locker of *mode* over *table*; ``None`` without a ledger."""
    if table is None:
        return None
    return (
        lease_rows(table, holder=holder, lease=lease) if mode == "lease" else session_locks(table)
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
    """Where a locker of *mode* gets its connections.

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


def make_sessions(
    mode: Mode,
    source: ConnectionSource,
    table: LedgerTable | None,
    *,
    sessions: int,
    create_table: bool,
    connect_timeout: float,
    statement_timeout: float,
    application_name: str,
    keepalives: Keepalives | None,
    on_open: Callable[[], None],
    on_drop: Callable[[int, str], None],
) -> tuple[LockSession, ...]:
    """A locker's shards. Session mode: *sessions* dedicated sessions, a job's lock on
    ``key % sessions``. Lease mode needs no session: one connection of ours given a DSN
    (kept, so a statement costs one round trip), or none given a pool (each statement
    borrows one for itself)."""
    if mode == "lease" and source.pooled:
        assert table is not None
        return (
            PooledStatements(
                source,
                table=table,
                create_table=create_table,
                connect_timeout=connect_timeout,
                statement_timeout=statement_timeout,
                on_open=on_open,
            ),
        )
    return tuple(
        LockSession(
            source,
            table=table,
            create_table=create_table,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            application_name=application_name,
            keepalives=keepalives,
            on_open=on_open,
            on_drop=functools.partial(on_drop, shard),
            session_locks=mode == "session",
        )
        for shard in range(1 if mode == "lease" else sessions)
    )
