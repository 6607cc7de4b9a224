"""The parts of a locker that exist only with a run ledger, as they are without one.

``PostgresLocker(ledger=False)`` is the lock alone: no members table to race by, no foreign
holders to name, no fleet to watch. Its mode (:class:`.._modes.bare.BareLocks`) makes the
locker build these instead (``Exclusion.ledger_or``), so the locker's code never asks
whether it has a ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ..._service import Service

if TYPE_CHECKING:
    from ..._locking.protocols import FleetCallback, Health, LedgerSummary
    from ..._records import RunRecord
    from ..._stored.schedule import Change
    from .._conn import Channel
    from .foreign import ForeignCallback

__all__ = ("NoFleetWatch", "NoForeignHolders", "NoLedgerReads", "NoMembership")


class _Idle(Service):
    """A service with nothing to do: its task never starts."""

    def _wanted(self) -> bool:
        return False

    async def _serve(self) -> None:
        """Never started."""


class NoMembership(_Idle):
    """Every replica claims: there is no members table to choose racers by."""

    kind = "pg-members"
    size = 0

    def has(self, job: str) -> None:
        """Nothing to note."""

    def standing_by(self) -> bool:
        """Never: every replica races."""
        return False

    def spread(self) -> float:
        """Fleet-wide chores run at the pace of one replica."""
        return 1.0


class NoForeignHolders:
    """No fleet to tell a stranger's session from: nobody is named."""

    found = 0

    def on_found(self, callback: ForeignCallback) -> None:
        """Never called."""

    def refused(self, job: str, key: int, slot: datetime, session: Channel) -> None:
        """Nothing to look up."""

    async def stop(self) -> None:
        """Nothing to stop."""


class NoFleetWatch(_Idle):
    """No ledger to read the fleet's latest runs from."""

    kind = "pg-fleet"

    def add(self, callback: FleetCallback, jobs: Callable[[], Mapping[str, Health]]) -> None:
        """Never called back."""

    def health(self) -> Mapping[str, Health]:
        """Nothing is noted."""
        return {}


class NoLedgerReads:
    """Nothing recorded, nothing to read: every answer is empty."""

    async def last_claimed(self, job: str) -> datetime | None:
        """No slot was recorded."""
        return None

    async def last_runs(self, job: str) -> tuple[RunRecord | None, RunRecord | None]:
        """No run was recorded."""
        return None, None

    async def history(self, job: str, limit: int) -> list[RunRecord]:
        """No run was recorded."""
        return []

    async def retry_due(self, job: str, slot: datetime, attempt: int, when: datetime) -> None:
        """Nothing to write down: without a ledger only this replica retries."""

    async def summaries(self, jobs: Sequence[str]) -> Mapping[str, LedgerSummary]:
        """No job has a row."""
        return {}

    async def stored_changes(self, since: int) -> tuple[int, list[Change]]:
        """No schedule is stored."""
        return since, []

    async def report_problem(self, name: str, revision: int, problem: str) -> None:
        """Nowhere to note it."""
