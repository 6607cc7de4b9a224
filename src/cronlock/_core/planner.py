"""The run loop's plan: each job's next slot as an entry in one heap, ordered by fire time.

:class:`Planner` owns the heap: it makes every entry (:meth:`Planner.entry`: the
tie-breaker; the job's first slot after an instant, its jitter, its claim ahead) and is the
only code that changes the heap; the run loop (:mod:`cronlock._core.runloop`) reads the earliest
entry and asks the planner to drop it, replace it with the next (``Planner.replace``) or
queue another (:meth:`Planner.push`). An entry names its job and the plan's generation: a
job re-planned, paused or removed leaves stale entries, dropped when they come first.

**Crowds.** Slots claimed ahead (:class:`~cronlock.ClaimAheadLocker`) go out a moment before
their instant, so that a won claim's run starts on it. Thousands of them due at one instant
(a tenant's report at 08:00, times ten thousand) take this replica longer than that moment
to fire and claim: the planner counts the entries claimed ahead per fire instant, and a
crowd of them opens earlier by :data:`CLAIM_COST` each (at most :data:`MAX_LEAD`), so that
their claims are answered by the instant and their runs start on it, as one job's does. (A
slot is never claimed earlier than a quarter of its period before it: the run loop queues
one whose crowd opened earlier than that again, uncounted, at its own time.)
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import random
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from .._logs import at, get_logger
from .._schedules.interval import IntervalSchedule
from .._schedules.once import OnceSchedule
from .catchup import claim_time
from .guard import Lane
from .job import Job, default_name
from .settings import schedule_text
from .slots.fate import job_spec

__all__ = ("UNKNOWN", "Entry", "Fast", "Planner")

_logger = get_logger("cronlock")

# (step to the next slot, misfire grace, deadline lane): a job the fast path fires
Fast = tuple[timedelta, timedelta, "Lane | None"]
# (fire time, tie-breaker, job name, plan generation, slot, Fast or None: general rules).
# By name: an entry with no Fast yet holds nothing the garbage collector has to track.
Entry = tuple[datetime, int, str, int, datetime, "Fast | None"]
_ONE_MICROSECOND = timedelta(microseconds=1)
# An entry's Fast until the job's first fire has looked: falsy like None (general rules),
# and the empty tuple, which the garbage collector does not track.
UNKNOWN: Any = ()
_UNPLANNED: Any = object()  # plan_all: no job of this schedule object planned yet
CROWD = 256
"""Entries claimed ahead due at one instant from which they are a crowd, opened early."""
CLAIM_COST = timedelta(microseconds=400)
"""How much earlier a crowd opens per entry in it: about what firing and claiming one slot
costs a replica when its peers claim the same slots on the same cores (benchmarks/burst.py)."""
MAX_LEAD = timedelta(seconds=5)
"""The earliest a crowd opens before its entries' fire time (25,000 entries and more)."""


