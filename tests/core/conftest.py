from __future__ import annotations

from datetime import UTC, datetime

import pytest

from cronlock import Event, Scheduler
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Recorder:
    """Collects every event a scheduler emits."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def scheduler(clock: FakeClock) -> Scheduler:
    return Scheduler(clock=clock)


@pytest.fixture
def recorder(scheduler: Scheduler) -> Recorder:
    rec = Recorder()
    scheduler.subscribe(rec)
    return rec
