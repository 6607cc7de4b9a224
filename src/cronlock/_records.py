"""Values every layer shares: what a run is told, how it went, and the names of the rules.

A leaf module: it imports nothing from cronlock, so every other module may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal, get_args

__all__ = (
    "DEFAULT_MISFIRE_GRACE",
    "FINAL_OUTCOMES",
    "NEVER_BEGAN",
    "OVERLAPS",
    "PAUSED_BEFORE_START",
    "CatchUpPolicy",
    "Outcome",
    "Overlap",
    "RunContext",
    "RunRecord",
    "error_summary",
    "idempotency_key",
    "run_context",
)

Overlap = Literal["skip", "queue", "allow", "replace"]
"""What a job does when its next slot comes while a run is still going."""
CatchUpPolicy = Literal["latest", "all"]
"""What runs of the slots a job owes (several due at once after a stall, an outage, the
fleet down): ``"latest"`` (the default) runs the latest within its grace and the older ones
coalesce into it; ``"all"`` runs every owed slot within its grace once, in order."""

NEVER_BEGAN = "its lock was lost before the run began"
"""The ``error`` of a ``lock_lost`` run whose body never started (claimed ahead, its lock
lost while it waited for its slot): nothing ran, so the slot is claimed again (the crash
recovery's takeover, whatever ``recover`` says) while its grace lasts."""

PAUSED_BEFORE_START = "paused before its slot began"
"""The ``error`` of a ``cancelled`` run whose job was paused on its replica between the
slot's claim (ahead of the slot) and the slot's instant: its body never began, and no
replica runs the slot (the others were refused it)."""

Outcome = Literal[
    "succeeded", "failed", "timed_out", "cancelled", "lock_lost", "crashed", "unfinished"
]
"""How a run ended. ``"crashed"``: a ledger row whose replica died mid-run (its lock session
is gone); ``"unfinished"``: a ledger row whose run has not (yet) ended."""

OVERLAPS: Final[tuple[Overlap, ...]] = get_args(Overlap)
FINAL_OUTCOMES: Final[frozenset[Outcome]] = frozenset(get_args(Outcome)) - {"unfinished"}

DEFAULT_MISFIRE_GRACE: Final = 60.0
"""Seconds a slot may be late and still run (per job: ``misfire_grace``)."""

# The UUID under which idempotency_key derives its keys (name-based, version 5): itself
# uuid5(NAMESPACE_URL, "cronlock:idempotency-key"). Fixed for good, as is the text hashed: a
# change would change every key, and a queue would take a resent slot for a new one.
_IDEMPOTENCY_ROOT: Final = "2e26542d-3e24-5b24-a0c4-75c0c9961761"


def idempotency_key(namespace: str, job: str, slot: datetime) -> str:
    """The idempotency key of *slot* of *job* in *namespace*: what
    :attr:`RunContext.idempotency_key` is, computed anywhere.

    The name-based UUID (version 5, SHA-1) of the text ``namespace + "\\n" + job + "\\n" +
    when`` under the root ``2e26542d-3e24-5b24-a0c4-75c0c9961761``, in its canonical
    36-character form, which every queue's id field takes. *when* is the slot in UTC as ISO
    8601 with a ``Z``, and a fraction only when it has microseconds
    (``2026-12-05T03:00:00Z``, ``2026-12-05T03:00:00.250000Z``). A job's name holds no
    line break (registration refuses control characters), nor does the slot's text, so no
    two (namespace, job, slot) hash the same text. *slot* must be aware (``ValueError``).
    """
    import uuid  # here: `import cronlock` does not need it

    offset = slot.utcoffset()
    if offset is None:
        raise ValueError(f"idempotency_key: slot {slot!r} is naive; give an aware datetime")
    when = (slot - offset).replace(tzinfo=None).isoformat() + "Z"
    return str(uuid.uuid5(uuid.UUID(_IDEMPOTENCY_ROOT), f"{namespace}\n{job}\n{when}"))


@dataclass(frozen=True, slots=True)
class RunContext:
    """What a task learns about the run it is part of.

    Declare a parameter annotated ``RunContext`` and the scheduler passes it by keyword.
    """

    job: str
    """The job's name."""
    slot: datetime
    """The scheduled instant this run belongs to (aware UTC)."""
    started_at: datetime
    """When the run started, by the scheduler's clock (aware UTC)."""
    run_number: int
    """1 for the job's first run on this replica, then 2, 3, ..."""
    attempt: int = 1
    """Which try at its slot this run is: 1 for the slot's first run, then 2, 3, ... for
    its retries (``retries=N``: at most ``1 + N``). The ledger records each attempt
    (:attr:`RunRecord.attempts`)."""
    namespace: str = ""
    """What keeps this service's :attr:`idempotency_key` apart from another's on a shared
    broker: ``Scheduler(idempotency_namespace=...)`` when set, else the ledger's name of
    the job's locker (``PostgresLocker``: its table, ``schema.table`` with a schema), else
    ``""``."""

    @property
    def idempotency_key(self) -> str:
        """A key for handing this slot off to a queue: the same on every replica and for
        every attempt at the slot (a retry after a failed send), different for another job,
        slot or :attr:`namespace`. :func:`cronlock.idempotency_key` of (``namespace``,
        ``job``, ``slot``): a UUID's 36 characters (docs: guides/queues.md)."""
        return idempotency_key(self.namespace, self.job, self.slot)


_new = object.__new__
_set_job, _set_slot, _set_started, _set_number, _set_attempt, _set_namespace = (
    RunContext.__dict__[name].__set__
    for name in ("job", "slot", "started_at", "run_number", "attempt", "namespace")
)


def run_context(
    job: str,
    slot: datetime,
    started_at: datetime,
    run_number: int,
    attempt: int = 1,
    namespace: str = "",
) -> RunContext:
    """``RunContext(job, slot, started_at, run_number, attempt, namespace)`` for the hot
    path: the frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``; this sets the slots directly, at about half the cost."""
    context = _new(RunContext)
    _set_job(context, job)
    _set_slot(context, slot)
    _set_started(context, started_at)
    _set_number(context, run_number)
    _set_attempt(context, attempt)
    _set_namespace(context, namespace)
    return context


@dataclass(frozen=True, slots=True)
class RunRecord:
    """How one run went.

    ``outcome`` is ``"unfinished"`` (and ``finished_at`` None) for a run a ledger shows as
    started but not ended: still running, or its replica died moments ago. ``"crashed"`` is
    such a run once a live replica found its lock session gone (``finished_at`` is then
    when it noticed).
    """

    slot: datetime
    started_at: datetime
    finished_at: datetime | None
    outcome: Outcome
    error: str | None = None
    """A one-line summary of the exception, for failed runs."""
    owner: str | None = None
    """Who ran it (``host:pid``), when a ledger recorded it."""
    attempt: int = 1
    """1 for a slot's first run; 2, 3, ... for its retries (``retries=N``), 2 for the rerun
    of a crashed one (``recover=True``)."""
    manual: bool = False
    """True for a run asked for by a fleet-wide trigger (``FleetControl.trigger``, the
    command line's ``trigger``, the dashboard's button), as its ledger recorded it."""
    attempts: tuple[RunRecord, ...] = ()
    """The slot's earlier attempts, oldest first, each a record of its own (attempt,
    outcome, error, times, owner; its own ``attempts`` empty): the failed tries before a
    retry, the crashed run before its rerun. Filled by the ``history`` reads of a ledger
    that keeps them (``InMemoryLocker``, ``PostgresLocker``); empty for a slot tried once,
    and in the other reads (``Job.last_run``, ...)."""


def error_summary(exc: BaseException, limit: int = 500) -> str:
    """``Type: first line of the message``, at most *limit* characters (ledger, events)."""
    text = (
        f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc) else type(exc).__name__
    )
    return text[:limit]


def timed_out_error(timeout: float) -> str:
    """The error of a run that hit its *timeout*: ``timed out after 600 s``."""
    return f"timed out after {timeout:g} s"