class Planner:
    """Makes the run loop's heap entries and owns its heap.

    *poke* wakes the run loop when a new entry comes first (it sleeps until the earliest).
    """

    def __init__(self, poke: Callable[[], None]) -> None:
        self.heap: list[Entry] = []  # the run loop reads it; only the planner changes it
        self._seq = itertools.count()
        self._draw = random.Random().getrandbits  # seeded from the OS: each replica its own
        self._poke = poke
        # Entries claimed ahead queued per fire instant (small ints: a singleton costs its
        # dict slot alone); an instant is forgotten once the heap has gone past it (drop).
        self._crowds: dict[datetime, int] = {}
        self._counted = 0  # entries counted there still queued (stale ones included)
        # The fast path fired the earliest entry: replace it with the job's next (an entry
        # made by entry()), one sift where a pop and a push take two, and one C call. (A
        # fast entry is never in a crowd: its job is not gated.)
        self.replace: Callable[[Entry], Entry] = functools.partial(heapq.heapreplace, self.heap)

    def entry(
        self,
        job: Job,
        fire: datetime,
        slot: datetime,
        fast: Fast | None,
        gap: timedelta | None = None,
    ) -> Entry:
        """The heap entry of *slot* of *job*, due at *fire*, in the job's current plan
        generation (every entry is made here). *gap* (from the job's previous slot to this
        one) marks a slot claimed ahead (:func:`.catchup.claim_time`), which may then open
        early in a crowd (the module); an entry made with a gap must be queued.

        Its tie-breaker: first come, first served, except gated jobs, drawn per entry,
        so replicas go through a burst in different orders (in one, the first awake claims
        all). An entry counted in a crowd has a negative one: first among the entries of
        its instant, so that none of another kind holds the crowd back from opening."""
        seq = next(self._seq)
        wiring = job._wiring
        if not fast and wiring.gated:  # (a fast entry's job is never gated)
            seq |= self._draw(64) << 64
            if gap is not None and wiring.ahead:
                seq = -seq - 1
                crowds = self._crowds
                crowds[fire] = crowds.get(fire, 0) + 1
                self._counted += 1
        return (fire, seq, job.name, job._generation, slot, fast)

    def drop(self) -> Entry:
        """Remove the earliest entry (fired by the general rules, or stale)."""
        heap = self.heap
        entry = heapq.heappop(heap)
        crowds = self._crowds
        if crowds:
            if entry[1] < 0:  # counted in a crowd
                self._counted -= 1
            fire = entry[0]
            if not heap or heap[0][0] != fire:  # the heap is past the instant: forget it
                crowds.pop(fire, None)
            if len(crowds) > self._counted + 1024:
                # Instants the heap went past on the fast path (an ungated job's entry
                # the last one of its instant): forgotten a thousand at a time.
                top = heap[0][0] if heap else None
                self._crowds = {f: n for f, n in crowds.items() if top is not None and f >= top}
        return entry

    def opens(self, entry: Entry) -> datetime:
        """When the run loop pops *entry*: at its fire time, or earlier when it is one of a
        crowd of slots claimed ahead at that instant (see the module; the run loop claims
        one at its own time still when the crowd's lead is more than it may take)."""
        fire = entry[0]
        if entry[1] >= 0:  # not counted in a crowd
            return fire
        planned = self._crowds.get(fire, 0)
        if planned < CROWD:
            return fire
        lead: timedelta = min(planned * CLAIM_COST, MAX_LEAD)
        return fire - lead

    def push(
        self,
        job: Job,
        fire: datetime,
        slot: datetime,
        fast: Fast | None,
        gap: timedelta | None = None,
    ) -> None:
        """Queue *slot* of *job*, due at *fire* (:meth:`entry`)."""
        entry = self.entry(job, fire, slot, fast, gap)
        heapq.heappush(self.heap, entry)
        if self.heap[0] is entry:
            self._poke()  # the new entry is the earliest: the loop sleeps too long

    def schedule(self, job: Job, after: datetime) -> None:
        """Queue the job's first slot strictly after *after* (or mark it exhausted)."""
        entry = self._first_entry(job, self._first(job, after))
        if entry is not None:
            heapq.heappush(self.heap, entry)
            if self.heap[0] is entry:
                self._poke()  # the new entry is the earliest: the loop sleeps too long

    def plan_all(self, jobs: Iterable[Job], after: datetime) -> None:
        """At start: queue every job's first slot after *after*, with one heapify for all.
        Jobs given one schedule object (every() reuses them) share its first slot, and jobs
        alike one datetime (48 B each)."""
        firsts: dict[int, datetime | None] = {}
        interned: dict[datetime, datetime] = {}
        append, entry_of = self.heap.append, self._first_entry
        for job in jobs:
            schedule = job._schedule
            unbounded = job._settings.unbounded
            slot = firsts.get(id(schedule), _UNPLANNED) if unbounded else _UNPLANNED
            if slot is _UNPLANNED:
                slot = self._first(job, after)
                if slot is not None:
                    slot = interned.setdefault(slot, slot)
                if unbounded and job._schedule is schedule:  # (not a once() at start's)
                    firsts[id(schedule)] = slot
            entry = entry_of(job, slot)
            if entry is not None:
                append(entry)
        heapq.heapify(self.heap)
        self._poke()

    def _first(self, job: Job, after: datetime) -> datetime | None:
        """The job's first slot after *after*; None (logged) when its schedule fails. A
        ``once()`` without a time is given its slot here: the instant it is first planned."""
        schedule = job._schedule
        # The type first: isinstance() of another class costs ~400 instructions.
        if (
            type(schedule) is not IntervalSchedule
            and isinstance(schedule, OnceSchedule)
            and schedule.at_start
        ):
            job.set_schedule(OnceSchedule(instants=(after,)))
            after -= _ONE_MICROSECOND
        try:
            return job.slot_after(after)
        except Exception:
            _logger.exception(
                "job %r: its schedule failed; the job will not fire", job.name, extra=at(job.name)
            )
            return None

    def _first_entry(self, job: Job, slot: datetime | None) -> Entry | None:
        """Plan *slot* (None: nothing) as the job's next, and make its heap entry."""
        job._replan(slot)  # a new generation: stale entries of the job are dropped
        wiring = job._wiring
        if wiring.note is not None:
            # With its function: what it runs and when is its definition in the fleet.
            tags, target = job._settings.tags, default_name(job.func)
            wiring.note(job.name, schedule_text(job._schedule), slot, tags, target)
        if wiring.describe is not None:  # how a reader of the ledger rebuilds its slots
            wiring.describe(job.name, job_spec(job))
        if slot is None:
            return None
        fire = job.fire_time(slot) if job._settings.jitter else slot
        gap = None
        if wiring.ahead:  # its claim goes out before the first slot too (ClaimAheadLocker)
            with contextlib.suppress(Exception):  # (a failing schedule fails at its slot)
                following = job.following(slot)
                if following is not None:
                    gap = following - slot
                    fire = claim_time(job, fire, gap)
        return self.entry(job, fire, slot, UNKNOWN, gap)
