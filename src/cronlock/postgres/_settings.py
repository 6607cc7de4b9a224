"""A PostgresLocker's settings, checked once when it is built (``ConfigError`` naming the
field and the value), in the units its parts use: seconds as floats, counts as ints."""

from __future__ import annotations

from dataclasses import dataclass

from .._durations import Seconds, optional_seconds, positive_int, to_seconds
from .._errors import ConfigError
from ._exclusion import Mode, checked_mode

__all__ = ("LockerSettings",)


@dataclass(frozen=True, slots=True)
class LockerSettings:
    """The checked values of :class:`PostgresLocker`'s keyword arguments of the same names."""

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
    ) -> LockerSettings:
        """Check each value; raise :class:`cronlock.ConfigError` for the first bad one."""
        owner = "PostgresLocker"

        def seconds(value: Seconds, field: str, *, zero: bool = False) -> float:
            return to_seconds(value, field=field, allow_zero=zero, error=ConfigError)

        return cls(
            mode=mode,
            sessions=positive_int(sessions, field="sessions", owner=owner, upper=64),
            remember=positive_int(remember, field="remember", owner=owner),
            racers=None if racers is None else positive_int(racers, field="racers", owner=owner),
            lease=checked_mode(mode, ledger=ledger, lease=lease),
            retention=seconds(retention, "retention"),
            heartbeat=optional_seconds(heartbeat, field="heartbeat", error=ConfigError),
            connect_timeout=seconds(connect_timeout, "connect_timeout"),
            statement_timeout=seconds(statement_timeout, "statement_timeout"),
            spread=seconds(spread, "spread", zero=True),
            claim_ahead=seconds(claim_ahead, "claim_ahead", zero=True),
        )
