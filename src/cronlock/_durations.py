"""Converters for durations given at the public boundary as seconds or timedelta."""

from __future__ import annotations

import math
from datetime import timedelta

from ._errors import ConfigError, ScheduleError

Seconds = float | int | timedelta


def to_seconds(
    value: Seconds,
    *,
    field: str,
    job: str | None = None,
    allow_zero: bool = False,
    error: type[ConfigError] = ScheduleError,
) -> float:
    """Normalise *value* to float seconds, rejecting negative, NaN and infinite values.

    Raises *error* (a job's or schedule's :class:`~cronlock.ScheduleError` by default;
    settings of schedulers, lockers and electors pass :class:`~cronlock.ConfigError`)
    naming *job*, *field* and the value.
    """
    kind = type(value)
    try:
        if kind is float or kind is int:
            seconds = float(value)  # type: ignore[arg-type]
        elif isinstance(value, timedelta):
            seconds = value.total_seconds()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
        else:
            raise error(
                f"{_where(job)}{field} must be seconds (int, float) or a timedelta, got {value!r}"
            )
    except OverflowError:  # an int past float's range: 10**400
        seconds = math.inf
    if not math.isfinite(seconds):
        raise error(f"{_where(job)}{field} must be a finite duration, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "zero or positive" if allow_zero else "positive"
        raise error(f"{_where(job)}{field} must be {bound}, got {value!r}")
    return seconds


def _where(job: str | None) -> str:
    return f"job {job!r}: " if job else ""


def optional_seconds(
    value: Seconds | None,
    *,
    field: str,
    job: str | None = None,
    allow_zero: bool = False,
    error: type[ConfigError] = ScheduleError,
) -> float | None:
    """Like :func:`to_seconds`, passing ``None`` through."""
    if value is None:
        return None
    return to_seconds(value, field=field, job=job, allow_zero=allow_zero, error=error)


def positive_int(
    value: object,
    *,
    field: str,
    owner: str = "",
    upper: int | None = None,
    error: type[ConfigError] = ConfigError,
) -> int:
    """*value* if it is an int from 1 (to *upper*), else *error* naming *owner* and *field*."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 1
        or (upper is not None and value > upper)
    ):
        bound = "a positive int" if upper is None else f"an integer from 1 to {upper}"
        raise error(f"{owner}{': ' if owner else ''}{field} must be {bound}, got {value!r}")
    return value
