"""PostgreSQL coordination: advisory locks for standalone runs and for the Scheduler.

Needs the ``postgres`` extra (asyncpg): ``pip install -e '.[postgres]'`` from a clone,
``pip install 'cronlock[postgres]'`` once cronlock is on PyPI. See
``docs/coordination.md`` for the rules these functions follow and why. Names are loaded on
first use (PEP 562 ``__getattr__``); asyncpg is imported later still, by the first connect
(a pool handed over has imported it already).
"""

import importlib as _importlib
import importlib.util as _importlib_util
import warnings as _warnings
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

# Fail here, with instructions, rather than deeper inside (found, not imported: cheap).
if _importlib_util.find_spec("asyncpg") is None:  # pragma: no cover - only without the extra
    raise ImportError(
        "cronlock.postgres needs asyncpg, which is not installed; "
        "install the extra with: pip install 'cronlock[postgres]' (from a clone of the "
        "repository, until cronlock is on PyPI: pip install -e '.[postgres]')"
    )

if _TYPE_CHECKING:
    from .._errors import LedgerNameError as LedgerNameError
    from .._keys import job_lock_key as job_lock_key
    from .._keys import ledger_lock_key as ledger_lock_key
    from ._conn.source import Keepalives as Keepalives
    from ._elector import PostgresElector as PostgresElector
    from ._locked_run import RunLock as RunLock
    from ._locked_run import locked_run as locked_run
    from ._locked_run import run_locked as run_locked
    from ._locker.hold import PostgresHold as PostgresHold
    from ._locker.locker import PostgresLocker as PostgresLocker
    from ._ops.bulk import ScheduleChanges as ScheduleChanges
    from ._ops.control import FleetControl as FleetControl
    from ._ops.control import Triggered as Triggered
    from ._sql.tables import DEFAULT_TABLE as DEFAULT_TABLE
    from ._statistics import PostgresElectorStatistics as PostgresElectorStatistics
    from ._statistics import PostgresLockerStatistics as PostgresLockerStatistics

# Where each public name lives (its module is imported on first access).
_WHERE = {
    "LedgerNameError": ".._errors",
    "job_lock_key": ".._keys",
    "ledger_lock_key": ".._keys",
    "Keepalives": "._conn.source",
    "FleetControl": "._ops.control",
    "ScheduleChanges": "._ops.bulk",
    "Triggered": "._ops.control",
    "PostgresElector": "._elector",
    "PostgresHold": "._locker.hold",
    "DEFAULT_TABLE": "._sql.tables",
    "RunLock": "._locked_run",
    "locked_run": "._locked_run",
    "run_locked": "._locked_run",
    "PostgresLocker": "._locker.locker",
    "PostgresElectorStatistics": "._statistics",
    "PostgresLockerStatistics": "._statistics",
}

__all__ = (
    "DEFAULT_TABLE",
    "FleetControl",
    "Keepalives",
    "LedgerNameError",
    "PostgresElector",
    "PostgresElectorStatistics",
    "PostgresHold",
    "PostgresLocker",
    "PostgresLockerStatistics",
    "RunLock",
    "ScheduleChanges",
    "Triggered",
    "job_lock_key",
    "ledger_lock_key",
    "locked_run",
    "run_locked",
)


# Names of earlier releases, still importable (with a DeprecationWarning): a held lock was
# called a lease, the word lease mode's expiring rows now have to themselves.
_RENAMED = {"PostgresLease": "PostgresHold"}


def __getattr__(name: str) -> _Any:
    """Import the module defining *name* on first access, then keep the name here."""
    if name in _RENAMED:
        _warnings.warn(
            f"{__name__}.{name} is now {_RENAMED[name]}", DeprecationWarning, stacklevel=2
        )
        return __getattr__(_RENAMED[name])
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'cronlock.postgres' has no attribute {name!r}")
    value = getattr(_importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
