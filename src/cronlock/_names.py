"""What a job's name may be, checked once at registration, and how a name nobody knows
is reported.

A name is a key of the run ledger (``PRIMARY KEY (job, slot)`` and the jobs table's key),
a log field and a cell of the command line's tables. One name the server refuses (a NUL
is not valid in PostgreSQL text, a lone surrogate is not UTF-8, a key of a few kilobytes
is past a btree's row limit) would fail the batched statements every job shares, so it is
refused here, before it reaches a ledger: at most :data:`MAX_NAME` characters, none of
them a control character (C0, DEL, C1) or a lone surrogate.

One rule for naming a job, everywhere: a name nobody knows is refused with the same
message (with a did-you-mean for a close name) by the scheduler
(:func:`cronlock._scheduler.job_named`), :class:`cronlock.postgres.FleetControl` and the
command line.
"""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable

from ._errors import ScheduleError

__all__ = ("MAX_NAME", "check_job_name", "unknown_job")

MAX_NAME = 200
"""Characters a job's name has at most: 800 bytes of UTF-8 at worst, well within the
2,704 bytes a PostgreSQL btree entry (the ledger's keys) may take."""

_SHOWN = 60  # characters of a refused name the message repeats


def _shown(name: str) -> str:
    return repr(name) if len(name) <= _SHOWN else f"{name[:_SHOWN]!r}... ({len(name)} characters)"


def check_job_name(name: object, *, field: str = "name") -> str:
    """*name*, if it is a valid job name; else :class:`~cronlock.ScheduleError` naming the
    (truncated) name, the *field* and what is wrong with it."""
    if not isinstance(name, str) or not name:
        raise ScheduleError(f"job {field} must be a non-empty string, got {_shown_any(name)}")
    # The common case in one C call: printable text (no control, format or surrogate
    # character, no separator but the space) of a sound length.
    if len(name) <= MAX_NAME and name.isprintable():
        return name
    if len(name) > MAX_NAME:
        raise ScheduleError(
            f"job {_shown(name)}: {field} is longer than {MAX_NAME} characters ({len(name)})"
        )
    for index, char in enumerate(name):
        kind = unicodedata.category(char)
        if kind == "Cc":
            what = "a NUL" if char == "\x00" else f"the control character {char!r}"
        elif kind == "Cs":
            what = f"a lone surrogate {char!r} (not encodable as UTF-8)"
        else:
            continue  # a format character or a separator: odd, but valid text
        raise ScheduleError(
            f"job {_shown(name)}: {field} contains {what} at position {index}; "
            "a job's name must be valid text without control characters"
        )
    return name


def _shown_any(value: object) -> str:
    return _shown(value) if isinstance(value, str) else repr(value)[: _SHOWN + 3]


def unknown_job(name: str, known: Iterable[str]) -> str:
    """``unknown job: NAME``, with ``(did you mean OTHER?)`` when a known name is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown job: {name}{hint}"
