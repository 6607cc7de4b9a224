"""When runs happen: firing the planned slots as they fall due, misfires, catch-up, overlap
policies and the cap (the plan itself: :mod:`cronlock._core.planner`)."""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from .._cancel import RUN_TASK, cancel_and_wait, finish_uncancellably, task_name
from .._clock import Clock, wait_tasks
from .._events import EventBus, JobEvent, JobSkipped, LockFailed
from .._locking.protocols import ASKED, Elector, FencedElector
from .._logs import at, get_logger
from .catchup import CatchUp, claim_time, latest_due, misfired, owed_slots
from .executor import BEGUN, Executor
from .fleetclock import FleetClock
from .job import Job
from .outage import Owed, unreachable
from .planner import Fast, Planner
from .retries import Retries
from .settings import schedule_text
from .slots.account import account
from .slots.fate import ONE_MICROSECOND

__all__ = ("RunLoop", "misfired")

_logger = get_logger("cronlock")

# Fires per pass of the run loop: a burst's runs start between passes, so their tasks die
# young, not in the garbage collector's older generations by the thousand.
_CHUNK = 256


async def _until_set(event: asyncio.Event) -> None:
    """Return once *event* is set (a task to wait for on the scheduler's clock)."""
    await event.wait()


# How long the first claims wait at most for catch-up's read of the ledger (seconds of the
# scheduler's clock): a server that answers slower than that gets claims meanwhile.
CATCH_UP_READ_LIMIT = timedelta(seconds=5)
# (slot, tie-breaker, job, waiter for run_now)
_Waiting = tuple[datetime, int, Job, "asyncio.Future[JobEvent] | None"]


