"""Whether a locker can work at all: :meth:`PostgresLocker.check`'s verdict on a failure.

A check connects as claims would (its mode's :meth:`~.._modes.base.Exclusion.check`) and
sorts what went wrong into two kinds, because a scheduler's start treats them apart:

- **never, as configured** (:class:`cronlock.LockerMisconfigured`, naming the fix): the
  DSN or a connect option is invalid, the server or the pooler refused the user or the
  password, the database does not exist, the user lacks a privilege the ledger needs, or
  the mode found what it cannot work with (a
  pooler in session mode, the statement cache behind one in lease mode, the ledger missing
  with ``create_table=False``);
- **not now** (:class:`cronlock.LockUnavailable`): everything else, a refused connection,
  a timeout, a name that does not resolve, a server starting up or full, a statement that
  failed on the way.

The server's answers are told apart by their SQLSTATE (class 28 and ``3D000``), and
PgBouncer's (1.18 answers both with ``08P01``) by its words.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..._dsn import PARSE_HINT, answered
from ..._errors import CronlockError, LockerMisconfigured, LockError, LockUnavailable

if TYPE_CHECKING:
    from .._conn import Channel
    from .._modes.base import Exclusion

__all__ = ("check_channel", "misconfiguration")

_BACKOFF_TAIL = "; reconnecting in "  # what a channel adds to a failed connect's message


@runtime_checkable
class _Answer(Protocol):
    """An error answer of a server (or a pooler speaking its protocol): its SQLSTATE."""

    sqlstate: str


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _fix(answer: _Answer) -> str | None:
    """What to fix when a server or a pooler gave *answer*, or ``None`` (not ours to say)."""
    state, text = answer.sqlstate, str(answer)
    pgbouncer = state == "08P01"  # PgBouncer 1.18's code for its own refusals
    if state.startswith("28") or (pgbouncer and text.startswith("password authentication")):
        return (
            "the server or the pooler refused the user or the password: fix the user and "
            "password of the DSN (or of the pool's), or the server's pg_hba.conf (or the "
            "pooler's auth_file)"
        )
    if state == "3D000" or (pgbouncer and text.startswith("no such database")):
        return (
            "the database does not exist: fix the database name of the DSN (or of the "
            "pool's), create it, or (behind PgBouncer) list it under [databases]"
        )
    if state == "42501":
        return (
            "the user lacks a privilege the run ledger needs: grant it (USAGE and CREATE on "
            "the schema, or SELECT, INSERT, UPDATE and DELETE on the ledger's tables), or "
            "create them as their owner with 'python -m cronlock migrate'"
        )
    return None


def misconfiguration(exc: BaseException) -> LockerMisconfigured | None:
    """The :class:`cronlock.LockerMisconfigured` that *exc* (or what caused it) amounts to,
    or ``None`` when trying again may help."""
    said = str(exc).partition(_BACKOFF_TAIL)[0]  # masked: never a password
    for cause in _causes(exc):
        if isinstance(cause, LockerMisconfigured):
            return cause
        fix = None
        if isinstance(cause, _Answer):
            fix = _fix(cause)
        elif isinstance(cause, CronlockError):
            # A DSN that does not parse is said without its cause (it may quote the password).
            fix = _INVALID if PARSE_HINT in str(cause) else None
        elif not answered(cause):  # asyncpg refused the DSN or an option before connecting
            fix = _INVALID
        if fix is not None:
            return LockerMisconfigured(f"{fix} ({said})")
    return None


_INVALID = "the DSN or a connect option is invalid: fix it"


async def check_channel(exclusion: Exclusion, channel: Channel) -> None:
    """Check *channel* as *exclusion*'s mode connects; raise LockerMisconfigured or
    LockUnavailable (see the module)."""
    try:
        await exclusion.check(channel)
    except LockError as exc:
        wrong = misconfiguration(exc)
        if wrong is not None:
            if wrong.__traceback__ is not None:
                raise wrong from wrong.__cause__  # raised before, by the mode: as it was
            raise wrong from exc
        if isinstance(exc, LockUnavailable):
            raise
        raise LockUnavailable(str(exc)) from exc
