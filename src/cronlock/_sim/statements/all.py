"""Every statement the simulated server answers, gathered from this folder's modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import claims, crashes, failover, fleet, leases, session, upkeep
from .registry import Statements

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable

__all__ = ("statements_for",)


def statements_for(table: LedgerTable) -> Statements:
    """Every statement of a ledger at *table* the simulated server answers."""
    statements = Statements(table)
    for module in (session, claims, leases, upkeep, crashes, failover, fleet):
        module.register(statements, table)
    return statements
