"""Handing slots off to a job queue: ``scheduler.add_job(arq_sender(redis, "report"), ...)``.

Each function here builds a task for :meth:`cronlock.Scheduler.add_job` (or the decorators'
``scheduler.cron(...)(sender)``) whose run sends one message for its slot to a queue, with
the slot's :attr:`~cronlock.RunContext.idempotency_key` as the message's id: cronlock sends
once per slot across the fleet, and a queue that de-duplicates by id (arq's ``_job_id``,
procrastinate's ``queueing_lock``) takes a resend of the same slot (a retry after a send
whose answer was lost) as the message it already has. The queue then executes the message
by its own delivery rules. See docs/guides/queues.md.

A send the queue refuses as a duplicate is a success: logged at INFO, and the
:class:`HandOff` the run returns says ``queued=False``. A send that fails (the broker is
down) raises, so the run fails, is recorded as failed like any other, and is tried again
per the job's ``retries``, with the same key.

No queue library is imported here: each sender takes the queue's own object (an arq pool,
a procrastinate task, a Celery app, a taskiq task, a Dramatiq actor) and only calls its
methods; procrastinate's ``AlreadyEnqueued`` is imported when its sender first sees an
error. The extras ``arq``, ``procrastinate``, ``celery``, ``taskiq`` and ``dramatiq``
install the libraries.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._logs import at, get_logger
from ._records import RunContext

__all__ = (
    "HandOff",
    "arq_sender",
    "celery_sender",
    "dramatiq_sender",
    "procrastinate_sender",
    "taskiq_sender",
)

_logger = get_logger("cronlock.queues")


@dataclass(frozen=True, slots=True)
class HandOff:
    """What one run of a sender did: sent its slot's message, or found it already there."""

    job: str
    """The job's name."""
    slot: datetime
    """The slot handed off (aware UTC)."""
    key: str
    """The message's id: the slot's :attr:`~cronlock.RunContext.idempotency_key`."""
    queue: str
    """Which kind of queue: ``"arq"``, ``"procrastinate"``, ``"celery"``, ``"taskiq"``,
    ``"dramatiq"``."""
    queued: bool
    """True when this run queued the message; False when the queue already had one with
    this key (a resend of the slot, de-duplicated by the queue)."""


def _payload(
    context: RunContext, kwargs: Mapping[str, Any] | None, slot_kwarg: str | None
) -> dict[str, Any]:
    """The message's keyword arguments: *kwargs*, and the slot (ISO 8601, a string every
    queue's serializer takes) as *slot_kwarg* when given."""
    payload = dict(kwargs) if kwargs else {}
    if slot_kwarg is not None:
        payload[slot_kwarg] = context.slot.isoformat()
    return payload


def _done(context: RunContext, key: str, queue: str, queued: bool, target: str) -> HandOff:
    extra = at(context.job, context.slot)
    if queued:
        _logger.info("handed off to %s %s (key %s)", queue, target, key, extra=extra)
    else:
        _logger.info(
            "already queued in %s %s (key %s): the queue kept the first send",
            queue,
            target,
            key,
            extra=extra,
        )
    return HandOff(context.job, context.slot, key, queue, queued)


def _named(send: Callable[..., Any], queue: str, target: str) -> None:
    # The job's default name (add_job without name=): cronlock.queues.<queue>:<target>.
    send.__module__ = __name__
    send.__qualname__ = send.__name__ = f"{queue}:{target}"


def arq_sender(
    redis: Any,
    function: str,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    slot_kwarg: str | None = None,
    **options: Any,
) -> Callable[[RunContext], Awaitable[HandOff]]:
    """A task that enqueues arq job *function* with ``_job_id`` the slot's key.

    *redis* is an ``arq.ArqRedis`` (``await arq.create_pool(...)``), open while the
    scheduler runs. The job gets *args* and *kwargs*, plus the slot as an ISO 8601 string
    in *slot_kwarg* when given; *options* are ``enqueue_job``'s own (``_queue_name``,
    ``_defer_by``, ``_expires``, ...). arq answers ``None`` for a ``_job_id`` whose job or
    result it still holds (results are kept ``keep_result`` seconds, 1 hour by default):
    that is :attr:`HandOff.queued` False.
    """

    async def send(context: RunContext) -> HandOff:
        key = context.idempotency_key
        job = await redis.enqueue_job(
            function, *args, _job_id=key, **options, **_payload(context, kwargs, slot_kwarg)
        )
        return _done(context, key, "arq", job is not None, function)

    _named(send, "arq", function)
    return send


