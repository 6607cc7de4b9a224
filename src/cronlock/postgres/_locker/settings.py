"""A PostgresLocker's settings, checked once when it is built (``ConfigError`` naming the
field and the value), in the units its parts use: seconds as floats, counts as ints."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..._durations import Seconds, optional_seconds, positive_int, to_seconds
from ..._errors import ConfigError
from ..._locking.protocols import RETENTION_MARGIN
from ..._logs import get_logger
from .._modes import check_pool_room, checked_mode
from .._modes.base import Mode

__all__ = ("MAX_RETENTION", "MIN_RETENTION", "LockerSettings")

MIN_RETENTION = RETENTION_MARGIN
"""The shortest retention, one hour: a row is what refuses a late claim of its slot, and
each job's own lateness (misfire_grace, jitter) is checked on top when it is registered."""
MAX_RETENTION = 100 * 365.25 * 86_400
"""The longest retention, 100 years: past about 6,700 the prune's ``clock_timestamp() -
retention`` is out of PostgreSQL's range and every prune failed."""

_logger = get_logger("cronlock.postgres")


@dataclass(frozen=True, slots=True)
class LockerSettings:
    """The checked values of :class:`PostgresLocker`'s keyword arguments of the same names
    (``retention`` infinite without a ledger)."""

    mode: Mode
    sessions: int
    remember: int
    racers: int | None
    lease: float
    retention: float
    heartbeat: float | None
    connect_timeout: float
    statement_timeout: float
    spread: float
    claim_ahead: float

    @classmethod
    def check(
        cls,
        *,
        mode: Mode,
        ledger: bool,
        sessions: int,
        remember: int,
        racers: int | None,
        lease: Seconds,
        retention: Seconds,
        heartbeat: Seconds | None,
        connect_timeout: Seconds,
        statement_timeout: Seconds,
        spread: Seconds,
        claim_ahead: Seconds,
        pool: object = None,
    ) -> LockerSettings:
        """Check each value; raise :class:`cronlock.ConfigError` for the first bad one.

        *pool* is what the locker was given: an asyncpg pool is checked for room
        (:func:`check_pool_room`), anything else is left to the connection source.
        """
        owner = "PostgresLocker"

        def seconds(value: Seconds, field: str, *, zero: bool = False) -> float:
            return to_seconds(value, field=field, allow_zero=zero, error=ConfigError)

        sessions = positive_int(sessions, field="sessions", owner=owner, upper=64)
        check_pool_room(pool, mode=mode, sessions=sessions)
        kept = _retention(seconds(retention, "retention"))
        return cls(
            mode=mode,
            sessions=sessions,
            remember=positive_int(remember, field="remember", owner=owner),
            racers=None if racers is None else positive_int(racers, field="racers", owner=owner),
            lease=checked_mode(mode, ledger=ledger, lease=lease),
            # Without a ledger nothing is pruned: no job's grace can outlast it.
            retention=kept if ledger else math.inf,
            heartbeat=optional_seconds(heartbeat, field="heartbeat", error=ConfigError),
            connect_timeout=seconds(connect_timeout, "connect_timeout"),
            statement_timeout=seconds(statement_timeout, "statement_timeout"),
            spread=seconds(spread, "spread", zero=True),
            claim_ahead=seconds(claim_ahead, "claim_ahead", zero=True),
        )


def _retention(value: float) -> float:
    if value < MIN_RETENTION:
        raise ConfigError(
            f"PostgresLocker: retention={value:g}s is shorter than {MIN_RETENTION:g}s (one "
            "hour): a ledger row is what answers a late claim of its slot 'already_ran', and "
            "a replica that lags could claim a slot whose row was pruned and run it a second "
            "time; pass retention=3600 or more (default: 30 days)"
        )
    if value > MAX_RETENTION:
        raise ConfigError(
            f"PostgresLocker: retention={value:g}s is longer than {MAX_RETENTION:.0f}s (100 "
            "years), past which the prune's cut-off leaves PostgreSQL's range; pass a shorter "
            "one (default: 30 days)"
        )
    return value
