"""Fleet time: the scheduler's clock plus its measured offset to the database server's clock.

Host clocks drift apart; the replicas of a fleet share one clock they can all read, the
database server's. A :class:`FleetClock` reads the server's clock over the locker's own
session, NTP-style: the base clock is read just before and just after the server's
``clock_timestamp()``, and the server's reading is taken to be the midpoint of the two, so
the offset is ``server - (before + after) / 2``, wrong by at most half the round trip. Of
several samples the one with the shortest round trip wins (a sample delayed on the way
out or back is the one that errs most), and a round whose best sample is much slower than
the fastest round seen is not used (:class:`OffsetEstimator`).

The rules time keeps, whatever the estimates do:

- Before the first estimate the base clock's time is used (offset zero).
- When the server cannot be read, the last offset is kept, and tried again soon.
- A step of the base clock (NTP, an operator, a VM resumed) does not move fleet time: over
  a base clock that follows real time, every reading compares it with the monotonic clock,
  and a change of more than :data:`STEP` seconds since the last reading is taken out of the
  offset at once (the next estimate measures it anew). Before, fleet time followed such a
  step for up to ``ESTIMATE_EVERY`` seconds: a replica stepped 9 s ahead claimed slots 9 s
  early, and held their locks while its peers were refused (found by the soak).
- Fleet time never goes back when the offset shrinks: it holds still until the base clock
  catches up, so a slot that fired cannot come due again. When the offset grows, fleet
  time steps forward and the run loop is woken at once: slots due by then fire now, late
  by the step, as after a short stall (the usual misfire and coalescing rules apply).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from .._clock import Clock, SystemClock, follows_real_time, monotonic
from .._errors import ConfigError
from .._locking.protocols import Locker, ServerClockLocker
from .._logs import at, get_logger

__all__ = (
    "ESTIMATE_EVERY",
    "ClockSample",
    "FleetClock",
    "OffsetEstimator",
    "on_loop_time",
    "scheduler_clock",
)

_logger = get_logger("cronlock")

ESTIMATE_EVERY = 30.0
"""Seconds between two estimates of the offset (each a few round trips)."""
STEP = 0.05
"""Seconds the base clock may move against the monotonic clock between two readings before
it counts as a step (slewing by NTP moves it by well under a millisecond a second)."""
RETRY_EVERY = 2.0
"""Seconds before trying again after the server's clock could not be read."""
FIRST_SAMPLES = 8
"""Samples of the first estimate; later ones take :data:`SAMPLES`."""
SAMPLES = 4
_ZERO = timedelta(0)
_MIN = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One reading of the server's clock between two readings of the base clock (epoch s)."""

    sent: float
    """The base clock just before the request."""
    server: float
    """The server's clock, read while the request was being answered."""
    received: float
    """The base clock just after the answer."""

    @property
    def round_trip(self) -> float:
        """Seconds from request to answer: the bound on the error is half of it."""
        return self.received - self.sent

    @property
    def offset(self) -> float:
        """Seconds to add to the base clock to read the server's clock (midpoint rule)."""
        return self.server - (self.sent + self.received) / 2


class OffsetEstimator:
    """Turns rounds of samples into an offset, rejecting slow samples and slow rounds.

    In a round, the sample with the shortest round trip is kept. A round's best sample is
    used when its round trip is within *slack* (3x, or 2 ms more, whichever is larger) of
    the shortest seen, or when no estimate was used for *stale* seconds (the path to the
    server may have changed for good); otherwise the last offset stays.
    """

    def __init__(self, *, slack: float = 3.0, stale: float = 10 * ESTIMATE_EVERY) -> None:
        self.offset: float | None = None
        """The current estimate in seconds (server minus base), ``None`` before the first."""
        self.round_trip: float | None = None
        """The round trip of the sample the current estimate came from."""
        self.fastest = float("inf")
        """The shortest round trip seen."""
        self.rejected = 0
        """Rounds not used because their best sample was too slow."""
        self._slack = slack
        self._stale = stale
        self._used_at = float("-inf")

    def add(self, samples: Sequence[ClockSample], at: float) -> float | None:
        """Take one round of *samples* (at monotonic time *at*); return the offset now held."""
        if not samples:
            return self.offset
        best = min(samples, key=lambda sample: sample.round_trip)
        trip = max(best.round_trip, 0.0)
        fastest = self.fastest = min(self.fastest, trip)
        limit = max(fastest * self._slack, fastest + 0.002)
        if self.offset is None or trip <= limit or at - self._used_at >= self._stale:
            self.offset, self.round_trip, self._used_at = best.offset, trip, at
        else:
            self.rejected += 1
        return self.offset


