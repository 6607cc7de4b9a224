"""When a lock session that cannot connect may try again: exponential backoff with jitter.

A server that is down (restarting, failed over, unreachable) must not be hammered: with a
thousand jobs due each second, retrying on every acquire would be a thousand connection
attempts per second against it, from every replica, and as many ERROR lines. So after a
failed connect a session waits before trying again, and every acquire in the meantime
fails at once with :class:`cronlock.LockUnavailable`, without touching the network. The
wait starts at :data:`RECONNECT_FIRST` and doubles after each failure, up to
:data:`RECONNECT_BRISK` for the first :data:`BRISK_FAILURES` failures (an outage of a few
seconds, a failover to a standby: the first claim after the server is back goes out
within about a second) and up to :data:`RECONNECT_MAX` after them; it is jittered
(replicas that lost the server together do not come back in lockstep) and starts over
after a success.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from logging import DEBUG, ERROR

from ..._errors import LockerMisconfigured
from ..._logs import get_logger
from .primary import NotPrimary

__all__ = (
    "BRISK_FAILURES",
    "RECONNECT_BRISK",
    "RECONNECT_FIRST",
    "RECONNECT_JITTER",
    "RECONNECT_MAX",
    "STILL_DOWN_EVERY",
    "Backoff",
    "backoff_step",
)

_logger = get_logger("cronlock.postgres")

RECONNECT_FIRST = 0.1
"""Seconds a session waits after its first failed connect (before jitter)."""
RECONNECT_MAX = 5.0
"""The longest wait between two connect attempts of one session: the doubling stops here."""
RECONNECT_BRISK = 1.0
"""The longest wait in the first :data:`BRISK_FAILURES` failures of an outage."""
BRISK_FAILURES = 16
"""Failed connects in a row (some 10 s of outage) before the waits may grow past
:data:`RECONNECT_BRISK`."""
RECONNECT_JITTER = 0.5
"""Each wait is the step times a factor drawn from [1 - RECONNECT_JITTER, 1]."""
STILL_DOWN_EVERY = 60.0
"""Seconds between two WARNINGs while a session still cannot connect (one ERROR first)."""


def backoff_step(failures: int) -> float:
    """The wait after *failures* failed connects in a row, before jitter."""
    if failures <= BRISK_FAILURES:
        return min(RECONNECT_BRISK, RECONNECT_FIRST * 2.0 ** (failures - 1))
    return min(RECONNECT_MAX, RECONNECT_BRISK * 2.0 ** min(failures - BRISK_FAILURES, 64))


class Backoff:
    """The reconnect state of one session: failures in a row, and when to try next.

    Times are seconds on one monotonic clock, passed in (``now``); *draw* gives the jitter
    factor's random part in [0, 1). *what* names the server in log lines.
    """

    def __init__(self, what: str, *, draw: Callable[[], float] = random.random) -> None:
        self._what = what
        self._draw = draw
        self.failures = 0
        """Failed connects in a row; 0 once a connect succeeded."""
        self.attempts = 0
        """Connects tried since the session was made (successful ones included)."""
        self.total_failures = 0
        """Connects that failed since the session was made."""
        self.retry_at = float("-inf")
        """Before this instant a connect is not tried."""
        self.last_error: BaseException | None = None
        self._down_since: float | None = None
        self._warned_at = float("-inf")
        self._quiet = False

    def wait(self, now: float) -> float:
        """Seconds until a connect may be tried; 0 when it may be tried now."""
        return max(0.0, self.retry_at - now)

    def lost(self, now: float) -> None:
        """The session's connection was dropped: the outage (if any) starts now."""
        if self._down_since is None:
            self._down_since = now

    def trying(self) -> None:
        """A connect is being tried."""
        self.attempts += 1

    def failed(self, now: float, exc: BaseException, *, said: bool = False) -> float:
        """A connect failed with *exc*: log it (once, then rate-limited); return the wait.

        *said*: another session of the same source said it already (an outage is news
        once per source, not once per session): the first failure is then logged at DEBUG
        too, and so are the WARNINGs while it lasts (that other session's say it)."""
        self.failures += 1
        self.total_failures += 1
        self.last_error = exc
        if self._down_since is None:
            self._down_since = now
        delay = backoff_step(self.failures) * (1.0 - RECONNECT_JITTER * self._draw())
        self.retry_at = now + delay
        if self.failures == 1:
            self._warned_at = now
            self._quiet = said  # another session says it, and goes on saying it
            _logger.log(
                DEBUG if said else ERROR,
                "lock session: %s the %s (%s); the slots due meanwhile are claimed again until "
                "their misfire_grace passes; retrying in %.2fs, backing off up to %gs",
                _failure(exc),
                self._what,
                exc,
                delay,
                RECONNECT_MAX,
            )
        elif now - self._warned_at >= STILL_DOWN_EVERY and not self._quiet:
            self._warned_at = now
            _logger.warning(
                "lock session: still cannot connect to the %s after %.0fs (%d attempts): %s; "
                "retrying in %.2fs",
                self._what,
                now - self._down_since,
                self.failures,
                exc,
                delay,
            )
        else:
            _logger.debug(
                "lock session: connect attempt %d failed (%s); retrying in %.2fs",
                self.failures,
                exc,
                delay,
            )
        return delay

    def succeeded(self, now: float, *, again: bool) -> None:
        """A connect succeeded; *again*: it replaces an earlier connection. Start over."""
        if self._down_since is not None:
            _logger.info(
                "lock session: %s after %.1fs (%d failed attempt(s))",
                "reconnected" if again else "connected",
                now - self._down_since,
                self.failures,
            )
        self.failures = 0
        self.retry_at = float("-inf")
        self.last_error = None
        self._down_since = None


def _failure(exc: BaseException) -> str:
    """How a failed connect is said: a server that is not the primary, a set-up refused as
    configured (a privilege, the ledger missing: the message names the fix), or no
    connection."""
    if isinstance(exc, NotPrimary):
        return "found no primary at"
    if isinstance(exc, LockerMisconfigured):
        return "cannot use, as configured,"
    return "cannot connect to"
