"""Locker capabilities that only a job's registration looks at
(:func:`cronlock._locking.protocols.wire` reads them once per locker class): how long its
ledger keeps a slot's row, whether its
lock keys are its own rather than FNV-1a of the job's name, and whether it takes a job's
tags with its schedule note."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ("KeyedLocker", "PruningLocker")


@runtime_checkable
class PruningLocker(Protocol):
    """A ledger locker that deletes the rows of old slots, after :meth:`retention` seconds.

    A slot's row is what answers a late claim of it ``"already_ran"``: once pruned, a
    replica still within the job's ``misfire_grace`` of that slot could claim it again
    and run it twice. So a job's slots must stay late for less than the retention, with
    a margin to spare (:func:`cronlock._locking.retention.check_retention`, when it is registered).
    """

    def retention(self) -> float:
        """Seconds after its slot that a row may be pruned."""
        ...


@runtime_checkable
class KeyedLocker(Protocol):
    """A locker that may take lock keys of its own rather than FNV-1a of the job's name.

    The scheduler refuses two jobs whose FNV-1a keys collide when they are registered; for
    a locker whose :meth:`keyed_keys` is true that check would guard the wrong keys, and let
    a name built to collide with another job's refuse that job's registration.
    """

    def keyed_keys(self) -> bool:
        """True when the keys are not FNV-1a of the job's name (no collision to refuse)."""
        ...
