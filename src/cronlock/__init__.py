"""cronlock: an asyncio scheduler that runs each scheduled slot exactly once across replicas.

The package only re-exports; the implementation lives in private modules. Names are
loaded on first use (PEP 562 ``__getattr__``), so ``import cronlock`` costs little and a
service pays only for what it uses: croniter, for one, only with a cron schedule.
"""

import importlib as _importlib
import warnings as _warnings
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

if _TYPE_CHECKING:
    from ._clock import Clock as Clock
    from ._clock import RealTimeClock as RealTimeClock
    from ._clock import SystemClock as SystemClock
    from ._core.fleetclock import FleetClock as FleetClock
    from ._core.job import Job as Job
    from ._core.retries import RetryingLocker as RetryingLocker
    from ._errors import ConfigError as ConfigError
    from ._errors import CronlockError as CronlockError
    from ._errors import JobConflictError as JobConflictError
    from ._errors import JobLookupError as JobLookupError
    from ._errors import LedgerNameError as LedgerNameError
    from ._errors import LockerMisconfigured as LockerMisconfigured
    from ._errors import LockError as LockError
    from ._errors import LockUnavailable as LockUnavailable
    from ._errors import PoolerDetected as PoolerDetected
    from ._errors import ScheduleError as ScheduleError
    from ._errors import ScheduleRejectedError as ScheduleRejectedError
    from ._errors import SchedulerStateError as SchedulerStateError
    from ._errors import ServerError as ServerError
    from ._errors import SessionLost as SessionLost
    from ._errors import StatementTimeout as StatementTimeout
    from ._events import Event as Event
    from ._events import JobCancelled as JobCancelled
    from ._events import JobCrashed as JobCrashed
    from ._events import JobEvent as JobEvent
    from ._events import JobFailed as JobFailed
    from ._events import JobRetrying as JobRetrying
    from ._events import JobSkipped as JobSkipped
    from ._events import JobStarted as JobStarted
    from ._events import JobSucceeded as JobSucceeded
    from ._events import JobTimedOut as JobTimedOut
    from ._events import LockFailed as LockFailed
    from ._events import LockHeldElsewhere as LockHeldElsewhere
    from ._events import LockLost as LockLost
    from ._events import RunOverran as RunOverran
    from ._events import RunRestored as RunRestored
    from ._events import ScheduleRejected as ScheduleRejected
    from ._events import SchedulerStarted as SchedulerStarted
    from ._events import SchedulerStopped as SchedulerStopped
    from ._events import SkipReason as SkipReason
    from ._events import SlotFate as SlotFate
    from ._events import SlotRanTwice as SlotRanTwice
    from ._events import SlotsDecided as SlotsDecided
    from ._events import Subscription as Subscription
    from ._keys import job_lock_key as job_lock_key
    from ._locking.files import FileLocker as FileLocker
    from ._locking.memory import InMemoryLocker as InMemoryLocker
    from ._locking.protocols import BatchLedgerLocker as BatchLedgerLocker
    from ._locking.protocols import CheckableLocker as CheckableLocker
    from ._locking.protocols import ClaimAheadLocker as ClaimAheadLocker
    from ._locking.protocols import CrashWatchingLocker as CrashWatchingLocker
    from ._locking.protocols import Elector as Elector
    from ._locking.protocols import FailoverWatchingLocker as FailoverWatchingLocker
    from ._locking.protocols import FencedElector as FencedElector
    from ._locking.protocols import FleetView as FleetView
    from ._locking.protocols import FleetWatchingLocker as FleetWatchingLocker
    from ._locking.protocols import ForeignWatchingLocker as ForeignWatchingLocker
    from ._locking.protocols import Hold as Hold
    from ._locking.protocols import LedgerLocker as LedgerLocker
    from ._locking.protocols import LedgerSummary as LedgerSummary
    from ._locking.protocols import Locker as Locker
    from ._locking.protocols import LosableHold as LosableHold
    from ._locking.protocols import RecordingHold as RecordingHold
    from ._locking.protocols import Refusal as Refusal
    from ._locking.protocols import Resource as Resource
    from ._locking.protocols import ScheduleNotingLocker as ScheduleNotingLocker
    from ._locking.protocols import ServerClockLocker as ServerClockLocker
    from ._records import CatchUpPolicy as CatchUpPolicy
    from ._records import Outcome as Outcome
    from ._records import Overlap as Overlap
    from ._records import RunContext as RunContext
    from ._records import RunRecord as RunRecord
    from ._records import idempotency_key as idempotency_key
    from ._scheduler import JobOptions as JobOptions
    from ._scheduler import Scheduler as Scheduler
    from ._schedules.calendar import daily as daily
    from ._schedules.calendar import monthly as monthly
    from ._schedules.calendar import weekly as weekly
    from ._schedules.cron import CronSchedule as CronSchedule
    from ._schedules.cron import cron as cron
    from ._schedules.interval import IntervalSchedule as IntervalSchedule
    from ._schedules.interval import every as every
    from ._schedules.once import OnceSchedule as OnceSchedule
    from ._schedules.once import once as once
    from ._schedules.schedule import Schedule as Schedule
    from ._stored.schedule import ScheduleStore as ScheduleStore
    from ._stored.schedule import StoredSchedule as StoredSchedule