def procrastinate_sender(
    task: Any,
    *,
    kwargs: Mapping[str, Any] | None = None,
    slot_kwarg: str | None = None,
    lock: bool = False,
    **options: Any,
) -> Callable[[RunContext], Awaitable[HandOff]]:
    """A task that defers procrastinate *task* with ``queueing_lock`` the slot's key.

    *task* is a procrastinate task (``@app.task``) of an app that is open while the
    scheduler runs. The job gets *kwargs*, plus the slot as an ISO 8601 string in
    *slot_kwarg* when given; *options* are ``task.configure``'s own (``queue``,
    ``priority``, ``schedule_in``, ...). *lock*: also ``lock`` = the key, so two jobs of
    one slot never run at once. procrastinate refuses a second job with the same
    ``queueing_lock`` while the first waits to start (``AlreadyEnqueued``): that is
    :attr:`HandOff.queued` False. Once the first has started, a resend is a new job.
    """

    async def send(context: RunContext) -> HandOff:
        key = context.idempotency_key
        locks = {"queueing_lock": key, "lock": key} if lock else {"queueing_lock": key}
        deferrer = task.configure(**locks, **options)
        try:
            await deferrer.defer_async(**_payload(context, kwargs, slot_kwarg))
        except Exception as exc:
            from procrastinate.exceptions import AlreadyEnqueued

            if not isinstance(exc, AlreadyEnqueued):
                raise
            return _done(context, key, "procrastinate", False, task.name)
        return _done(context, key, "procrastinate", True, task.name)

    _named(send, "procrastinate", task.name)
    return send


def celery_sender(
    app: Any,
    name: str,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    slot_kwarg: str | None = None,
    **options: Any,
) -> Callable[[RunContext], HandOff]:
    """A task that sends Celery task *name* through *app* with ``task_id`` the slot's key.

    A plain function (``app.send_task`` blocks on the broker): the scheduler runs it in a
    worker thread. The task gets *args* and *kwargs*, plus the slot as an ISO 8601 string
    in *slot_kwarg* when given; *options* are ``send_task``'s own (``queue``,
    ``countdown``, ``expires``, ...). Celery does not de-duplicate by ``task_id``: a resend
    is a second message with the same id, which the task can tell by ``self.request.id``
    (docs/guides/queues.md).
    """

    def send(context: RunContext) -> HandOff:
        key = context.idempotency_key
        payload = _payload(context, kwargs, slot_kwarg)
        app.send_task(name, args=tuple(args), kwargs=payload, task_id=key, **options)
        return _done(context, key, "celery", True, name)

    _named(send, "celery", name)
    return send


def taskiq_sender(
    task: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    slot_kwarg: str | None = None,
    labels: Mapping[str, Any] | None = None,
) -> Callable[[RunContext], Awaitable[HandOff]]:
    """A task that kicks taskiq *task* (``@broker.task``) with ``task_id`` the slot's key.

    The broker must be started (``await broker.startup()``) while the scheduler runs. The
    task gets *args* and *kwargs*, plus the slot as an ISO 8601 string in *slot_kwarg* when
    given, and *labels*. taskiq does not de-duplicate by ``task_id``; the key is the
    result's id, so a task (or its result backend) can tell a resend.
    """

    async def send(context: RunContext) -> HandOff:
        key = context.idempotency_key
        kicker = task.kicker().with_task_id(key)
        if labels:
            kicker = kicker.with_labels(**labels)
        await kicker.kiq(*args, **_payload(context, kwargs, slot_kwarg))
        return _done(context, key, "taskiq", True, task.task_name)

    _named(send, "taskiq", task.task_name)
    return send


def dramatiq_sender(
    actor: Any,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    slot_kwarg: str | None = None,
    delay: int | None = None,
    **options: Any,
) -> Callable[[RunContext], HandOff]:
    """A task that sends a message to Dramatiq *actor* with ``message_id`` the slot's key.

    A plain function (the broker's ``enqueue`` blocks): the scheduler runs it in a worker
    thread. The message carries *args* and *kwargs*, plus the slot as an ISO 8601 string in
    *slot_kwarg* when given; *delay* is in milliseconds and *options* are the message's
    (``max_retries``, ...). Dramatiq does not de-duplicate by ``message_id``; the actor can
    read it (``CurrentMessage``) to tell a resend.
    """

    def send(context: RunContext) -> HandOff:
        key = context.idempotency_key
        message = actor.message_with_options(
            args=tuple(args), kwargs=_payload(context, kwargs, slot_kwarg), **options
        )
        actor.broker.enqueue(message.copy(message_id=key), delay=delay)
        return _done(context, key, "dramatiq", True, actor.actor_name)

    _named(send, "dramatiq", actor.actor_name)
    return send
