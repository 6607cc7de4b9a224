"""A job's run state on this replica, and the only code that changes it.

:class:`RunState` is the base of :class:`~cronlock.Job`: the state lives in the job's own
slots, one object a job rather than two (a service with 100,000 jobs pays the garbage
collector for every object it keeps), and only the private methods below assign it. The
run loop (what is planned, what is in flight), the executor (a run began, a run ended, what
the fleet's ledger says) and the scheduler's pause/resume call them; :class:`~cronlock.Job`
reads the state through public properties. Keeping the writes here gives each field one
owner, so a new reader (metrics, a dashboard) never races a half-made update.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any, TypeVar

from .._records import RunRecord

__all__ = ("RawRecord", "RunState", "fresh")

# The hot path stores (slot, started, finished, outcome) as a plain tuple; RunRecord is
# built only when somebody reads it.
RawRecord = RunRecord | tuple[Any, ...]
# Generations are drawn from one count for every job: a generation names one plan of one
# job, so the run loop's heap entries can name their job by name (a job removed and another
# registered under its name never matches the old one's entries).
_generations = itertools.count(1)


_S = TypeVar("_S", bound="RunState")
_new = object.__new__


def fresh(cls: type[_S]) -> _S:
    """A new *cls* (a subclass: ``Job``) whose run state is that of a job nothing has planned
    or run; the rest of it is the caller's to fill (no ``__init__`` runs)."""
    state = _new(cls)
    state._next_run = None
    state._raw_last_run = None
    state._raw_last_success = None
    state._run_count = 0
    state._paused = False
    state._active = 0
    state._uses = 0
    state._generation = 0
    state._history_checked = None
    state._dispatched = None
    state._claiming = 0
    return state


class RunState:
    """Mutable run state of one job on this replica (see the module docstring)."""

    __slots__ = (
        "_active",
        "_claiming",
        "_dispatched",
        "_generation",
        "_history_checked",
        "_next_run",
        "_paused",
        "_raw_last_run",
        "_raw_last_success",
        "_run_count",
        "_uses",
    )

    _next_run: datetime | None
    _raw_last_run: RawRecord | None
    _raw_last_success: RawRecord | None
    _run_count: int
    _paused: bool
    _active: int  # runs in flight or waiting for a concurrency slot
    _dispatched: datetime | None  # the latest slot the run loop dispatched (_core/outage)
    _claiming: int  # runs of it waiting for their claim's or release's answer
    # Runs accepted here that began or may still begin: what max_runs caps (a run that
    # began and goes on counts once). The fast path never takes a capped job: its runs are
    # not counted here.
    _uses: int
    _generation: int  # heap entries of another generation are stale
    _history_checked: datetime | None

    # -- planning (the run loop) -----------------------------------------------------

    def _plan(self, slot: datetime | None) -> None:
        """The next slot this replica will fire is *slot* (None: nothing planned)."""
        self._next_run = slot

    def _replan(self, slot: datetime | None) -> int:
        """:meth:`_invalidate`, then :meth:`_plan` *slot*, in one call (start plans every job)."""
        self._generation = generation = next(_generations)
        self._next_run = slot
        return generation

    def _invalidate(self) -> int:
        """Make every planned heap entry stale; return the new generation."""
        self._generation = generation = next(_generations)
        return generation

    def _dispatch(self, slot: datetime) -> None:
        """The run loop dispatched *slot*: keep the latest (an older slot owed across an
        outage coalesces into it, _core/outage.py)."""
        if self._dispatched is None or slot > self._dispatched:
            self._dispatched = slot

    def _waits(self, started: bool) -> None:
        """A run's claim or release was sent (*started*) or answered."""
        self._claiming += 1 if started else -1

    def _only_waiting(self) -> bool:
        """Whether every run of it in flight waits for the locker's answer, to its claim
        (it has not begun) or to its release (its body is done): a slot due now is not
        "while it runs" (_core/runloop.dispatch)."""
        return 0 < self._active <= self._claiming

    def _admit(self) -> None:
        """A run was accepted (started or waiting for a concurrency slot)."""
        self._active += 1
        self._uses += 1

    def _leave(self, runs: int = 1) -> None:
        """*runs* accepted runs ended or were dropped before starting."""
        self._active -= runs

    def _unuse(self, runs: int = 1) -> None:
        """*runs* accepted runs will never begin (refused, dropped, cancelled first): they
        no longer count towards ``max_runs``."""
        self._uses -= runs

    # -- runs (the executor) ---------------------------------------------------------

    def _begin(self) -> int:
        """A run starts now; return its number on this replica (1, 2, ...)."""
        self._run_count += 1
        return self._run_count

    def _launch(self, following: datetime) -> None:
        """The run loop's fast path: plan *following* and admit a run, in one call (what
        :meth:`_plan` and :meth:`_admit` do); the run begins in its task, as any other."""
        self._next_run = following
        self._active += 1

    def _finish(self, record: RawRecord) -> None:
        """A run of this replica ended as *record* says."""
        self._raw_last_run = record
        outcome = record[3] if isinstance(record, tuple) else record.outcome
        if outcome == "succeeded":
            self._raw_last_success = record

    def _succeeded(self, raw: tuple[Any, ...]) -> None:
        """A run of this replica succeeded (the hot path: *raw* is a plain tuple)."""
        self._raw_last_run = self._raw_last_success = raw

    def _learn(self, last: RunRecord | None, success: RunRecord | None) -> None:
        """Take the fleet's latest run and success from a ledger, when newer than ours."""
        if last is not None:
            mine = self._last_run_record()
            if mine is None or last.slot > mine.slot:
                self._raw_last_run = last
        if success is not None:
            mine = self._last_success_record()
            if mine is None or success.slot > mine.slot:
                self._raw_last_success = success

    def _checked(self, now: datetime) -> None:
        """The fleet's history was read at *now* (throttles the next read)."""
        self._history_checked = now

    # -- control (the scheduler) -----------------------------------------------------

    def _halt(self) -> None:
        """Stop planning runs until :meth:`_unhalt` (the job was paused)."""
        self._paused = True
        self._next_run = None

    def _unhalt(self) -> None:
        """Plan runs again (the job was resumed)."""
        self._paused = False

    def _forget_plan(self) -> None:
        """Nothing is planned (removed, paused or exhausted)."""
        self._next_run = None

    # -- reading -----------------------------------------------------------------------

    def _last_run_record(self) -> RunRecord | None:
        """The latest finished run, built from the hot path's tuple on first read."""
        raw = self._raw_last_run
        if isinstance(raw, tuple):
            record = RunRecord(*raw)
            if self._raw_last_success is raw:
                self._raw_last_success = record
            self._raw_last_run = raw = record
        return raw

    def _last_success_record(self) -> RunRecord | None:
        """The latest successful run."""
        raw = self._raw_last_success
        if isinstance(raw, tuple):
            self._raw_last_success = raw = RunRecord(*raw)
        return raw