class RunLoop:
    """Fires due slots in order and applies overlap, misfire and concurrency rules.

    Owns its :class:`~cronlock._core.executor.Executor` (how a run goes) and every task it
    spawns: the loop task, one task per run, and the clock sleeper.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        loop_time: bool,
        bus: EventBus,
        max_concurrent: int | None,
        jobs: Mapping[str, Job],
        elector: Elector | None,
        default_timeout: float | None,
        cancel_on_lock_loss: bool,
    ) -> None:
        self._clock = clock
        self._jobs = jobs  # the scheduler's, by name: what a heap entry names
        self._loop_time = loop_time  # the clock's time is the event loop's: sleep on a timer
        self._executor = executor = Executor(
            clock=clock,
            loop_time=loop_time,
            bus=bus,
            elector=elector,
            default_timeout=default_timeout,
            cancel_on_lock_loss=cancel_on_lock_loss,
        )
        if isinstance(elector, FencedElector):  # its runs are cancelled when it is demoted
            elector.on_demoted(executor.demote)
        self._bus = bus
        self._cap = max_concurrent
        # The heap and its entries (cronlock._core.planner): the planner changes the heap, the
        # loop reads its earliest entry.
        self._planner = planner = Planner(self._poke)
        self.schedule = planner.schedule  # the scheduler plans a job's first slot with it,
        self.plan_all = planner.plan_all  # and every job's at start with this
        self._heap = planner.heap
        self._waiting: list[_Waiting] = []  # runs held back by the concurrency cap
        self._seq = itertools.count()  # their tie-breaker: first held, first started
        self._queued: dict[
            Job, tuple[datetime, asyncio.Future[JobEvent] | None]
        ] = {}  # overlap="queue": one pending slot per job
        # Slots owed (a crashed run's rerun, a slot owed across an outage) waiting for the
        # job's run here to end, and what each is, for the line that says it is given up.
        self._reruns: dict[Job, tuple[datetime, str]] = {}
        # catch_up="all": the slots each job owes, oldest first, run one after another.
        self._backlog: dict[Job, collections.deque[datetime]] = {}
        self._tasks: dict[asyncio.Task[Any], Job] = {}  # every run in flight, and its job
        self._running = 0
        self._wakeup: asyncio.Future[None] | None = None
        self._stopping = False
        self._main: asyncio.Task[None] | None = None
        self._helpers: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()  # made by Scheduler.start, in its loop
        self._ended = self._finished  # bound once: every direct run is handed it
        self._fasts: dict[Fast, Fast] = {}  # one tuple for jobs alike
        self._retries = Retries(clock, bus, self._spawn, self.dispatch)  # retries=N jobs
        # Slots whose claim never reached a server (an outage): claimed again, late, once.
        self._owed = Owed(
            clock=clock,
            bus=bus,
            dispatch=self._dispatch_owed,
            owe_these=self.owe_these,
            spawn=lambda coro: self._spawn(coro, name=task_name("owed")),
        )

    def unschedule(self, job: Job) -> None:
        """Forget the job's pending slot (entries are dropped lazily when popped)."""
        job._invalidate()
        job._forget_plan()
        self._queued.pop(job, None)
        self._reruns.pop(job, None)
        self._backlog.pop(job, None)

    def start(self, catch_up: Iterable[Job] = ()) -> None:
        """Spawn the loop task, and one task catching up on the jobs in *catch_up*."""
        # Slots due by now are catch-up's (the first slots were planned after now); read
        # before the loop starts, so that the ledger tells of them, not of later ones.
        started = self._clock.now()
        read = self.catch_up([(job, job._next_run) for job in catch_up], started)
        self._main = self._loop.create_task(self._run_loop(read), name=task_name("scheduler"))
        if isinstance(self._clock, FleetClock):  # measures the offset to the server's clock
            # After catch-up: its first read opens a session the clock can then share.
            self._spawn(self._clock.keep(self._poke), name=task_name("fleet-clock"))

    def catch_up(
        self, planned: Sequence[tuple[Job, datetime | None]], started: datetime
    ) -> asyncio.Event | None:
        """Spawn a task catching up on the jobs of *planned* (each with the first slot
        planned for it) that keep a ledger, for their slots due by *started*; the event it
        sets once it has read the ledger (or ended), ``None`` when there is nothing to do."""
        if not planned:  # (those without a ledger are left out by the task, in slices)
            return None
        catching = CatchUp(
            clock=self._clock,
            bus=self._bus,
            executor=self._executor,
            dispatch=self.dispatch,
            owe_each=self.owe_each,
        )
        read = asyncio.Event()
        task = self._helper(catching.all(planned, started, read.set), name=task_name("catch-up"))
        task.add_done_callback(lambda _: read.set())  # ended early (failed, cancelled)
        return read

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run a helper task owned by the loop: cancelled and awaited at stop."""
        self._helper(coro, name)

    def _helper(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._helpers.add(task)
        task.add_done_callback(self._helpers.discard)
        return task

    async def stop(self, timeout: float) -> None:
        """Stop firing, wait up to *timeout* for runs in flight, then cancel and await them."""
        self._stopping = True
        self._poke()
        if self._main is not None:
            await finish_uncancellably(asyncio.wait((self._main,)))
        await cancel_and_wait(*self._helpers)
        for _, _, _, waiter in self._waiting:
            if waiter is not None and not waiter.done():
                waiter.cancel()
        for job in {entry[2] for entry in self._waiting}:
            dropped = sum(1 for entry in self._waiting if entry[2] is job)
            job._leave(dropped)
            job._unuse(dropped)
        self._waiting.clear()
        for _, waiter in self._queued.values():
            if waiter is not None and not waiter.done():
                waiter.cancel()
        self._queued.clear()
        tasks = self.tasks()
        if tasks:
            # A virtual clock (cronlock.testing.FakeClock) measures the wait in its own time.
            pending = await wait_tasks(self._clock, tasks, timeout)
            if pending:
                _logger.warning(
                    "shutdown: cancelled %d run(s) still going after %ss", len(pending), timeout
                )
                # Their cleanup (hold release) is bounded; wait for it even if cancelled.
                await cancel_and_wait(*pending)

    def tasks(self) -> set[asyncio.Task[Any]]:
        """Every run task in flight."""
        return set(self._tasks)

    async def _run_loop(self, read: asyncio.Event | None = None) -> None:
        loop = asyncio.get_running_loop()
        if read is not None:
            # The first claims wait for catch-up's read of the ledger (one statement per few
            # thousand jobs), up to a bound: read after them, the latest claimed slot of a
            # job would be its planned one, and the slots before it never accounted for.
            waiting = asyncio.create_task(_until_set(read), name=task_name("catch-up read"))
            bound = asyncio.create_task(
                self._clock.sleep_until(self._clock.now() + CATCH_UP_READ_LIMIT),
                name=task_name("catch-up bound"),
            )
            try:
                await asyncio.wait((waiting, bound), return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_and_wait(waiting, bound)
        while not self._stopping:
            if self.fire_due(self._clock.now(), _CHUNK):
                await asyncio.sleep(0)  # more are due: let the runs just started run first
                continue
            if self._stopping:
                break
            heap = self._heap
            self._wakeup = wakeup = loop.create_future()
            handle: asyncio.TimerHandle | None = None
            sleeper: asyncio.Task[None] | None = None
            if heap:
                deadline = self._planner.opens(heap[0])
                if self._loop_time:
                    delay = (deadline - self._clock.now()).total_seconds()
                    handle = loop.call_later(max(delay, 0.0), _set, wakeup)
                else:
                    sleeper = asyncio.create_task(
                        self._clock.sleep_until(deadline), name=task_name("sleep")
                    )
                    sleeper.add_done_callback(functools.partial(_set, wakeup))
            try:
                await wakeup
            finally:
                self._wakeup = None
                if handle is not None:
                    handle.cancel()
                if sleeper is not None and not sleeper.done():
                    await cancel_and_wait(sleeper)

    def fire_due(self, now: datetime, limit: int = -1) -> bool:
        """One pass of the run loop: fire the slots due by *now* (at most *limit*: then True)."""
        heap = self._heap
        planner = self._planner
        entry_of, replace, drop, opens = planner.entry, planner.replace, planner.drop, planner.opens
        run_direct, spawn, ended = self._executor.run_direct, self._spawn_run, self._ended
        create_task: Callable[..., asyncio.Task[Any]] = self._loop.create_task
        if self._loop.get_task_factory() is None:  # what create_task() would do, one call less
            create_task = functools.partial(asyncio.Task, loop=self._loop)
        jobs = self._jobs
        # An entry is due at its fire time; one of a crowd of slots claimed ahead opens
        # earlier (Planner.opens), and is then handled as at its time (_fire).
        while heap and (heap[0][0] <= now or opens(heap[0]) <= now):
            if not limit:
                return True
            limit -= 1
            fire, _, name, generation, slot, fast = heap[0]
            try:
                job = jobs[name]
            except KeyError:  # stale: the job was removed
                drop()
                continue
            if generation != job._generation:
                drop()  # stale: the job was rescheduled or paused
                continue
            if fast and not job._active:
                # The fast path: one slot due, on time, no run in flight, no rule to
                # apply (see _fast_of); the next entry replaces this one in one sift.
                step, grace, lane = fast
                following = slot + step
                if following > now and now - slot <= grace:
                    replace(entry_of(job, following, following, fast))
                    job._launch(following)  # planned and admitted
                    spawn(job, run_direct(job, slot, lane, ended), create_task)
                    continue
            drop()
            self._fire(job, fire, slot, now)
        return False

    def _poke(self) -> None:
        """Wake the loop so it re-reads the heap (new earliest entry, stop)."""
        if self._wakeup is not None:
            _set(self._wakeup)

    def _fire(self, job: Job, fire: datetime, slot: datetime, now: datetime) -> None:
        """Handle a popped due slot (firing at *fire*): coalesce missed ones, plan the next,
        dispatch. A slot popped ahead of its time for its claim is handled as at its time."""
        if job._wiring.ahead:
            at_its_time = self._at_its_time(job, fire, slot, now)
            if at_its_time is None:
                return
            fire, now = at_its_time
        planned = self._due(job, slot, fire, now)
        if planned is None:
            return
        latest, fire, following, next_fire = planned
        self._plan_next(job, latest, following, next_fire)
        if not self._tell_fate(job, slot, latest, fire, now):
            return
        if job.max_runs is not None and job._uses >= job.max_runs:
            return
        if latest is not slot and job._active:
            # Missed slots were told coalesced into *latest*: a run of the job here (one
            # claimed before the loop was held, run late) holds it back, not skips it.
            self.rerun(job, latest, "the run missed slots were coalesced into")
        else:
            self.dispatch(job, latest)
        if job.max_runs is not None and job._uses >= job.max_runs:
            self.unschedule(job)

    def _at_its_time(
        self, job: Job, fire: datetime, slot: datetime, now: datetime
    ) -> tuple[datetime, datetime] | None:
        """A slot of a job claimed ahead, popped early: when it fires and the instant it is
        handled as, or ``None`` when it goes back to wait for its own time."""
        at_slot = job.fire_time(slot)
        if at_slot > now and job._active:  # its own run goes on: claim at the slot
            self._planner.push(job, at_slot, slot, None)
            return None
        if fire > now and not _may_claim(job, slot, at_slot, now):
            # Opened with its crowd, earlier than it may be claimed: at its own time.
            self._planner.push(job, fire, slot, None)
            return None
        return at_slot, max(now, at_slot)

    def _due(
        self, job: Job, slot: datetime, fire: datetime, now: datetime
    ) -> tuple[datetime, datetime, datetime | None, datetime | None] | None:
        """The latest slot of *job* due at *now* from *slot* on (the usual case: *slot*),
        when it fires, the slot after it and when that fires; ``None`` when the schedule
        failed (said, and the job no longer fires)."""
        latest = slot
        try:
            following = job.following(slot)
            if following is None:
                next_fire = None
            else:
                next_fire = job.fire_time(following) if job.jitter else following
            if next_fire is not None and next_fire <= now:
                # Behind: more than one slot is due (the usual case is exactly one).
                latest, following = latest_due(job, slot, now)
                fire = job.fire_time(latest)
                next_fire = None if following is None else job.fire_time(following)
        except Exception:
            _logger.exception(
                "job %r: its schedule failed; the job will not fire", job.name, extra=at(job.name)
            )
            job._forget_plan()
            return None
        return latest, fire, following, next_fire

    def _plan_next(
        self, job: Job, latest: datetime, following: datetime | None, next_fire: datetime | None
    ) -> None:
        """Plan *job*'s slot after *latest* (*following*, firing at *next_fire*)."""
        job._plan(following)
        note = job._wiring.note
        if note is not None:
            note(job.name, schedule_text(job._schedule), following, job._settings.tags, None)
        if next_fire is None:
            return
        assert following is not None
        fast = self._fast_of(job)
        gap = None
        if job._wiring.ahead:  # claimed ahead: popped early (ClaimAheadLocker)
            gap = following - latest
            next_fire = claim_time(job, next_fire, gap)
        self._planner.push(job, next_fire, following, fast, gap)

    def _tell_fate(
        self, job: Job, slot: datetime, latest: datetime, fire: datetime, now: datetime
    ) -> bool:
        """Decide what becomes of the slots from *slot* to *latest*, due at once: whether
        *latest* is to run now (the slots before it told coalesced into it), or not (past
        its grace: missed; ``catch_up="all"``: each owed, in order)."""
        if job._settings.catch_up == "all" and (latest != slot or job in self._backlog):
            self.owe_each(job, slot, latest, _FELL_BEHIND)  # each owed slot, in order
            return False
        lateness = misfired(job.misfire_grace, fire, now)
        missed = "" if latest == slot else f" (and the missed slots from {slot.isoformat()})"
        if lateness is not None:
            _logger.warning(
                "job %r slot %s%s skipped: %.3fs late, past misfire_grace %ss",
                job.name,
                latest.isoformat(),
                missed,
                lateness,
                job.misfire_grace,
                extra=at(job.name, latest),
            )
            self._bus.emit(JobSkipped(job.name, latest, "misfire"))
            account(self._bus, job, "missed", slot, latest, _late_here(lateness, job))
            return False
        if missed:  # said once the run is sure to be tried (not when it is skipped, above)
            _logger.warning(
                "job %r: missed slots from %s to %s coalesced into one run",
                job.name,
                slot.isoformat(),
                latest.isoformat(),
                extra=at(job.name, latest),
            )
            account(self._bus, job, "coalesced", slot, latest - ONE_MICROSECOND, _FELL_BEHIND,
                    latest)  # fmt: skip
        return True

    def owe_each(self, job: Job, first: datetime, last: datetime, why: str) -> None:
        """``catch_up="all"``: *job* owes its slots from *first* to *last*; each within its
        grace runs once, in order, one after another (:meth:`_next_owed`); those past it
        are missed. *why* says how they came to be owed."""
        try:
            owed, gone = owed_slots(job, first, last, self._clock.now())
        except Exception:
            _logger.exception(
                "job %r: its schedule failed; the job will not fire", job.name, extra=at(job.name)
            )
            return
        if gone is not None:
            account(self._bus, job, "missed", first, gone, f"{why}; past misfire_grace")
            self._bus.emit(JobSkipped(job.name, gone, "misfire"))
        self.owe_these(job, owed)

    def owe_these(self, job: Job, slots: Iterable[datetime]) -> None:
        """``catch_up="all"``: *job* owes *slots* (oldest first) as well: each runs once,
        in order, while its grace lasts."""
        known = self._backlog.get(job, ())
        self._backlog[job] = collections.deque(sorted({*known, *slots}))
        self._next_owed(job)

    def _next_owed(self, job: Job) -> None:
        """Start the oldest slot *job* owes, unless its run goes on (then its end does)."""
        backlog = self._backlog.get(job)
        while backlog and not job._active:
            slot = backlog.popleft()
            lateness = misfired(job.misfire_grace, job.fire_time(slot), self._clock.now())
            if lateness is not None:
                reason = f"owed; {lateness:.1f}s late when its turn came, past misfire_grace"
                account(self._bus, job, "missed", slot, slot, reason)
                self._bus.emit(JobSkipped(job.name, slot, "misfire"))
                continue
            self.dispatch(job, slot)
        # Kept while the last owed run goes on: a slot due meanwhile waits its turn too.
        if backlog is not None and not backlog and not job._active:
            del self._backlog[job]

    def _fast_of(self, job: Job) -> Fast | None:
        """What the fast path needs to fire *job* (:meth:`Executor.fast_of`), one tuple for
        jobs alike; None when its runs need the general rules (or a concurrency cap)."""
        fast = None if self._cap is not None else self._executor.fast_of(job)
        return None if fast is None else self._fasts.setdefault(fast, fast)

    def retry(self, job: Job, slot: datetime, attempt: int) -> bool:
        """Make attempt *attempt* of *slot* of *job* now: a retry a replica gone left in
        the ledger (:meth:`.retries.Retries.resume`); False when it is not made."""
        return self._retries.resume(job, slot, attempt)

    def rerun(self, job: Job, slot: datetime, what: str = "a crashed run's rerun") -> None:
        """Run *slot* of *job* again (a crashed run's rerun, a claim lost before its body
        began). While this replica runs the job and its overlap policy would skip the
        slot, the slot is owed, not skipped: it runs once that run has ended, if its grace
        still lasts then (:meth:`_finished`). *what* names it in the WARNING that says
        its grace passed first."""
        if (
            job._active
            and job.overlap in ("skip", "queue")
            and not job._only_waiting()
            and job not in self._reruns
        ):
            self._reruns[job] = (slot, what)
            return
        self.dispatch(job, slot)

    def _dispatch_owed(self, job: Job, slot: datetime) -> None:
        """A slot owed across an outage, claimed again (:class:`.outage.Owed`): a run of
        the job here (a claim stuck in the outage, answered late) holds it back rather than
        skipping it, as a crashed run's rerun is."""
        self.rerun(job, slot, "owed across an outage")

    def dispatch(
        self, job: Job, slot: datetime, waiter: asyncio.Future[JobEvent] | None = None
    ) -> None:
        """Apply the overlap policy and the concurrency cap, then start the run."""
        replaced: tuple[asyncio.Task[Any], ...] = ()
        if job._active:
            policy = job.overlap
            if waiter is None and job._only_waiting() and job._wiring.ledger is not None:
                # Its run has not begun, or its body is done: its claim or release waits on
                # a server that does not answer (a primary gone silent). The slot is owed,
                # not skipped "while running": claimed again once nothing is in flight, or
                # coalesced into a later one.
                job._dispatch(slot)
                self._owed.owe(job, slot)
                return
            if policy == "skip" or (policy == "queue" and job in self._queued):
                _logger.debug(
                    "job %r slot %s skipped: still running",
                    job.name,
                    slot,
                    extra=at(job.name, slot),
                )
                event = JobSkipped(job.name, slot, "overlap")
                self._bus.emit(event)
                account(self._bus, job, "skipped", slot, slot, _BUSY[policy == "queue"])
                if waiter is not None and not waiter.done():
                    waiter.set_result(event)
                return
            if policy == "queue":
                job._dispatch(slot)
                self._queued[job] = (slot, waiter)
                return
            if policy == "replace":
                replaced = tuple(t for t, j in self._tasks.items() if j is job)
                for task in replaced:
                    task.cancel()
                self._drop_waiting(job)
        # An older slot owed (across an outage, or lost before it began) coalesces into
        # this one: not into one the overlap policy skipped (it runs nowhere).
        job._dispatch(slot)
        job._admit()
        if self._cap is not None and self._running >= self._cap:
            heapq.heappush(self._waiting, (slot, next(self._seq), job, waiter))
            return
        self._start(job, slot, waiter, replaced)

    def _drop_waiting(self, job: Job) -> None:
        kept = [entry for entry in self._waiting if entry[2] is not job]
        dropped = len(self._waiting) - len(kept)
        if dropped:
            job._leave(dropped)
            job._unuse(dropped)
            self._waiting = kept
            heapq.heapify(self._waiting)

    def _start(
        self,
        job: Job,
        slot: datetime,
        waiter: asyncio.Future[JobEvent] | None,
        replaced: tuple[asyncio.Task[Any], ...] = (),
    ) -> None:
        """Start an admitted run: on the direct path when nobody waits for it and no run it
        replaces must end first (the fast path's runs are these too), else the general."""
        executor = self._executor
        if waiter is None and not replaced and executor.takes_direct(job):
            run = executor.run_direct(job, slot, executor.lane_of(job), self._ended)
        else:
            run = self._run(job, slot, waiter, replaced)
        self._spawn_run(job, run, self._loop.create_task)

    def _spawn_run(
        self,
        job: Job,
        run: Coroutine[Any, Any, None],
        create_task: Callable[..., asyncio.Task[Any]],
    ) -> None:
        """Every run's task starts here: counted in flight and owned by the loop (awaited or
        cancelled at stop); its coroutine ends in :meth:`_finished`."""
        self._running += 1
        self._tasks[create_task(run, name=RUN_TASK + job.name)] = job

    async def _run(
        self,
        job: Job,
        slot: datetime,
        waiter: asyncio.Future[JobEvent] | None,
        replaced: tuple[asyncio.Task[Any], ...],
    ) -> None:
        if waiter is not None:
            ASKED.set(True)  # in this task's own context: the locker claims it even on standby
        event = None
        try:
            if replaced:
                # "replace": the old run's cleanup (lock release) finishes before we start.
                await asyncio.wait(replaced)
            # A run that goes on past its outcome (a timed-out thread) tells its waiter
            # the outcome at once: run_now() returns at the timeout, as for any run.
            tell = None if waiter is None else functools.partial(_tell, waiter)
            # A retry's attempt (2, 3, ...) is known here; every other run is a first one.
            attempt = self._retries.attempt(job, slot) if job._settings.retries else 1
            event = await self._executor.run(
                job, slot, report=waiter is not None, tell=tell, attempt=attempt
            )
            if (
                waiter is None
                and isinstance(event, LockFailed)
                and job._wiring.ledger is not None
                and unreachable(event.exception)
                and not self._stopping
            ):
                self._owed.owe(job, slot)  # claimed again once the server answers
            elif (
                waiter is None
                and isinstance(event, JobSkipped)
                and event.reason == "locked"
                and self._owed.carries(job, slot)
                and not self._stopping
            ):
                self._owed.owe(job, slot)  # older owed slots ride on it: claimed again
            if waiter is not None and event is not None and not waiter.done():
                waiter.set_result(event)
        except asyncio.CancelledError:
            if waiter is not None and not waiter.done():
                waiter.cancel()
            raise
        except Exception:  # a bug of ours: never let it kill the scheduler
            _logger.exception(
                "job %r slot %s: internal error", job.name, slot, extra=at(job.name, slot)
            )
            if waiter is not None and not waiter.done():
                waiter.cancel()
        finally:
            if job._settings.retries:  # after the release: the ledger has the outcome
                self._retries.ended(job, slot, event)
            if not BEGUN.get():  # refused, or cancelled before it began
                job._unuse()
            self._finished(job, asyncio.current_task())

    def _finished(self, job: Job, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks.pop(task, None)
        job._leave()
        self._running -= 1
        if self._stopping:
            return
        if self._reruns and not job._active:
            held = self._reruns.pop(job, None)
            if held is not None:
                self._rerun_owed(job, *held)
        if self._backlog and not job._active and job in self._backlog:
            self._next_owed(job)
        if self._queued:
            queued = self._queued.pop(job, None)
            if queued is not None:
                self.dispatch(job, *queued)
        while self._waiting and (self._cap is None or self._running < self._cap):
            slot, _, waiting_job, waiter = heapq.heappop(self._waiting)
            self._start(waiting_job, slot, waiter)

    def _rerun_owed(self, job: Job, slot: datetime, what: str) -> None:
        """The run that held back *slot* (*what* it is: a crashed run's rerun, a slot owed
        across an outage) ended: run it, within its grace."""
        lateness = misfired(job.misfire_grace, job.fire_time(slot), self._clock.now())
        if lateness is not None:
            _logger.warning(
                "job %r slot %s: not run (%s): this replica ran the job until %.1fs "
                "after the slot, past misfire_grace (%ss)",
                job.name,
                slot.isoformat(),
                what,
                lateness,
                job.misfire_grace,
                extra=at(job.name, slot),
            )
            self._bus.emit(JobSkipped(job.name, slot, "misfire"))
            return
        self.dispatch(job, slot)


_FELL_BEHIND = "this replica fired them late, all at once (its event loop was held)"

_BUSY = (
    "overlap='skip': the job was still running",
    "overlap='queue': the job was still running and a slot already waited",
)


def _late_here(lateness: float, job: Job) -> str:
    return f"fired {lateness:.1f}s late here, past misfire_grace ({job.misfire_grace}s)"


def _may_claim(job: Job, slot: datetime, at_slot: datetime, now: datetime) -> bool:
    """Whether *slot* of *job* (firing *at_slot*) may be claimed at *now*: no earlier than
    a quarter of its period before it, as any claim ahead (:func:`.catchup.claim_time`)."""
    try:
        following = job.following(slot)
    except Exception:  # said where the slot is fired (_fire)
        return True
    return following is not None and at_slot - now <= (following - slot) / 4


def _tell(waiter: asyncio.Future[JobEvent], event: JobEvent) -> None:
    if not waiter.done():
        waiter.set_result(event)


def _set(future: asyncio.Future[None], _: object = None) -> None:
    if not future.done():
        future.set_result(None)
