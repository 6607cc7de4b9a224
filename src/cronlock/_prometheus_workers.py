"""cronlock's metrics under a server of several worker processes: prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), for ``cronlock.prometheus``.

A scrape of the server's one port reaches one worker, at random. In multiprocess mode each
worker writes its metrics to files in the directory, and whichever worker answers a scrape
merges them all (``cronlock.prometheus.scrape_registry()``): counters and histograms are
summed over the workers, those of workers that exited included, so they never go back.
The gauges, which cronlock otherwise computes at scrape time, are copied by each worker
into the files every :data:`REFRESH` seconds (a value only when it changed) and merged over
the live workers: the latest of their timestamps and the highest of their 0/1 flags
(``max``), the earliest of their next slots and no-success instants (``min``). Each
worker removes the gauge files of workers that exited, as
``prometheus_client.multiprocess.mark_process_dead`` does from a gunicorn hook: uvicorn
has no hook that would tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from typing import Literal

from prometheus_client import CollectorRegistry, Gauge, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from ._errors import ConfigError

__all__ = ("REFRESH", "Mirror", "multiprocess_dir", "scrape_registry")

REFRESH = 1.0
"""How often, in seconds, a worker copies its gauges into the multiprocess files (less
often where copying would take more than 5 % of the time: 6,000 jobs take about 50 ms)."""
_SWEEP_EVERY = 10  # refreshes between two looks for the files of workers that exited
_EARLIEST = frozenset(
    {
        "cronlock_job_next_run_timestamp_seconds",
        "cronlock_job_without_success_since_timestamp_seconds",
    }
)
_LIVE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")
_logger = logging.getLogger("cronlock.prometheus")


def _label(family: str) -> str | None:
    """The one label of gauge *family*'s series: the job's, the stored schedule's, or none."""
    if family.startswith("cronlock_job_"):
        return "cronlock_job"
    if family.startswith("cronlock_schedule_"):
        return "schedule"
    return None


def multiprocess_dir() -> str | None:
    """The multiprocess directory when prometheus_client runs in that mode, else ``None``.

    The mode is chosen once, when prometheus_client is imported, from the environment:
    set ``PROMETHEUS_MULTIPROC_DIR`` in the server's environment, before it starts.
    """
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if values.ValueClass is values.MutexValue:
        if path:
            raise ConfigError(
                f"PROMETHEUS_MULTIPROC_DIR={path!r} was set after prometheus_client was "
                "imported, so this process does not write its metrics there: set it in the "
                "environment of the server before it starts"
            )
        return None
    if not path or not os.path.isdir(path):
        raise ConfigError(
            f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory: create it, empty, "
            "before the server starts (and empty it at each start)"
        )
    return path


def scrape_registry() -> CollectorRegistry | None:
    """A registry merging every worker's files, or ``None`` outside multiprocess mode."""
    path = multiprocess_dir()
    if path is None:
        return None
    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=path)  # type: ignore[no-untyped-call]
    return merged


class Mirror:
    """Copies a scrape-time collector's gauges into multiprocess gauges, every
    :data:`REFRESH` seconds while its scheduler runs. One per process: two would share
    their files' entries and overwrite each other's counts."""

    _owner: Mirror | None = None

    def __init__(self, path: str, registry: CollectorRegistry) -> None:
        if Mirror._owner is not None:
            raise ConfigError(
                "cronlock.prometheus.instrument(): this process already has an "
                "instrumented scheduler, and in multiprocess mode (PROMETHEUS_MULTIPROC_DIR) "
                "a process holds one: close() its handle first"
            )
        Mirror._owner = self
        self._path = path
        self._registry = registry
        self._gauges: dict[str, Gauge] = {}
        self._written: dict[tuple[str, str], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._refresh: Callable[[], None] = lambda: None
        self._ticks = 0

    def copy(self, families: Iterable[GaugeMetricFamily]) -> None:
        """Write each sample of *families* that changed since the last copy, and a neutral
        value for each series written before and now gone (a job paused, finished or
        removed: this mode cannot remove a series): ``+Inf`` where the workers' earliest
        value is kept, so the others' win, else 0."""
        seen: set[tuple[str, str]] = set()
        for family in families:
            gauge = self._gauges.get(family.name)
            if gauge is None:
                mode: Literal["livemin", "livemax"] = (
                    "livemin" if family.name in _EARLIEST else "livemax"
                )
                label = _label(family.name)
                gauge = Gauge(
                    family.name,
                    family.documentation,
                    [label] if label else [],
                    multiprocess_mode=mode,
                    registry=None,
                )
                self._registry.register(gauge)
                self._gauges[family.name] = gauge
            label = _label(family.name)
            for sample in family.samples:
                value = sample.labels.get(label, "") if label else ""
                seen.add((family.name, value))
                self._write(family.name, value, sample.value)
        for name, job in [key for key in self._written if key not in seen]:
            self._write(name, job, math.inf if name in _EARLIEST else 0.0)

    def _write(self, name: str, job: str, value: float) -> None:
        if self._written.get((name, job)) != value:
            self._written[(name, job)] = value
            gauge = self._gauges[name]
            (gauge.labels(job) if job else gauge).set(value)

    def start(self, refresh: Callable[[], None]) -> None:
        """Copy now and every :data:`REFRESH` seconds, on the running loop."""
        self.stop()
        self._refresh = refresh
        self._tick()

    def _tick(self) -> None:
        began = time.perf_counter()
        try:
            self._refresh()
            self._ticks += 1
            if self._ticks % _SWEEP_EVERY == 1:
                self._sweep()
        except Exception:
            _logger.exception("could not copy cronlock's gauges to %s", self._path)
        took = time.perf_counter() - began  # thousands of jobs: never 5 % of the worker's time
        self._timer = asyncio.get_running_loop().call_later(max(REFRESH, took * 20), self._tick)

    def _sweep(self) -> None:
        """Remove the gauge files of the workers that exited."""
        for file in glob.glob(os.path.join(self._path, "gauge_live*.db")):
            found = _LIVE_FILE.fullmatch(os.path.basename(file))
            if found is not None and not _alive(int(found.group(1))):
                with contextlib.suppress(FileNotFoundError):  # another worker was quicker
                    os.remove(file)

    def stop(self) -> None:
        """Stop copying (the values written stay until this process exits)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def close(self) -> None:
        """Stop, unregister the gauges, and let another instrumentation in."""
        self.stop()
        for gauge in self._gauges.values():
            self._registry.unregister(gauge)
        self._gauges.clear()
        if Mirror._owner is self:
            Mirror._owner = None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True
