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

from dataclasses import dataclass
from typing import Literal

from ._batchsql import claim_many_sql, finish_many_sql
from ._crashes import crashed_sql, recover_sql
from ._leasesql import (
    lease_claim_many_sql,
    lease_crashed_sql,
    lease_finish_many_sql,
    lease_late_finish_sql,
    lease_recover_sql,
)
from ._ledger import LedgerTable

__all__ = ("Exclusion", "Mode", "lease_rows", "session_locks")

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
    """Ends of many runs: ``$1``-``$8``, then :attr:`holder_args`."""
    recover_sql: str
    """The rerun of one crashed run: ``$1``-``$5``, then :attr:`extra`."""
    crashed_sql: str
    """Mark crashed runs: ``$1`` host, ``$2`` pid, then :attr:`holder_args`."""
    late_finish_sql: str
    """Late outcomes: ``$1``-``$8``, then :attr:`holder_args`."""
    extra: tuple[object, ...] = ()
    """Lease mode: (holder, lease seconds); session mode: nothing."""

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
    )
