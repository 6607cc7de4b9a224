"""A job's run state on this replica, and the only code that changes it.

:class:`~cronlock.Job` holds configuration and reads its run state through properties;
every change goes through one of the named transitions below, called by the run loop (what
is planned, what is in flight), the executor (a run began, a run ended, what the fleet's
ledger says) and the scheduler's pause/resume. Keeping the writes here gives each field
one owner, so a new reader (metrics, a dashboard) never races a half-made update.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ._records import RunRecord

__all__ = ("RawRecord", "RunState")

# The hot path stores (slot, started, finished, outcome) as a plain tuple; RunRecord is
# built only when somebody reads it.
RawRecord = RunRecord | tuple[Any, ...]


class RunState:
    """Mutable run state of one job on this replica (see the module docstring)."""

    __slots__ = (
        "active",
        "generation",
        "history_checked",
        "next_run",
        "paused",
        "raw_last_run",
        "raw_last_success",
        "run_count",
    )

    def __init__(self) -> None:
        self.next_run: datetime | None = None
        self.raw_last_run: RawRecord | None = None
        self.raw_last_success: RawRecord | None = None
        self.run_count = 0
        self.paused = False
        self.active = 0  # runs in flight or waiting for a concurrency slot
        self.generation = 0  # heap entries of an older generation are stale
        self.history_checked: datetime | None = None

    # -- planning (the run loop) -----------------------------------------------------

    def plan(self, slot: datetime | None) -> None:
        """The next slot this replica will fire is *slot* (None: nothing planned)."""
        self.next_run = slot

    def replan(self, slot: datetime | None) -> int:
        """:meth:`invalidate`, then :meth:`plan` *slot*, in one call (start plans every job)."""
        self.generation += 1
        self.next_run = slot
        return self.generation

    def invalidate(self) -> int:
        """Make every planned heap entry stale; return the new generation."""
        self.generation += 1
        return self.generation

    def admit(self) -> None:
        """A run was accepted (started or waiting for a concurrency slot)."""
        self.active += 1

    def leave(self, runs: int = 1) -> None:
        """*runs* accepted runs ended or were dropped before starting."""
        self.active -= runs

    # -- runs (the executor) ---------------------------------------------------------

    def begin(self) -> int:
        """A run starts now; return its number on this replica (1, 2, ...)."""
        self.run_count += 1
        return self.run_count

    def launch(self, following: datetime) -> int:
        """The run loop's fast path: plan *following*, admit a run and begin it, in one call
        (what :meth:`plan`, :meth:`admit` and :meth:`begin` do); return the run's number."""
        self.next_run = following
        self.active += 1
        self.run_count += 1
        return self.run_count

    def finish(self, record: RawRecord) -> None:
        """A run of this replica ended as *record* says."""
        self.raw_last_run = record
        outcome = record[3] if isinstance(record, tuple) else record.outcome
        if outcome == "succeeded":
            self.raw_last_success = record

    def succeeded(self, raw: tuple[Any, ...]) -> None:
        """A run of this replica succeeded (the hot path: *raw* is a plain tuple)."""
        self.raw_last_run = self.raw_last_success = raw

    def learn(self, last: RunRecord | None, success: RunRecord | None) -> None:
        """Take the fleet's latest run and success from a ledger, when newer than ours."""
        if last is not None:
            mine = self.last_run()
            if mine is None or last.slot > mine.slot:
                self.raw_last_run = last
        if success is not None:
            mine = self.last_success()
            if mine is None or success.slot > mine.slot:
                self.raw_last_success = success

    def checked(self, now: datetime) -> None:
        """The fleet's history was read at *now* (throttles the next read)."""
        self.history_checked = now

    # -- control (the scheduler) -----------------------------------------------------

    def pause(self) -> None:
        """Stop planning runs until :meth:`resume`."""
        self.paused = True
        self.next_run = None

    def resume(self) -> None:
        """Plan runs again."""
        self.paused = False

    def forget_plan(self) -> None:
        """Nothing is planned (removed, paused or exhausted)."""
        self.next_run = None

    # -- reading -----------------------------------------------------------------------

    def last_run(self) -> RunRecord | None:
        """The latest finished run, built from the hot path's tuple on first read."""
        raw = self.raw_last_run
        if isinstance(raw, tuple):
            record = RunRecord(*raw)
            if self.raw_last_success is raw:
                self.raw_last_success = record
            self.raw_last_run = raw = record
        return raw

    def last_success(self) -> RunRecord | None:
        """The latest successful run."""
        raw = self.raw_last_success
        if isinstance(raw, tuple):
            self.raw_last_success = raw = RunRecord(*raw)
        return raw
