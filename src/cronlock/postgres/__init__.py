"""PostgreSQL coordination: advisory locks for standalone runs and for the Scheduler.

Needs the ``postgres`` extra (asyncpg): ``pip install 'cronlock[postgres]'``. See
``docs/coordination.md`` for the rules these functions follow and why.
"""

from __future__ import annotations

try:
    import asyncpg  # noqa: F401  (fail here, with instructions, rather than deeper inside)
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cronlock.postgres needs asyncpg, which is not installed; "
        "install the extra with: pip install 'cronlock[postgres]'"
    ) from exc

from .._errors import LedgerNameError as LedgerNameError
from .._keys import job_lock_key as job_lock_key
from ._connections import Keepalives as Keepalives
from ._control import FleetControl as FleetControl
from ._elector import PostgresElector as PostgresElector
from ._lease import PostgresLease as PostgresLease
from ._ledger import DEFAULT_TABLE as DEFAULT_TABLE
from ._locked_run import RunLock as RunLock
from ._locked_run import locked_run as locked_run
from ._locked_run import run_locked as run_locked
from ._locker import PostgresLocker as PostgresLocker
from ._statistics import PostgresElectorStatistics as PostgresElectorStatistics
from ._statistics import PostgresLockerStatistics as PostgresLockerStatistics

__all__ = (
    "DEFAULT_TABLE",
    "FleetControl",
    "Keepalives",
    "LedgerNameError",
    "PostgresElector",
    "PostgresElectorStatistics",
    "PostgresLease",
    "PostgresLocker",
    "PostgresLockerStatistics",
    "RunLock",
    "job_lock_key",
    "locked_run",
    "run_locked",
)
