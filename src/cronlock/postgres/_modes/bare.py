"""The lock alone (``PostgresLocker(ledger=False)``): session advisory locks, no ledger.

The seed's recipe as it is: a session advisory lock per running job, and nothing recorded.
The rules of session locks hold (a dropped session loses its holds; an end goes out only on
the session that granted it); there is no claim to record, no row to take over, no crashed
run to find and no outcome to write late. It can run a slot twice (docs/ledger.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from .._sql.bare import TRY_LOCK_MANY_SQL, UNLOCK_MANY_SQL
from .._sql.tables import LedgerTable
from .base import End, Statement
from .session import SessionRules

if TYPE_CHECKING:
    from ..._records import RunRecord

__all__ = ("BareLocks",)

_A = TypeVar("_A")
_B = TypeVar("_B")


class BareLocks(SessionRules):
    """Session advisory locks without a ledger."""

    ledger = None

    def ledger_or(self, without: Callable[[], _A], kept: Callable[[LedgerTable], _B]) -> _A | _B:
        """*without*: there is no ledger."""
        return without()

    def claim(
        self, keys: list[int], jobs: list[str], slots: list[datetime], host: str, pid: int
    ) -> Statement:
        """Try-lock each key (:data:`.._sql.bare.TRY_LOCK_MANY_SQL`)."""
        return Statement(TRY_LOCK_MANY_SQL, (keys,))

    def finish(self, ends: Sequence[End], host: str, pid: int) -> Statement:
        """Unlock each key: there is no outcome to record."""
        return Statement(UNLOCK_MANY_SQL, ([end.key for end in ends],))

    def takeover(
        self, key: int, job: str, slot: datetime, host: str, pid: int, attempt: int
    ) -> Statement | None:
        """No row to take over: a plain claim."""
        return None

    def crashed(self, host: str, pid: int) -> Statement | None:
        """No ledger, nothing to check."""
        return None

    def late_finish(
        self, late: Sequence[tuple[str, datetime, RunRecord, int]], host: str, pid: int
    ) -> Statement | None:
        """No ledger, nothing to write."""
        return None