# Where each public name lives (its module is imported on first access).
_WHERE = {
    "daily": "._schedules.calendar",
    "monthly": "._schedules.calendar",
    "weekly": "._schedules.calendar",
    "Clock": "._clock",
    "RealTimeClock": "._clock",
    "SystemClock": "._clock",
    "CronSchedule": "._schedules.cron",
    "cron": "._schedules.cron",
    "ConfigError": "._errors",
    "CronlockError": "._errors",
    "JobConflictError": "._errors",
    "JobLookupError": "._errors",
    "LedgerNameError": "._errors",
    "LockError": "._errors",
    "LockerMisconfigured": "._errors",
    "LockUnavailable": "._errors",
    "PoolerDetected": "._errors",
    "ServerError": "._errors",
    "StatementTimeout": "._errors",
    "SessionLost": "._errors",
    "ScheduleError": "._errors",
    "ScheduleRejectedError": "._errors",
    "SchedulerStateError": "._errors",
    "Event": "._events",
    "JobCancelled": "._events",
    "JobCrashed": "._events",
    "LockHeldElsewhere": "._events",
    "RunOverran": "._events",
    "RunRestored": "._events",
    "SlotRanTwice": "._events",
    "SlotFate": "._events",
    "SlotsDecided": "._events",
    "ScheduleRejected": "._events",
    "ScheduleStore": "._stored.schedule",
    "StoredSchedule": "._stored.schedule",
    "JobEvent": "._events",
    "JobFailed": "._events",
    "JobRetrying": "._events",
    "RetryingLocker": "._core.retries",
    "JobSkipped": "._events",
    "JobStarted": "._events",
    "JobSucceeded": "._events",
    "JobTimedOut": "._events",
    "LockFailed": "._events",
    "LockLost": "._events",
    "SchedulerStarted": "._events",
    "SchedulerStopped": "._events",
    "SkipReason": "._events",
    "Subscription": "._events",
    "FileLocker": "._locking.files",
    "FleetClock": "._core.fleetclock",
    "IntervalSchedule": "._schedules.interval",
    "every": "._schedules.interval",
    "Job": "._core.job",
    "job_lock_key": "._keys",
    "BatchLedgerLocker": "._locking.protocols",
    "CheckableLocker": "._locking.protocols",
    "ClaimAheadLocker": "._locking.protocols",
    "CrashWatchingLocker": "._locking.protocols",
    "FailoverWatchingLocker": "._locking.protocols",
    "ForeignWatchingLocker": "._locking.protocols",
    "Elector": "._locking.protocols",
    "FencedElector": "._locking.protocols",
    "FleetView": "._locking.protocols",
    "FleetWatchingLocker": "._locking.protocols",
    "Hold": "._locking.protocols",
    "LedgerLocker": "._locking.protocols",
    "LedgerSummary": "._locking.protocols",
    "Locker": "._locking.protocols",
    "LosableHold": "._locking.protocols",
    "RecordingHold": "._locking.protocols",
    "Refusal": "._locking.protocols",
    "Resource": "._locking.protocols",
    "ScheduleNotingLocker": "._locking.protocols",
    "ServerClockLocker": "._locking.protocols",
    "InMemoryLocker": "._locking.memory",
    "OnceSchedule": "._schedules.once",
    "once": "._schedules.once",
    "Outcome": "._records",
    "Overlap": "._records",
    "CatchUpPolicy": "._records",
    "RunContext": "._records",
    "RunRecord": "._records",
    "idempotency_key": "._records",
    "Schedule": "._schedules.schedule",
    "JobOptions": "._scheduler",
    "Scheduler": "._scheduler",
}

