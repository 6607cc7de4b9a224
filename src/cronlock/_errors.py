"""The exception hierarchy: one root, each leaf also inherits the builtin that fits."""

from __future__ import annotations


class CronlockError(Exception):
    """Root of every exception cronlock raises on purpose."""


class ConfigError(CronlockError, ValueError):
    """A setting is malformed: of a scheduler, a locker, an elector or a job.

    The message names the object, the setting and the bad value. Raised when the object is
    built, so a typo fails at start-up rather than at the first run.
    """


class ScheduleError(ConfigError):
    """A schedule or job option is malformed; the message names the bad part and value."""


class JobConflictError(CronlockError, ValueError):
    """A job name is already registered, or two jobs that take a lock share a lock key."""


class JobLookupError(CronlockError, KeyError):
    """No job with the given name is registered with the scheduler."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class SchedulerStateError(CronlockError, RuntimeError):
    """The scheduler is in the wrong state for the call (started twice, not running, ...)."""


class ScheduleRejectedError(CronlockError, RuntimeError):
    """A stored schedule every live replica rejected (no replica has its task, or its kwargs
    fit nowhere), so no replica can run it: raised by
    ``FleetControl.trigger`` unless ``force=True``. The message names the schedule, its
    revision and the replicas' problem."""


class LockError(CronlockError, RuntimeError):
    """A locking backend failed: connection refused or lost, pool exhausted, server error."""


class LockUnavailable(LockError):
    """The locking backend cannot be reached right now: connecting failed, or was not tried.

    Raised by :class:`cronlock.postgres.PostgresLocker` when a lock session cannot connect,
    and then, without trying, while it waits before its next attempt (it backs off rather
    than trying again on every acquire); the message says when it tries next. The locker
    logs the outage itself, once, so the scheduler logs these at DEBUG only.
    """


class SessionLost(LockError):
    """The connection to the server broke (reset, closed, terminated by the server, a
    protocol error such as a pooler's refusal) while a statement was sent or awaited."""


class StatementTimeout(LockError):
    """A statement did not finish in time: the locker's ``statement_timeout`` passed, or the
    server cancelled it. What the server did with it is unknown; the session is dropped."""


class ServerError(LockError):
    """The server answered a statement with an error (a missing table, a permission, a
    constraint): the session itself is sound."""


class LockerMisconfigured(LockError):
    """The locker can never work as it is configured; the message names the fix.

    Raised by :meth:`cronlock.postgres.PostgresLocker.check`, and so by ``async with
    scheduler`` / :meth:`cronlock.Scheduler.start`, when trying again cannot help: the
    server refused the user or password, the database does not exist, the run ledger is
    missing (or older than this cronlock) and ``create_table=False``, session mode reached
    the server through a pooler (:class:`PoolerDetected`, a subclass), or lease mode was
    given a pool whose asyncpg statement cache is on behind a pooler. A server that merely
    cannot be reached right now is :class:`LockUnavailable` instead.
    """


class LedgerUnreadable(CronlockError):
    """The command line could not use the run ledger: the server refused a privilege (the
    message names the grants the role lacks), the ledger or its schema is missing or older
    than this cronlock, or the server cannot be reached or failed. ``python -m cronlock``
    exits with status 3 for it (2 is a usage error, 1 a failed ``status --check``)."""


class PoolerDetected(LockerMisconfigured):
    """A session advisory lock was asked for through a connection pooler or proxy.

    Raised by :class:`cronlock.postgres.PostgresLocker` in ``mode="session"`` (and by the
    elector and ``locked_run``) when its session is not one server backend of its own: the
    backend pid the server reports differs from the one the connection announced, or it
    changed between two statements. A transaction pooler (PgBouncer in transaction mode,
    Supavisor, Neon's and Heroku's poolers) hands each transaction to whatever backend is
    free, so a session lock taken in one would be held by a stranger and never released.
    Use ``mode="lease"``, which needs no session, or connect to the server directly.
    """


class LedgerNameError(ConfigError):
    """A run-ledger table or schema name PostgreSQL cannot store as given.

    Raised by :class:`cronlock.postgres.PostgresLocker` (and ``python -m cronlock``) for an
    empty name, one containing a NUL character, or one longer than PostgreSQL's 63-byte
    identifier limit (the server would silently truncate it into another name).
    """
