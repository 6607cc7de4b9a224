"""The beat replicas' scheduler: each entry a cronlock job whose run sends the slot's task.

The job's body is a plain function, so cronlock runs it in a worker thread: Celery's send
is blocking network I/O (the broker's connection, kombu's own short retries), and the
event loop goes on renewing leases and claiming other slots meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import RunContext, Scheduler
from ._entries import BeatEntry, beat_entries
from ._ids import task_id
from ._settings import DEFAULT_LEASE, BeatSettings

if TYPE_CHECKING:
    from ..postgres import PostgresLocker

__all__ = ("beat_scheduler", "run_beat")

_logger = logging.getLogger("cronlock.celery")

SLOT_HEADER = "cronlock_slot"
"""The message header that carries the slot (UTC ISO 8601) a task was sent for."""
ATTEMPT_HEADER = "cronlock_attempt"
"""The message header that carries which attempt at its slot the send was (1, 2, ...)."""
SEND_HEADER = "cronlock_send"
"""The message header that carries a random id of its own per send: the same task id with
two of these is a slot sent twice; the same one twice, one send delivered twice."""


def _evaluated(value: Any) -> Any:
    """*value*, or what it returns when it is a ``celery.beat.BeatLazyFunc`` (as beat
    does: evaluated at each send)."""
    from celery.beat import BeatLazyFunc

    return value() if isinstance(value, BeatLazyFunc) else value


def sender(app: Any, entry: BeatEntry, ledger: str) -> Callable[[RunContext], None]:
    """The body of *entry*'s job: send its task for the run's slot, with the slot's id."""
    options = dict(entry.options)
    headers: Mapping[str, Any] = options.pop("headers", None) or {}

    def send(context: RunContext) -> None:
        tid = task_id(ledger, entry.name, context.slot)
        args = [_evaluated(a) for a in entry.args]
        kwargs = {k: _evaluated(v) for k, v in entry.kwargs.items()}
        sent_headers = {
            **headers,
            SLOT_HEADER: context.slot.isoformat(),
            ATTEMPT_HEADER: context.attempt,
            SEND_HEADER: uuid.uuid4().hex,
        }
        # As Celery's beat does: the registered task's apply_async (its own defaults and
        # routes), else send_task by name (a task this process never imported).
        task = app.tasks.get(entry.task)
        if task is not None:
            task.apply_async(args, kwargs, task_id=tid, headers=sent_headers, **options)
        else:
            app.send_task(entry.task, args, kwargs, task_id=tid, headers=sent_headers, **options)
        _logger.info(
            "sent %s (%s) for slot %s, task id %s", entry.name, entry.task, context.slot, tid
        )

    send.__name__ = send.__qualname__ = f"send_{entry.task}"
    return send


def _locker(settings: BeatSettings) -> PostgresLocker:
    from ..postgres import PostgresLocker

    return PostgresLocker(
        settings.dsn,
        mode=settings.mode,
        table=settings.ledger,
        schema=settings.schema,
        **{"lease": DEFAULT_LEASE, **settings.locker_options},
    )


def beat_scheduler(
    app: Any,
    settings: BeatSettings | None = None,
    entries: tuple[BeatEntry, ...] | None = None,
) -> Scheduler:
    """A cronlock :class:`~cronlock.Scheduler` on a :class:`~cronlock.postgres.PostgresLocker`
    (run ledger on) with a job per entry of *app*'s ``beat_schedule``, not started.

    *settings* default to :meth:`BeatSettings.from_app`; *entries* to the app's
    (:func:`beat_entries`). Each job is named after its entry and sends the entry's task
    with :func:`task_id` of its slot, the entry's args, kwargs and options, and the headers
    ``cronlock_slot``, ``cronlock_attempt`` and ``cronlock_send``; a slot that falls due
    while the entry's previous send still goes on is sent right after it
    (``overlap="queue"``).
    """
    settings = settings if settings is not None else BeatSettings.from_app(app)
    entries = entries if entries is not None else beat_entries(app)
    # A send runs in a thread, which cancelling cannot stop: a run whose lock is lost
    # mid-send (the database restarting, say) goes on, so that its outcome says the task
    # went out, rather than "cut off", which would have the slot sent again.
    scheduler = Scheduler(locker=_locker(settings), on_lock_lost="continue")
    for entry in entries:
        own = entry.cronlock
        scheduler.add_job(
            sender(app, entry, settings.ledger_name),
            entry.schedule,
            name=entry.name,
            tags=("celery-beat",),
            # A slot due while the entry's previous send still goes on (a slow broker, a
            # replica's first sends, which connect, a late catch-up send) is sent right
            # after it, late, as Celery's beat would: not skipped. The replica sending
            # holds the entry's lock meanwhile, so every other replica is refused that
            # slot; with "skip" nobody would send it. Slots due while one already waits
            # are skipped, recorded in the ledger's slot records with the reason.
            overlap="queue",
            timeout=own.timeout if own.timeout is not None else settings.timeout,
            misfire_grace=(
                own.misfire_grace if own.misfire_grace is not None else settings.misfire_grace
            ),
            retries=own.retries if own.retries is not None else settings.retries,
            retry_delay=own.retry_delay if own.retry_delay is not None else settings.retry_delay,
            recover=own.recover if own.recover is not None else settings.recover,
        )
    return scheduler


def announce(scheduler: Scheduler, settings: BeatSettings) -> None:
    """Once the beat's scheduler runs: serve its metrics if asked, and log (INFO) that it
    runs, with its entries."""
    if settings.metrics_port is not None:
        from prometheus_client import start_http_server

        from ..prometheus import instrument

        instrument(scheduler)
        start_http_server(settings.metrics_port)
        _logger.info("metrics on http://0.0.0.0:%d/metrics", settings.metrics_port)
    names = ", ".join(job.name for job in scheduler.jobs) or "none"
    _logger.info("cronlock celery beat: %d entries (%s)", len(scheduler.jobs), names)


async def run_beat(
    app: Any,
    settings: BeatSettings | None = None,
    *,
    stop: asyncio.Event | None = None,
    started: Callable[[Scheduler], None] | None = None,
) -> None:
    """Send *app*'s ``beat_schedule`` from this replica until *stop* is set (or the call is
    cancelled), coordinating with every other replica through the run ledger.

    The scheduler is :func:`beat_scheduler`'s; *started* is called with it once it runs.
    Entries that cannot be honoured, and settings that are malformed, raise
    :class:`cronlock.ConfigError` before anything is sent.
    """
    settings = settings if settings is not None else BeatSettings.from_app(app)
    scheduler = beat_scheduler(app, settings)
    stop = stop if stop is not None else asyncio.Event()
    async with scheduler:
        announce(scheduler, settings)
        if started is not None:
            started(scheduler)
        await stop.wait()
