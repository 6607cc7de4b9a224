"""Prometheus metrics for a scheduler: ``cronlock.prometheus.instrument(scheduler)``.

Needs the ``prometheus`` extra (``pip install -e '.[prometheus]'`` from a clone,
``pip install 'cronlock[prometheus]'`` once cronlock is on PyPI); ``import cronlock`` never
imports it. The metric names are part of the API. Every series of a job carries its name
in the label ``cronlock_job`` (``job`` and ``instance`` are the labels Prometheus gives
every scraped series: the scrape job, the target):

- ``cronlock_job_last_success_timestamp_seconds`` and
  ``cronlock_job_last_run_timestamp_seconds`` (when the latest successful / finished run
  ended; fleet-wide with a run ledger: every replica reports the fleet's, read every 15
  seconds in one statement, never per scrape),
- ``cronlock_job_next_run_timestamp_seconds``, ``cronlock_job_overdue`` (0/1, see
  :meth:`cronlock.Scheduler.overdue`), ``cronlock_job_paused`` (0/1, here or fleet-wide),
  ``cronlock_job_conflict`` (0/1: other live replicas of its ledger define a job of its
  name otherwise, another function or schedule, see :meth:`cronlock.Scheduler.in_conflict`;
  read with the fleet's latest runs, every 15 seconds),
- ``cronlock_job_without_success_since_timestamp_seconds`` (see
  :meth:`cronlock.Scheduler.without_success_since`: "no success in N days" is
  ``time() - ... > N * 86400``; left out for paused and finished jobs, of which nothing is
  expected),
- ``cronlock_runs_total{outcome}``, ``cronlock_skips_total{reason}`` (lock contention is
  ``reason="locked"``/``"already_ran"``; ``"standby"`` on the replicas of a large fleet that
  leave the claims to its racers), ``cronlock_lock_errors_total`` (this replica's),
  ``cronlock_lock_held_elsewhere_total`` (a session outside the fleet holds the job's lock:
  :class:`~cronlock.LockHeldElsewhere`), ``cronlock_retries_total`` (attempts retried after
  a failed one: :class:`~cronlock.JobRetrying`; a retry's start is not counted as a late
  start), ``cronlock_runs_restored_total`` (runs a failover lost and this replica wrote
  back on the new primary: :class:`~cronlock.RunRestored`), ``cronlock_runs_overran_total``
  (timed-out runs of plain functions whose worker thread ran on past the deadline, counted
  when it returned: :class:`~cronlock.RunOverran`), ``cronlock_slots_ran_twice_total``
  (slots this replica ran that another replica ran too after a failover:
  :class:`~cronlock.SlotRanTwice`), ``cronlock_slots_total{fate}`` (slots by fate, DESIGN.md
  §3a: ``ran`` and ``ran_late`` counted by the replica that ran them, when the run began;
  ``coalesced``, ``missed`` and ``skipped`` by the replica that decided it,
  :class:`~cronlock.SlotsDecided`; ``history JOB --slots`` lists them from the ledger),
  ``cronlock_schedules_rejected_total{schedule}``
  (revisions of stored schedules this replica could not register, once a revision and
  reason: :class:`~cronlock.ScheduleRejected`; a label ``schedule``, no ``cronlock_job``:
  the schedule is no job here),
- ``cronlock_schedule_rejected{schedule}`` (1 for each stored schedule of the ledger that
  every live replica rejected, so that no replica runs it: status ``rejected``, see
  :meth:`cronlock.Scheduler.rejected_schedules`; every replica reports the fleet's, read
  every 15 seconds in one statement; a schedule no longer rejected has no series),
- ``cronlock_run_duration_seconds``, ``cronlock_start_lateness_seconds`` (histograms),
  ``cronlock_leader`` (0/1, when the scheduler has an elector that can tell without a round
  trip, as :class:`cronlock.postgres.PostgresElector` can; no ``cronlock_job`` label).

The gauges are computed at scrape time from the scheduler's state; the counters and
histograms are fed by its events. Under a server of several worker processes
(``uvicorn --workers 3``, gunicorn), set ``PROMETHEUS_MULTIPROC_DIR`` and serve
:func:`scrape_registry`: every scrape then gives the service's values, whichever worker
answers (``docs/observability.md``, "Several worker processes").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cronlock.prometheus needs prometheus_client, which is not installed; "
        "install the extra with: pip install 'cronlock[prometheus]' (from a clone of the "
        "repository, until cronlock is on PyPI: pip install -e '.[prometheus]')"
    ) from exc

from ._events import (
    RUN_ENDINGS,
    Event,
    JobCancelled,
    JobFailed,
    JobRetrying,
    JobSkipped,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    LockFailed,
    LockHeldElsewhere,
    LockLost,
    RunOverran,
    RunRestored,
    ScheduleRejected,
    SchedulerStarted,
    SchedulerStopped,
    SlotRanTwice,
    SlotsDecided,
    Subscription,
)
from ._fates import started_late
from ._prometheus_workers import Mirror, multiprocess_dir
from ._prometheus_workers import scrape_registry as _merged

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ("Instrumentation", "instrument", "scrape_registry")

_OUTCOMES = RUN_ENDINGS
_FINAL = JobSucceeded | JobFailed | JobTimedOut | JobCancelled | LockLost
_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, float("inf"))
_LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 60, float("inf"))


@runtime_checkable
class _KnowsLeadership(Protocol):
    @property
    def is_leader_now(self) -> bool: ...


class Instrumentation:
    """What :func:`instrument` registered; :meth:`close` takes it all back."""

    def __init__(self, scheduler: Scheduler, registry: CollectorRegistry) -> None:
        self._scheduler = scheduler
        self._registry = registry
        path = multiprocess_dir()
        self._mirror = None if path is None else Mirror(path, registry)
        self.runs = Counter(
            "cronlock_runs",
            "Runs that ended on this replica",
            ["cronlock_job", "outcome"],
            registry=None,
        )
        self.skips = Counter(
            "cronlock_skips",
            "Slots this replica did not run, by reason",
            ["cronlock_job", "reason"],
            registry=None,
        )
        self.lock_errors = Counter(
            "cronlock_lock_errors", "Locker or elector failures on this replica", ["cronlock_job"],
            registry=None,
        )  # fmt: skip
        self.held_elsewhere = Counter(
            "cronlock_lock_held_elsewhere",
            "Jobs whose lock a session outside the fleet was found holding (once a job)",
            ["cronlock_job"],
            registry=None,
        )
        self.retries = Counter(
            "cronlock_retries",
            "Attempts this replica retried after a failed or timed-out one (retries=N)",
            ["cronlock_job"],
            registry=None,
        )
        self.restored = Counter(
            "cronlock_runs_restored",
            "Runs of this replica a failover lost from the ledger, written back",
            ["cronlock_job"],
            registry=None,
        )
        self.overran = Counter(
            "cronlock_runs_overran",
            "Timed-out runs whose worker thread ran on past the deadline (when it returned)",
            ["cronlock_job"],
            registry=None,
        )
        self.slots = Counter(
            "cronlock_slots",
            "Slots by fate: those this replica ran (ran, ran_late) and those whose fate it "
            "decided (coalesced, missed, skipped)",
            ["cronlock_job", "fate"],
            registry=None,
        )
        self.ran_twice = Counter(
            "cronlock_slots_ran_twice",
            "Slots this replica ran that another replica ran too, after a failover",
            ["cronlock_job"],
            registry=None,
        )
        self.rejected = Counter(
            "cronlock_schedules_rejected",
            "Stored schedules (revisions) this replica could not register",
            ["schedule"],
            registry=None,
        )
        self._retrying: set[tuple[str, object]] = set()  # their starts are not late starts
        self.duration = Histogram(
            "cronlock_run_duration_seconds",
            "How long runs took on this replica",
            ["cronlock_job"],
            buckets=_DURATION_BUCKETS,
            registry=None,
        )
        self.lateness = Histogram(
            "cronlock_start_lateness_seconds",
            "How late after its fire time a run started on this replica",
            ["cronlock_job"],
            buckets=_LATENESS_BUCKETS,
            registry=None,
        )
        self._state = _StateCollector(scheduler)
        self._collectors: tuple[Collector, ...] = (
            self.runs,
            self.skips,
            self.lock_errors,
            self.held_elsewhere,
            self.retries,
            self.restored,
            self.overran,
            self.slots,
            self.ran_twice,
            self.rejected,
            self.duration,
            self.lateness,
            *((self._state,) if self._mirror is None else ()),
        )
        for collector in self._collectors:
            registry.register(collector)
        self._subscription: Subscription | None = scheduler.subscribe(self._on_event)
        if self._mirror is not None and scheduler.running:
            self._mirror.start(self._copy)

    def _copy(self) -> None:
        if self._mirror is not None:
            self._mirror.copy(self._state.collect())

    def _on_event(self, event: Event) -> None:
        kind = type(event)
        outcome = _OUTCOMES.get(kind)
        if outcome is not None:
            assert isinstance(
                event, JobSucceeded | JobFailed | JobTimedOut | JobCancelled | LockLost
            )
            self.runs.labels(event.job, outcome).inc()
            took = (event.finished_at - event.started_at).total_seconds()
            self.duration.labels(event.job).observe(max(took, 0.0))
        elif kind is JobSkipped:
            assert isinstance(event, JobSkipped)
            self.skips.labels(event.job, event.reason).inc()
        elif kind is LockFailed:
            assert isinstance(event, LockFailed)
            self.lock_errors.labels(event.job).inc()
        elif kind is LockHeldElsewhere:
            assert isinstance(event, LockHeldElsewhere)
            self.held_elsewhere.labels(event.job).inc()
        elif kind is SchedulerStarted and self._mirror is not None:
            self._mirror.start(self._copy)
        elif kind is SchedulerStopped and self._mirror is not None:
            self._copy()
            self._mirror.stop()
        elif kind is JobRetrying:
            assert isinstance(event, JobRetrying)
            self.retries.labels(event.job).inc()
            self._retrying.add((event.job, event.slot))
        elif kind is RunRestored:
            assert isinstance(event, RunRestored)
            self.restored.labels(event.job).inc()
        elif kind is RunOverran:
            assert isinstance(event, RunOverran)
            self.overran.labels(event.job).inc()
        elif kind is SlotRanTwice:
            assert isinstance(event, SlotRanTwice)
            self.ran_twice.labels(event.job).inc()
        elif kind is SlotsDecided:
            assert isinstance(event, SlotsDecided)
            self.slots.labels(event.job, event.fate).inc(event.count)
        elif kind is ScheduleRejected:
            assert isinstance(event, ScheduleRejected)
            self.rejected.labels(event.schedule).inc()
        elif kind is JobStarted:
            assert isinstance(event, JobStarted)
            if self._retrying and (event.job, event.slot) in self._retrying:
                self._retrying.discard((event.job, event.slot))
                return  # a retry starts when its backoff says, not at its slot
            try:
                fire = self._scheduler.get_job(event.job).fire_time(event.slot)
            except KeyError:
                fire = event.slot
            late = (event.started_at - fire).total_seconds()
            self.lateness.labels(event.job).observe(max(late, 0.0))
            fate = "ran_late" if started_late(fire, event.started_at) else "ran"
            self.slots.labels(event.job, fate).inc()

    def close(self) -> None:
        """Stop counting and unregister every metric (idempotent)."""
        sub, self._subscription = self._subscription, None
        if sub is None:
            return
        sub.unsubscribe()
        if self._mirror is not None:
            self._mirror.close()
        for collector in self._collectors:
            self._registry.unregister(collector)


class _StateCollector(Collector):
    """The gauges, computed from the scheduler's state at scrape time (no I/O)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        scheduler = self._scheduler
        success, last, nxt, overdue, paused, quiet, conflict = self._families()
        late = {job.name for job in scheduler.overdue()}
        for job in scheduler.jobs:
            name = job.name
            if job.last_success is not None and job.last_success.finished_at is not None:
                success.add_metric([name], job.last_success.finished_at.timestamp())
            if job.last_run is not None and job.last_run.finished_at is not None:
                last.add_metric([name], job.last_run.finished_at.timestamp())
            if job.next_run is not None:
                nxt.add_metric([name], job.next_run.timestamp())
            overdue.add_metric([name], 1.0 if name in late else 0.0)
            stopped = job.paused or scheduler.paused_fleet_wide(job)
            paused.add_metric([name], 1.0 if stopped else 0.0)
            conflict.add_metric([name], 1.0 if scheduler.in_conflict(job) else 0.0)
            since = scheduler.without_success_since(job)
            if since is not None and job.next_run is not None and not stopped:
                quiet.add_metric([name], since.timestamp())
        yield from (success, last, nxt, overdue, paused, quiet, conflict)
        rejected = GaugeMetricFamily(
            "cronlock_schedule_rejected",
            "1 for each stored schedule every live replica rejected (no replica runs it)",
            labels=["schedule"],
        )
        for name in sorted(scheduler.rejected_schedules()):
            rejected.add_metric([name], 1.0)
        yield rejected
        elector = scheduler._elector
        if elector is not None and isinstance(elector, _KnowsLeadership):
            leader = GaugeMetricFamily("cronlock_leader", "1 while this replica leads")
            leader.add_metric([], 1.0 if elector.is_leader_now else 0.0)
            yield leader

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"cronlock_job_{name}", text, labels=["cronlock_job"])

        return (
            gauge("last_success_timestamp_seconds", "When the latest successful run ended"),
            gauge("last_run_timestamp_seconds", "When the latest finished run ended"),
            gauge("next_run_timestamp_seconds", "The next slot this replica will fire"),
            gauge("overdue", "1 when a slot fell due longer ago than the grace, unrun"),
            gauge("paused", "1 while the job is paused, here or fleet-wide"),
            gauge(
                "without_success_since_timestamp_seconds",
                "Since when the job has gone without a success (its latest success ended, "
                "else it was first seen)",
            ),
            gauge("conflict", "1 while other live replicas of its ledger define it otherwise"),
        )


def instrument(scheduler: Scheduler, registry: CollectorRegistry | None = None) -> Instrumentation:
    """Register cronlock's metrics for *scheduler* in *registry* (default: the global one).

    Returns a handle whose ``close()`` unregisters them. Instrument each scheduler once per
    registry (the names would clash otherwise). In multiprocess mode a process holds one
    instrumented scheduler at a time, and a missing ``PROMETHEUS_MULTIPROC_DIR`` directory,
    or one set after prometheus_client was imported, raises :class:`~cronlock.ConfigError`.
    """
    return Instrumentation(scheduler, REGISTRY if registry is None else registry)


def scrape_registry(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """The registry a metrics endpoint serves: *registry* (default: the global one), or,
    in prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before the
    server started), a new registry that merges the files of every worker of the server.

    Serve it whichever mode the service runs in, for instance
    ``app.mount("/metrics", prometheus_client.make_asgi_app(scrape_registry()))``.
    Raises :class:`~cronlock.ConfigError` when the directory is missing, or was set too late.
    """
    merged = _merged()
    if merged is not None:
        return merged
    return REGISTRY if registry is None else registry
