"""Registration's reuse of the last job's checked options is per scheduler (issue 25,
item 4): two schedulers registering jobs in two threads at once never pair a job with
the other's settings or call shape."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from cronlock import Overlap, Scheduler, every

JOBS = 20_000


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Threads switch every microsecond: a registration cut in two shows."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def _slow(x: int) -> None: ...


def _quick(x: int, y: int) -> None: ...


@pytest.mark.usefixtures("switch_often")
def test_two_schedulers_in_two_threads_keep_their_own_settings() -> None:
    options: dict[
        str, tuple[Callable[..., None], tuple[int, ...], timedelta, Overlap, frozenset[str]]
    ] = {
        "slow": (_slow, (1,), timedelta(seconds=600), "skip", frozenset({"batch"})),
        "quick": (_quick, (1, 2), timedelta(seconds=5), "allow", frozenset({"web"})),
    }
    schedulers = {label: Scheduler() for label in options}
    start = threading.Barrier(len(options))

    def register(label: str) -> None:
        task, args, timeout, overlap, tags = options[label]
        schedule = every(60)
        start.wait()
        add = schedulers[label].add_job
        for i in range(JOBS):  # the very same objects each time: the reuse path
            add(task, schedule, name=f"{label}-{i}", args=args, timeout=timeout,
                overlap=overlap, tags=tags)  # fmt: skip

    threads = [threading.Thread(target=register, args=(label,)) for label in options]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for label, (task, args, timeout, overlap, tags) in options.items():
        jobs = schedulers[label].jobs
        assert len(jobs) == JOBS
        wrong = [
            job.name
            for job in jobs
            if (job.func, job.args, job.timeout, job.overlap, job.tags)
            != (task, args, timeout.total_seconds(), overlap, tags)
            or job._task is not jobs[0]._task
        ]
        assert wrong == [], f"{len(wrong)} of {label}'s jobs have the other's options"