__version__ = "0.1.0.dev0"

__all__ = (
    "BatchLedgerLocker",
    "CatchUpPolicy",
    "CheckableLocker",
    "ClaimAheadLocker",
    "Clock",
    "ConfigError",
    "CrashWatchingLocker",
    "CronSchedule",
    "CronlockError",
    "Elector",
    "Event",
    "FailoverWatchingLocker",
    "FencedElector",
    "FileLocker",
    "FleetClock",
    "FleetView",
    "FleetWatchingLocker",
    "ForeignWatchingLocker",
    "Hold",
    "InMemoryLocker",
    "IntervalSchedule",
    "Job",
    "JobCancelled",
    "JobConflictError",
    "JobCrashed",
    "JobEvent",
    "JobFailed",
    "JobLookupError",
    "JobOptions",
    "JobRetrying",
    "JobSkipped",
    "JobStarted",
    "JobSucceeded",
    "JobTimedOut",
    "LedgerLocker",
    "LedgerNameError",
    "LedgerSummary",
    "LockError",
    "LockFailed",
    "LockHeldElsewhere",
    "LockLost",
    "LockUnavailable",
    "Locker",
    "LockerMisconfigured",
    "LosableHold",
    "OnceSchedule",
    "Outcome",
    "Overlap",
    "PoolerDetected",
    "RealTimeClock",
    "RecordingHold",
    "Refusal",
    "Resource",
    "RetryingLocker",
    "RunContext",
    "RunOverran",
    "RunRecord",
    "RunRestored",
    "Schedule",
    "ScheduleError",
    "ScheduleNotingLocker",
    "ScheduleRejected",
    "ScheduleRejectedError",
    "ScheduleStore",
    "Scheduler",
    "SchedulerStarted",
    "SchedulerStateError",
    "SchedulerStopped",
    "ServerClockLocker",
    "ServerError",
    "SessionLost",
    "SkipReason",
    "SlotFate",
    "SlotRanTwice",
    "SlotsDecided",
    "StatementTimeout",
    "StoredSchedule",
    "Subscription",
    "SystemClock",
    "cron",
    "daily",
    "every",
    "idempotency_key",
    "job_lock_key",
    "monthly",
    "once",
    "weekly",
)


# Names of earlier releases, still importable (with a DeprecationWarning): a held lock was
# called a lease, the word lease mode's expiring rows now have to themselves.
_RENAMED = {"Lease": "Hold", "LosableLease": "LosableHold", "RecordingLease": "RecordingHold"}


def __getattr__(name: str) -> _Any:
    """Import the module defining *name* on first access, then keep the name here."""
    if name in _RENAMED:
        _warnings.warn(
            f"{__name__}.{name} is now {_RENAMED[name]}", DeprecationWarning, stacklevel=2
        )
        return __getattr__(_RENAMED[name])
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'cronlock' has no attribute {name!r}")
    value = getattr(_importlib.import_module(where, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
