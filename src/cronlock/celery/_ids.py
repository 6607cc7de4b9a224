"""The id a beat entry's task is sent with: one per (ledger, entry, slot), the same on every
replica and on every send of that slot.

A leaf module: it imports neither celery nor the rest of cronlock, so a worker may import
it to check an id without the scheduler's dependencies.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

__all__ = ("TASK_ID_NAMESPACE", "task_id")

TASK_ID_NAMESPACE = uuid.UUID("6b1f0c39-8f3e-5a0c-9d2e-2c7f6a1b9e40")
"""The UUID namespace of :func:`task_id` (fixed: changing it would change every id)."""


def task_id(ledger: str, entry: str, slot: datetime) -> str:
    """The Celery task id of *entry*'s task for *slot*, sent through the run ledger *ledger*.

    A name-based UUID (version 5, :data:`TASK_ID_NAMESPACE`) over the ledger's name, the
    entry's name and the slot as UTC ISO 8601 with microseconds, separated by NUL (which
    none of them may contain). The same inputs give the same id on every replica and in
    every process; a different ledger, entry or slot gives another. *slot* must be aware;
    any zone gives the id of the same instant in UTC.

    *ledger* is the ledger's table as the scheduler names it: ``schema.table`` when a
    schema is set (``cronlock_schema``), else the table alone (``cronlock_ledger``, by
    default ``cronlock_runs``).
    """
    if slot.tzinfo is None or slot.utcoffset() is None:
        raise ValueError(f"task_id: slot must be an aware datetime, got naive {slot!r}")
    instant = slot.astimezone(UTC).isoformat(timespec="microseconds")
    return str(uuid.uuid5(TASK_ID_NAMESPACE, f"{ledger}\x00{entry}\x00{instant}"))
