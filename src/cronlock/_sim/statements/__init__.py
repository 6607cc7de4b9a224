"""What each named statement of ``cronlock.postgres._sql`` does, in the simulated server.

A statement is recognised by its text, built by the same function of ``_sql`` that the
library calls (so no SQL is written here, and a statement changed in ``_sql`` is a
statement this model no longer knows: it fails loudly, :class:`NotModelled`, until a
handler is given for it). Each handler takes the execution context (:class:`..server.Exec`)
and the statement's arguments, and returns its rows (a list of :class:`..rows.Row`) or, for
``execute``, a status text. The modules of this folder hold the handlers by the ``_sql``
module they answer for; :func:`statements_for` gathers them.
"""

from __future__ import annotations

from collections.abc import Callable
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec

__all__ = ("Handler", "NotModelled", "Statements", "normalise", "statements_for")

Handler = Callable[["Exec", tuple[Any, ...]], Any]


_LENIENT = os.environ.get("CRONLOCK_SIM_LENIENT") == "1"
_told: set[str] = set()


def _nothing(x: Exec, args: tuple[Any, ...]) -> list[Any]:
    return []


class NotModelled(RuntimeError):
    """A statement the simulated server does not know: the model needs a handler for it."""


def normalise(sql: str) -> str:
    """*sql* with every run of white space made one space (how statements are matched)."""
    return " ".join(sql.split())


class Statements:
    """The handlers of one ledger's statements, by normalised text (or by prefix, for a
    statement whose text carries a value, as ``SET LOCAL lock_timeout = 50``)."""

    def __init__(self, table: LedgerTable) -> None:
        self.table = table
        self._exact: dict[str, Handler] = {}
        self._prefixes: list[tuple[str, Handler]] = []
        self._memo: dict[str, Handler] = {}
        self.claims: set[Handler] = set()
        """The handlers of the statements that claim slots (faults strike their answers)."""

    def add(self, sql: str, handler: Handler, *, claim: bool = False) -> None:
        """Answer *sql* (exactly, white space aside) with *handler*; *claim*: it claims
        slots (a fault that loses "the answer to a claim" strikes it)."""
        self._exact[normalise(sql)] = handler
        if claim:
            self.claims.add(handler)

    def add_prefix(self, prefix: str, handler: Handler) -> None:
        """Answer every statement starting with *prefix* with *handler*."""
        self._prefixes.append((normalise(prefix), handler))

    def lookup(self, sql: str) -> Handler:
        """The handler of *sql*; :class:`NotModelled` if there is none."""
        handler = self._memo.get(sql)
        if handler is not None:
            return handler
        text = normalise(sql)
        handler = self._exact.get(text)
        if handler is None:
            for prefix, candidate in self._prefixes:
                if text.startswith(prefix):
                    handler = candidate
                    break
        if handler is None and _LENIENT:
            # While the model is being written: answer nothing, say so once.
            if text not in _told:
                _told.add(text)
                print(f"[sim] not modelled, answered with no rows: {text[:160]}", file=sys.stderr)
            return _nothing
        if handler is None:
            raise NotModelled(f"the simulated server does not know this statement: {text[:300]}")
        self._memo[sql] = handler
        return handler


def statements_for(table: LedgerTable) -> Statements:
    """Every statement of a ledger at *table* the simulated server answers."""
    from . import session

    statements = Statements(table)
    for module in (session,):
        module.register(statements, table)
    for name in ("claims", "leases", "upkeep", "crashes", "failover", "reads"):
        try:
            module = __import__(f"{__name__}.{name}", fromlist=["register"])
        except ModuleNotFoundError:
            continue
        module.register(statements, table)
    return statements