class FleetClock:
    """A clock reading fleet time: its *base* clock plus the offset to the server's clock.

    The scheduler makes one when it coordinates through a locker that can read the
    database server's clock (:class:`cronlock.postgres.PostgresLocker`) and its own clock
    follows real time (see ``Scheduler(fleet_clock=...)``); :attr:`Scheduler.clock` is then
    this clock. The offset is measured against *base* (so an ``OffsetClock`` simulating a
    skewed host is measured, and corrected, as a skewed host would be) every
    ``ESTIMATE_EVERY`` seconds while the scheduler runs.
    """

    def __init__(self, base: Clock, source: ServerClockLocker) -> None:
        self.base = base
        """The clock the offset is added to."""
        self.estimator = OffsetEstimator()
        """The estimates so far (offset, round trip, rejected rounds)."""
        self.failures = 0
        """Rounds in a row in which the server's clock could not be read (0 once it was)."""
        self._source = source
        self._wake: Callable[[], None] | None = None
        self._adopted = False
        self._delta = _ZERO
        self._floor = _MIN  # fleet time never reads earlier than this (see now())
        # Base time minus monotonic time at the last reading: only a base clock that
        # follows real time is watched for steps (a fake one moves as its test says).
        self._watch = follows_real_time(base)
        self._gap: float | None = None
        self.steps = 0
        """Steps of the base clock taken out of the offset so far."""

    @property
    def real_time(self) -> bool:
        """Whether fleet time moves with real time: when its base clock does."""
        return follows_real_time(self.base)

    @property
    def offset(self) -> timedelta | None:
        """What is added to the base clock's time; ``None`` before the first estimate."""
        return self._delta if self._adopted else None

    def now(self) -> datetime:
        """Fleet time: the base clock's time plus the offset, never before an earlier reading
        made just before the offset shrank."""
        base = self.base.now()
        if self._watch:
            gap = base.timestamp() - monotonic()
            last, self._gap = self._gap, gap
            if last is not None and abs(gap - last) > STEP:
                self._stepped(gap - last)
        now = base + self._delta
        return now if now >= self._floor else self._floor

    def _stepped(self, jump: float) -> None:
        """The base clock stepped by *jump* seconds: take it out of the offset."""
        self._delta -= timedelta(seconds=jump)
        self.steps += 1
        _logger.warning(
            "fleet clock: the host clock stepped by %+.3f s; fleet time goes on unchanged",
            jump,
            extra=at(None),
        )

    async def sleep_until(self, deadline: datetime) -> None:
        """Sleep until fleet time reaches *deadline* (the offset may change meanwhile)."""
        while True:
            await self.base.sleep_until(deadline - self._delta)
            if self.now() >= deadline:
                return

    def adopt(self, offset: float) -> None:
        """Use *offset* seconds from now on (the run loop is woken when time steps forward).

        A step of the base clock since the last reading is taken out first: the estimate,
        made over the stepped clock, already holds it, and a reading after this one must not
        take it out again (a replica stepped back 24 s, read by nothing but the estimate
        while it slept, ran slots 24 s early)."""
        if self._watch:
            self.now()
        delta, previous = timedelta(seconds=offset), self._delta
        if delta < previous:
            self._floor = self.now()  # hold still until the base clock catches up
        self._delta, self._adopted = delta, True
        if delta > previous and self._wake is not None:
            self._wake()  # its timer was set for the old offset: slots may be due now

    async def estimate(self, samples: int) -> float | None:
        """Read the server's clock *samples* times and update the offset; return it.

        Raises what the locker raises when the server cannot be read (the offset stays).
        """
        found: list[ClockSample] = []
        read = self.base.now
        for _ in range(samples):
            sent, server, received = await self._source.read_server_clock(read)
            found.append(ClockSample(sent.timestamp(), server.timestamp(), received.timestamp()))
        return self.estimator.add(found, monotonic())

    async def keep(self, wake: Callable[[], None]) -> None:
        """Estimate now, then every ``ESTIMATE_EVERY`` seconds; *wake* the run loop when
        fleet time steps forward. Runs until cancelled (the run loop owns the task)."""
        self._wake = wake
        samples = FIRST_SAMPLES
        while True:
            try:
                offset = await self.estimate(samples)
            except Exception as exc:  # the server is down, or the locker closed
                self.failures += 1
                log = _logger.warning if self.failures == 1 else _logger.debug
                log(
                    "fleet clock: could not read the server's clock (%r); keeping %s",
                    exc,
                    self,
                    extra=at(None),
                )
                await asyncio.sleep(RETRY_EVERY)
                continue
            if self.failures:
                _logger.info("fleet clock: the server's clock can be read again", extra=at(None))
                self.failures = 0
            samples = SAMPLES
            if offset is not None:
                self.adopt(offset)
                _logger.debug("fleet clock: %s", self, extra=at(None))
            # A locker of a large fleet may ask for fewer estimates (fleet_pace(): most of
            # its replicas only stand by), up to ten times fewer: clocks drift slowly. Asked
            # again at each period, since the fleet's size is learnt after the start.
            pace = getattr(self._source, "fleet_pace", None)
            since = monotonic()
            while True:
                await asyncio.sleep(ESTIMATE_EVERY)
                slower = 1.0 if pace is None else min(pace(), 10.0)
                if monotonic() - since >= ESTIMATE_EVERY * slower - 1e-6:
                    break

    def __repr__(self) -> str:
        offset, trip = self.estimator.offset, self.estimator.round_trip
        if offset is None or trip is None:
            return "<FleetClock: no estimate yet, base clock's time>"
        return f"<FleetClock offset {offset * 1000:+.3f} ms (round trip {trip * 1000:.3f} ms)>"


