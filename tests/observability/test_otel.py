"""cronlock.otel with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from cronlock import Scheduler
from cronlock.otel import SPAN_NAME, instrument
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_a_span_per_run_with_outcome_and_the_exception() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    inner = provider.get_tracer("app")

    @scheduler.every(60, name="ok")
    async def ok() -> None:
        with inner.start_as_current_span("work"):
            await clock.sleep(3)

    @scheduler.every(60, name="broken")
    async def broken() -> None:
        raise ValueError("bad row 7")

    @scheduler.every(60, name="hang", timeout=2)
    async def hang() -> None:
        await asyncio.Event().wait()

    tracing = instrument(scheduler, tracer_provider=provider)
    async with scheduler:
        await clock.advance(63)
    tracing.close()
    spans = exporter.get_finished_spans()
    runs = {s.attributes["cronlock.job"]: s for s in spans if s.name == SPAN_NAME}  # type: ignore[index]
    assert set(runs) == {"ok", "broken", "hang"}
    good = runs["ok"]
    assert good.attributes is not None
    assert good.attributes["cronlock.outcome"] == "succeeded"
    assert good.attributes["cronlock.slot"] == "2026-01-01T00:01:00+00:00"
    assert good.attributes["cronlock.lock"] == "none"
    assert ":" in str(good.attributes["cronlock.replica"])
    assert good.end_time is not None and good.start_time is not None
    assert good.end_time - good.start_time == 3_000_000_000  # virtual seconds
    [work] = [s for s in spans if s.name == "work"]
    assert work.parent is not None
    assert work.parent.span_id == good.context.span_id  # the task's spans are children
    bad = runs["broken"]
    assert bad.attributes is not None
    assert bad.attributes["cronlock.outcome"] == "failed"
    assert bad.status.status_code is StatusCode.ERROR
    [exception] = [e for e in bad.events if e.name == "exception"]
    assert exception.attributes is not None
    assert exception.attributes["exception.message"] == "bad row 7"
    late = runs["hang"]
    assert late.attributes is not None
    assert late.attributes["cronlock.outcome"] == "timed_out"
    assert late.status.status_code is StatusCode.ERROR
    # No span is left current after the runs.
    assert trace.get_current_span() is trace.INVALID_SPAN
