"""cronlock.prometheus in prometheus_client's multiprocess mode, misconfigured (issue 23,
item 2): each case in a fresh interpreter, as the mode is chosen when prometheus_client is
imported. The 3-worker server itself: ``tests/services/test_metrics_workers.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    environ["PYTHONPATH"] = str(_ROOT / "src")
    return subprocess.run(
        [sys.executable, "-c", code], env={**environ, **env}, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


_INSTRUMENT = """
import cronlock.prometheus
from prometheus_client import CollectorRegistry
from cronlock import Scheduler, ConfigError
try:
    cronlock.prometheus.instrument(Scheduler(), CollectorRegistry())
    {second}
except ConfigError as exc:
    print("refused:", exc)
else:
    print("accepted")
"""


def test_a_missing_directory_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    done = _run(_INSTRUMENT.format(second=""), PROMETHEUS_MULTIPROC_DIR=str(missing))
    assert f"refused: PROMETHEUS_MULTIPROC_DIR='{missing}' is not a directory" in done.stdout


def test_a_directory_set_after_prometheus_client_was_imported_is_refused(
    tmp_path: Path,
) -> None:
    late = f"import os; os.environ['PROMETHEUS_MULTIPROC_DIR'] = {str(tmp_path)!r}\n"
    done = _run("import prometheus_client\n" + late + _INSTRUMENT.format(second=""))
    assert "was set after prometheus_client was imported" in done.stdout, done.stderr


@pytest.mark.parametrize(("second", "verdict"), [
    ("cronlock.prometheus.instrument(Scheduler(), CollectorRegistry())", "refused"),
    ("", "accepted"),
])  # fmt: skip
def test_one_instrumented_scheduler_per_process(tmp_path: Path, second: str, verdict: str) -> None:
    done = _run(_INSTRUMENT.format(second=second), PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    assert done.stdout.startswith(verdict), done.stdout + done.stderr


def test_close_lets_another_in_and_the_counts_go_on(tmp_path: Path) -> None:
    code = """
import asyncio
import cronlock.prometheus
from prometheus_client import CollectorRegistry
from cronlock import Scheduler
from cronlock.testing import FakeClock

async def main():
    for _ in range(2):
        clock = FakeClock()
        scheduler = Scheduler(clock=clock)
        scheduler.every(10, name="tick")(lambda: None)
        handle = cronlock.prometheus.instrument(scheduler, CollectorRegistry())
        async with scheduler:
            await clock.advance(10)
            await asyncio.sleep(0.05)
        handle.close()
    merged = cronlock.prometheus.scrape_registry()
    ran = {"cronlock_job": "tick", "outcome": "succeeded"}
    print(merged.get_sample_value("cronlock_runs_total", ran))
    print(merged.get_sample_value("cronlock_job_paused", {"cronlock_job": "tick"}))

asyncio.run(main())
"""
    done = _run(code, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    assert done.stdout.split() == ["2.0", "0.0"], done.stdout + done.stderr


def test_outside_multiprocess_mode_the_registry_is_served_as_given() -> None:
    code = """
import cronlock.prometheus
from prometheus_client import REGISTRY, CollectorRegistry
mine = CollectorRegistry()
print(cronlock.prometheus.scrape_registry() is REGISTRY,
      cronlock.prometheus.scrape_registry(mine) is mine)
"""
    assert _run(code).stdout.split() == ["True", "True"]


def test_a_series_a_job_stops_reporting_lets_the_other_workers_win(tmp_path: Path) -> None:
    """Multiprocess mode cannot remove a series: a job that finished or was paused after
    its gauges were written reads +Inf where the workers' earliest value counts (its next
    slot, its no-success instant: ``CronlockNoSuccess`` stays quiet) and 0 elsewhere."""
    code = """
import asyncio
from datetime import UTC, datetime, timedelta
import cronlock.prometheus
from prometheus_client import CollectorRegistry
from cronlock import Scheduler, once
from cronlock.testing import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)

async def main():
    clock = FakeClock(T0)
    scheduler = Scheduler(clock=clock)
    warm = scheduler.add_job(lambda: None, once(T0 + timedelta(seconds=30)), name="warm")
    later = scheduler.add_job(lambda: None, once(T0 + timedelta(days=1)), name="later")
    handle = cronlock.prometheus.instrument(scheduler, CollectorRegistry())
    merged = cronlock.prometheus.scrape_registry()
    def read(name, job):
        return merged.get_sample_value(f"cronlock_job_{name}", {"cronlock_job": job})
    async with scheduler:  # a copy at start
        print(read("next_run_timestamp_seconds", "warm"), read("paused", "later"))
        later.pause()
        await clock.advance(60)  # warm ran and finished
    # and a copy at stop
    print(read("next_run_timestamp_seconds", "warm"),
          read("without_success_since_timestamp_seconds", "warm"),
          read("without_success_since_timestamp_seconds", "later"),
          read("paused", "later"))
    handle.close()

asyncio.run(main())
"""
    done = _run(code, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    t0 = "1767225630.0"  # T0 + 30 s
    assert done.stdout.split() == [t0, "0.0", "inf", "inf", "inf", "1.0"], done.stdout + done.stderr