def scheduler_clock(clock: Clock | None, locker: Locker | None, wanted: bool | None) -> Clock:
    """The clock a scheduler reads: a :class:`FleetClock` over *clock*, or *clock* itself
    (``None``: a :class:`SystemClock`).

    *wanted* ``None`` (the default): fleet time when *locker* can read the server's clock
    and *clock* follows real time (``SystemClock``, an ``OffsetClock`` over one); ``False``:
    never; ``True``: required, a :class:`ConfigError` when it cannot be had.
    """
    if clock is None:
        clock = SystemClock()
    if wanted is False:
        return clock
    if wanted not in (None, True):
        raise ConfigError(f"Scheduler: fleet_clock must be True, False or None, got {wanted!r}")
    if isinstance(locker, ServerClockLocker) and follows_real_time(clock):
        return FleetClock(clock, locker)
    if wanted:
        why = (
            f"its locker {locker!r} cannot read a server's clock"
            if not isinstance(locker, ServerClockLocker)
            else f"its clock {clock!r} does not follow real time (a virtual clock's time "
            "cannot be compared with the server's)"
        )
        raise ConfigError(f"Scheduler: fleet_clock=True, but {why}")
    return clock


def on_loop_time(clock: Clock) -> bool:
    """Whether *clock*'s time is the event loop's (the run loop then sleeps on a timer)."""
    if isinstance(clock, FleetClock):
        clock = clock.base
    return type(clock) is SystemClock
