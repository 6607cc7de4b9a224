"""The simulated server's data: the ledger's tables as dictionaries, every change undoable.

A table is a dict from its primary key to a row (a dict of column values). Each statement
runs atomically at one virtual instant (the server serialises them); its changes go through
:meth:`Database.put` / :meth:`Database.delete`, which log the old value, so that a commit can
be lost again (a failover to a standby missing the last *k* commits) and a snapshot restored.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = ("HIGH", "LOW", "TABLES", "Commit", "Database", "in_range")

LOW = datetime(1, 1, 2, tzinfo=UTC)
""":data:`cronlock.postgres._sql.runs.LOW` as a value."""
HIGH = datetime(9999, 12, 30, tzinfo=UTC)
""":data:`cronlock.postgres._sql.runs.HIGH` as a value."""


def in_range(value: datetime | None) -> bool:
    """``value BETWEEN LOW AND HIGH`` (NULL is not)."""
    return value is not None and LOW <= value <= HIGH


TABLES = (
    "runs",
    "jobs",
    "control",
    "leases",
    "members",
    "secrets",
    "definitions",
    "schedules",
    "slots",
)
"""The ledger's tables, by the names of :class:`cronlock.postgres._sql.tables.LedgerTable`'s
properties. Keys: runs and slots (job, slot); definitions (job, holder); the others their first
column."""

_Key = Any
_Row = dict[str, Any]
_MISSING = object()


@dataclass(slots=True)
class Commit:
    """One committed statement: when, and how to take it back."""

    at: datetime
    undo: list[tuple[str, _Key, Any]] = field(default_factory=list)


class Database:
    """The tables and the log of commits (only their undo records are kept)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[_Key, _Row]] = {name: {} for name in TABLES}
        self.log: list[Commit] = []
        self._open: Commit | None = None
        # The runs table's two indexes (the server has them too: the primary key's first
        # column, and the partial index of unfinished runs), kept by _set.
        self._by_job: dict[Any, dict[_Key, _Row]] = {}
        self._unfinished: dict[_Key, _Row] = {}
        # And two of the model's own, for reads that would otherwise scan every run each
        # time (the table grows by a row a slot): per job, its slots in range in order (a
        # key's slot never changes, so only inserts and deletes move it); the runs with a
        # retry noted.
        self._slots: dict[Any, list[datetime]] = {}
        self._retrying: dict[_Key, _Row] = {}

    def begin(self, at: datetime) -> None:
        """Start one statement's changes."""
        self._open = Commit(at)

    def commit(self) -> None:
        """Keep the open statement's changes (logged only if it changed something)."""
        if self._open is not None and self._open.undo:
            self.log.append(self._open)
        self._open = None

    def rollback(self) -> None:
        """Undo the open statement's changes (it failed half way)."""
        if self._open is not None:
            self._undo(self._open)
        self._open = None

    def table(self, name: str) -> dict[_Key, _Row]:
        """The rows of table *name*, by key (read only: change them with :meth:`put`)."""
        return self.tables[name]

    def get(self, name: str, key: _Key) -> _Row | None:
        """The row of *name* at *key*, or ``None``."""
        return self.tables[name].get(key)

    def runs_of(self, job: Any) -> dict[_Key, _Row]:
        """The runs of *job*, by key (read only)."""
        return self._by_job.get(job, {})

    def unfinished(self) -> dict[_Key, _Row]:
        """The runs with no ``finished_at``, by key (read only)."""
        return self._unfinished

    def slots_of(self, job: Any) -> list[datetime]:
        """The slots of *job*'s runs that are in range (:func:`in_range`),
        ascending (read only)."""
        return self._slots.get(job, [])

    def retrying(self) -> dict[_Key, _Row]:
        """The runs with a ``retry_at``, by key (read only)."""
        return self._retrying

    def put(self, name: str, key: _Key, row: _Row) -> None:
        """Insert or replace the row of *name* at *key*."""
        rows = self.tables[name]
        self._remember(name, key, rows.get(key, _MISSING))
        self._set(name, key, row)

    def _set(self, name: str, key: _Key, row: Any) -> None:
        """Make the row of *name* at *key* be *row* (``_MISSING``: none), indexes too."""
        if row is _MISSING:
            self.tables[name].pop(key, None)
        else:
            self.tables[name][key] = row
        if name != "runs":
            return
        job_rows = self._by_job.setdefault(key[0], {})
        if row is _MISSING:
            if job_rows.pop(key, None) is not None:
                self._unslot(key)
            self._unfinished.pop(key, None)
            self._retrying.pop(key, None)
            return
        if key not in job_rows:
            self._slot(key)
        job_rows[key] = row
        if row.get("finished_at") is None:
            self._unfinished[key] = row
        else:
            self._unfinished.pop(key, None)
        if row.get("retry_at") is not None:
            self._retrying[key] = row
        else:
            self._retrying.pop(key, None)

    def _slot(self, key: _Key) -> None:
        """A run at *key* is new: its slot joins its job's slots in order, if in range."""
        job, slot = key
        if in_range(slot):
            slots = self._slots.setdefault(job, [])
            if not slots or slots[-1] < slot:
                slots.append(slot)  # the usual case: a claim of the newest slot
            else:
                bisect.insort(slots, slot)

    def _unslot(self, key: _Key) -> None:
        """The run at *key* is gone: its slot leaves its job's slots."""
        job, slot = key
        if in_range(slot):
            slots = self._slots[job]
            del slots[bisect.bisect_left(slots, slot)]

    def update(self, name: str, key: _Key, **changes: Any) -> _Row:
        """Change some columns of the row at *key* (which must exist); return the new row."""
        old = self.tables[name][key]
        new = {**old, **changes}
        self.put(name, key, new)
        return new

    def delete(self, name: str, key: _Key) -> _Row | None:
        """Delete the row at *key*; return it (``None``: there was none)."""
        old = self.tables[name].get(key)
        if old is not None:
            self._remember(name, key, old)
            self._set(name, key, _MISSING)
        return old

    def _remember(self, name: str, key: _Key, old: Any) -> None:
        if self._open is None:
            raise RuntimeError("a change outside a statement")
        self._open.undo.append((name, key, old))

    def _undo(self, commit: Commit) -> None:
        for name, key, old in reversed(commit.undo):
            self._set(name, key, old)

    def lose_last(self, k: int) -> int:
        """Take back the last *k* commits (a standby promoted without them); return how many
        were taken back."""
        lost = 0
        while lost < k and self.log:
            self._undo(self.log.pop())
            lost += 1
        return lost

    def snapshot(self) -> tuple[dict[str, dict[_Key, _Row]], int]:
        """A copy of every table, and the log's length then (for :meth:`restore`)."""
        return copy.deepcopy(self.tables), len(self.log)

    def restore(self, snapshot: tuple[dict[str, dict[_Key, _Row]], int]) -> None:
        """Go back to *snapshot* (a storage snapshot restored under the same identity)."""
        tables, length = snapshot
        self.tables = copy.deepcopy(tables)
        del self.log[length:]
        self._by_job.clear()
        self._unfinished.clear()
        self._slots.clear()
        self._retrying.clear()
        for key, row in self.tables["runs"].items():
            self._set("runs", key, row)
