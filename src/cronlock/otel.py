"""OpenTelemetry traces for a scheduler: ``cronlock.otel.instrument(scheduler)``.

Needs the ``otel`` extra (the OpenTelemetry API only: bring the SDK and exporter of your
choice): ``pip install -e '.[otel]'`` from a clone, ``pip install 'cronlock[otel]'`` once
cronlock is on PyPI. ``import cronlock`` never imports it.

Each run is a span ``cronlock.run`` from the moment the task starts to its end, with the
attributes ``cronlock.job``, ``cronlock.slot`` (ISO 8601), ``cronlock.outcome``,
``cronlock.replica`` (``host:pid``) and ``cronlock.lock`` (``granted`` when a locker let
this replica run the slot, ``none`` for a job that coordinates through no locker). A failed
run records its exception and an error status; a timed-out one an error status. The span
is the current span while the task runs, so the task's own spans are its children.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Span, Status, StatusCode, TracerProvider
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "cronlock.otel needs opentelemetry-api, which is not installed; "
        "install the extra with: pip install 'cronlock[otel]' (from a clone of the "
        "repository, until cronlock is on PyPI: pip install -e '.[otel]')"
    ) from exc

from ._events import (
    RUN_ENDINGS,
    Event,
    JobCancelled,
    JobFailed,
    JobStarted,
    JobSucceeded,
    JobTimedOut,
    LockLost,
    Subscription,
)
from ._logs import replica

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ("SPAN_NAME", "Tracing", "instrument")

SPAN_NAME = "cronlock.run"
"""The name of the span each run gets (one span per run, ended with the run)."""
_ENDINGS = RUN_ENDINGS
_FINAL = JobSucceeded | JobFailed | JobTimedOut | JobCancelled | LockLost


def _ns(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000_000)


class Tracing:
    """What :func:`instrument` set up; :meth:`close` stops making spans."""

    def __init__(self, scheduler: Scheduler, tracer_provider: TracerProvider | None) -> None:
        self._scheduler = scheduler
        self._tracer = trace.get_tracer("cronlock", tracer_provider=tracer_provider)
        # A run's events are emitted from its own task: the span (and the context token
        # that made it current there) is found again by that task.
        self._open: dict[asyncio.Task[Any], tuple[Span, Any]] = {}
        self._subscription: Subscription | None = scheduler.subscribe(
            self._on_event, JobStarted, *_ENDINGS
        )

    def _on_event(self, event: Event) -> None:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - events of runs come from their tasks
            return
        if isinstance(event, JobStarted):
            job = self._scheduler.get_job(event.job) if event.job else None
            locked = job is not None and job._wiring.locker is not None
            span = self._tracer.start_span(
                SPAN_NAME,
                start_time=_ns(event.started_at),
                attributes={
                    "cronlock.job": event.job,
                    "cronlock.slot": event.slot.isoformat(),
                    "cronlock.replica": replica(),
                    "cronlock.lock": "granted" if locked else "none",
                    "cronlock.run_number": event.run_number,
                },
            )
            token = otel_context.attach(trace.set_span_in_context(span))
            self._open[task] = (span, token)
            return
        found = self._open.pop(task, None)
        if found is None or not isinstance(event, _FINAL):
            return
        span, token = found
        outcome = _ENDINGS[type(event)]
        span.set_attribute("cronlock.outcome", outcome)
        if isinstance(event, JobFailed):
            span.record_exception(event.exception)
            span.set_status(Status(StatusCode.ERROR, f"{type(event.exception).__name__}"))
        elif outcome != "succeeded":
            span.set_status(Status(StatusCode.ERROR, outcome))
        otel_context.detach(token)
        span.end(end_time=_ns(event.finished_at))

    def close(self) -> None:
        """Stop making spans (idempotent); spans of runs in flight end unrecorded."""
        sub, self._subscription = self._subscription, None
        if sub is not None:
            sub.unsubscribe()


def instrument(scheduler: Scheduler, tracer_provider: TracerProvider | None = None) -> Tracing:
    """Make a span ``cronlock.run`` for each run of *scheduler*'s jobs.

    *tracer_provider* defaults to the global one (``opentelemetry.trace``). Returns a
    handle whose ``close()`` stops it.
    """
    return Tracing(scheduler, tracer_provider)
