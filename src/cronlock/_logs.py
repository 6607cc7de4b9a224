"""cronlock's loggers, and the record attributes every record they write carries.

Each record has ``job`` and ``slot`` (the job's name and the slot as an ISO 8601 string,
``None`` when the record is about no job or slot) and ``replica`` (``host:pid``, as in the
run ledger), as record attributes: JSON log formatters and structlog's stdlib bridge pick
them up without parsing messages. Call sites pass ``extra=at(job, slot)``; a filter on
each cronlock logger fills in what a record lacks.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime

__all__ = ("at", "get_logger", "replica", "say")

_replica: tuple[int, str] | None = None


def replica() -> str:
    """This process as the run ledger names it: ``host:pid`` (recomputed after a fork)."""
    global _replica
    pid = os.getpid()
    if _replica is None or _replica[0] != pid:
        _replica = (pid, f"{socket.gethostname()}:{pid}")
    return _replica[1]


def at(job: str | None, slot: datetime | None = None) -> dict[str, object]:
    """The ``extra=`` of a record about *slot* of *job* (cheap: the slot is formatted only
    if the record is made, by the filter)."""
    return {"job": job, "slot": slot}


def say(logger: logging.Logger, level: int, job: str, slot: datetime, what: str) -> None:
    """Log ``job <job> slot <slot>: <what>`` at *level*, with the record attributes; costs
    one level check when the level is off (for the per-slot DEBUG lines of the hot path)."""
    if logger.isEnabledFor(level):
        logger.log(level, "job %r slot %s: %s", job, slot, what, extra=at(job, slot))


class _Defaults(logging.Filter):
    """Gives a record the attributes it lacks (``job``, ``slot``: None; ``replica``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        attributes = record.__dict__
        if "job" not in attributes:
            attributes["job"] = None
        slot = attributes.get("slot")
        if isinstance(slot, datetime):
            attributes["slot"] = slot.isoformat()
        elif "slot" not in attributes:
            attributes["slot"] = None
        if "replica" not in attributes:
            attributes["replica"] = replica()
        return True


_DEFAULTS = _Defaults()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, with the filter that completes every record's
    attributes (a logger's filters see only the records logged on it, hence one each)."""
    logger = logging.getLogger(name)
    if _DEFAULTS not in logger.filters:
        logger.addFilter(_DEFAULTS)
    return logger
