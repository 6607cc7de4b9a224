"""``celery beat -S cronlock.celery.BeatScheduler``: Celery's beat process, cronlock inside.

Why a thread. Celery's beat calls ``tick()`` and then sleeps for what it returned, in its
main thread; cronlock's scheduler is asyncio and needs its loop turning all the time, not
only during a tick: lease renewals (lease mode), the lock sessions' heartbeats (session
mode), the fleet clock's samples and the claims made ahead of each slot all run between
slots. So the loop runs in a thread of its own for the beat's whole life, ``tick()`` only
checks that it is still alive (and re-raises what stopped it, so the beat exits), and
``close()`` (beat's shutdown, on SIGTERM or Ctrl-C) stops it and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from celery.beat import Scheduler as _CeleryScheduler

from ._entries import BeatEntry, beat_entries
from ._runner import announce, beat_scheduler
from ._settings import BeatSettings

__all__ = ("BeatScheduler",)

_START_TIMEOUT = 60.0  # seconds the beat waits for the scheduler to start
_STOP_TIMEOUT = 40.0  # seconds close() waits for it to stop (runs in flight included)
_TICK = 1.0  # seconds between two of beat's checks that the loop is alive


class _LoopThread(threading.Thread):
    """The cronlock scheduler on an event loop of its own, started and stopped from beat."""

    def __init__(self, app: Any, settings: BeatSettings, entries: tuple[BeatEntry, ...]) -> None:
        super().__init__(name="cronlock-beat", daemon=True)
        self._app, self._settings, self._entries = app, settings, entries
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to beat's thread by tick()
            self.error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        scheduler = beat_scheduler(self._app, self._settings, self._entries)
        async with scheduler:
            announce(scheduler, self._settings)
            self._ready.set()
            await self._stop_event.wait()

    def wait_started(self) -> None:
        if not self._ready.wait(_START_TIMEOUT):
            raise RuntimeError(
                f"cronlock: the beat scheduler did not start within {_START_TIMEOUT:g} s"
            )
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        loop, stop = self._loop, self._stop_event
        if loop is not None and stop is not None and not loop.is_closed():
            # The loop may close meanwhile (RuntimeError): then there is nothing to stop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        self.join(_STOP_TIMEOUT)


class BeatScheduler(_CeleryScheduler):  # type: ignore[misc]  # celery is untyped
    """A Celery beat scheduler that can run as many replicas: ``celery -A proj beat -S
    cronlock.celery.BeatScheduler``.

    It reads the app's ``beat_schedule`` at start (entries it cannot honour are refused
    with :class:`cronlock.ConfigError`), and runs a cronlock :class:`~cronlock.Scheduler`
    on a :class:`~cronlock.postgres.PostgresLocker` (settings: :class:`BeatSettings`, from
    ``app.conf.cronlock_*``) on an event loop in a thread of its own. Every replica runs
    the same; each slot's task is sent by one of them, once, with the id
    :func:`~cronlock.celery.task_id` gives it. Beat's own schedule file is not used: the
    run ledger is the state.
    """

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        self._thread: _LoopThread | None = None
        self._settings: BeatSettings | None = None
        self._entries: tuple[BeatEntry, ...] = ()
        super().__init__(app, *args, **kwargs)

    def setup_schedule(self) -> None:
        """Convert the entries, then start the cronlock scheduler (once running)."""
        self._settings = BeatSettings.from_app(self.app)
        self._entries = beat_entries(self.app)
        self._thread = _LoopThread(self.app, self._settings, self._entries)
        self._thread.start()
        self._thread.wait_started()

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Check that the cronlock scheduler still runs (raise what stopped it); return
        the seconds until the next check."""
        thread = self._thread
        if thread is not None and not thread.is_alive():
            error = thread.error or RuntimeError("cronlock: the beat scheduler stopped")
            raise error
        return float(min(_TICK, self.max_interval or _TICK))

    def sync(self) -> None:
        """Nothing to write: the run ledger records every send as it happens."""

    def close(self) -> None:
        """Stop the cronlock scheduler (runs in flight finish first) and wait for it."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()

    @property
    def info(self) -> str:
        """The banner's line about this scheduler."""
        try:
            settings = self._settings or BeatSettings.from_app(self.app)
        except Exception as exc:  # the banner says it; setup_schedule raises it
            return f"    . cronlock -> not configured: {exc}"
        return f"    . cronlock -> ledger {settings.ledger_name}, mode {settings.mode}"
