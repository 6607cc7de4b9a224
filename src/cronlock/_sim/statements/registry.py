"""The registry of the simulated server's statements: handlers by statement text."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...postgres._sql.tables import LedgerTable
    from ..server import Exec

__all__ = ("Handler", "NotModelled", "Statements", "normalise")

Handler = Callable[["Exec", tuple[Any, ...]], Any]


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
        text = normalise(sql)
        if text in self._exact:
            raise ValueError(f"two handlers for one statement: {text[:120]}")
        self._exact[text] = handler
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
        if handler is None:
            raise NotModelled(f"the simulated server does not know this statement: {text[:300]}")
        self._memo[sql] = handler
        return handler
