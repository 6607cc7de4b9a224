"""A job's coordination, decided once when it is registered: which locker it asks, which of
the locker's optional capabilities its runs use, and whether the elector is asked first.

:func:`wire` reads a locker's capabilities once per locker class (the runtime Protocol
checks are costly); jobs registered alike share one :class:`Wiring`.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .._locking.protocols import (
    BatchLedgerLocker,
    CheckableLocker,
    ClaimAheadLocker,
    CrashWatchingLocker,
    Elector,
    FleetWatchingLocker,
    KeyedLocker,
    LedgerLocker,
    Locker,
    NamespacedLocker,
    PruningLocker,
    ScheduleNotingLocker,
    SlotRecordingLocker,
)

__all__ = (
    "Describe",
    "Note",
    "Record",
    "Wiring",
    "checkable",
    "namespace_of",
    "tagged_note",
    "wire",
)

Note = Callable[[str, str, datetime | None, frozenset[str], str | None], None]
"""A locker's ``note_schedule`` as jobs call it: ``(job, schedule, next slot, tags, target)``,
*target* the job's function (``module.qualname``) or ``None`` when it did not change."""

Describe = Callable[[str, "str | None"], None]
"""A locker's ``describe_slots``: ``(job, spec)`` (:class:`SlotRecordingLocker`)."""
Record = Callable[[str, datetime, datetime, str, str, "datetime | None"], None]
"""A locker's ``record_slots``: ``(job, first, last, fate, reason, into)``."""


@dataclass(frozen=True, slots=True)
class Wiring:
    """How one job is coordinated, decided once when it is registered.

    The words, one meaning each: a *coordinated* job is one registered with
    ``distributed=True`` (:attr:`cronlock.Job.coordinated`); its runs are *gated* when they
    have anyone to ask before they start (the elector, the locker, or both), and *elected*
    when the elector is one of them.

    ``locker`` is None for a job that coordinates through no locker (``distributed=False``,
    or a scheduler without one); ``ledger`` is the same locker when it keeps a run ledger;
    ``elected`` says whether runs ask the elector first.
    """

    locker: Locker | None = None
    ledger: LedgerLocker | None = None
    note: Note | None = None
    """The locker's ``note_schedule``, given the job's tags and function when it takes them."""
    crashes: CrashWatchingLocker | None = None
    """The same locker when it reports crashed runs (the scheduler may rerun them)."""
    batch: BatchLedgerLocker | None = None
    """The same locker when it reads in batches and answers refusals with history."""
    fleet: FleetWatchingLocker | None = None
    """The same locker when it reads the fleet's pauses, triggers and latest runs."""
    elected: bool = False
    gated: bool = False
    """True when a run has anyone to ask before it starts (elector, locker or both)."""
    ahead: timedelta = timedelta(0)
    """How long before a slot its claim may go out (see :class:`ClaimAheadLocker`)."""
    retention: float | None = None
    """Seconds after its slot the locker prunes a row (see :class:`PruningLocker`)."""
    fnv_keys: bool = True
    """Whether its lock keys are FNV-1a of the name, checked for collisions (KeyedLocker)."""
    check: CheckableLocker | None = None
    """The same locker when it can check, at the scheduler's start, that it can work."""
    describe: Describe | None = None
    """The locker's ``describe_slots`` when its ledger tells slots' fates."""
    record: Record | None = None
    """The locker's ``record_slots`` when its ledger tells slots' fates."""
    namespace: str = ""
    """What its runs' :attr:`~cronlock.RunContext.namespace` is (see :func:`namespace_of`)."""


def namespace_of(locker: Locker | None, given: str | None) -> str:
    """The namespace of a job's idempotency keys: the scheduler's *given* one, else the
    ledger's name of its *locker* (a :class:`NamespacedLocker`: ``PostgresLocker``), else
    ``""``."""
    if given is not None:
        return given
    if locker is None or not _locker_kinds(type(locker))[-1]:
        return ""
    return typing.cast(NamespacedLocker, locker).idempotency_namespace()


def wire(
    *,
    distributed: bool,
    own: Locker | None,
    default: Locker | None,
    elector: Elector | None,
    namespace: str | None = None,
) -> Wiring:
    """The wiring of a job with its *own* locker (or the scheduler's *default*); *namespace*
    the scheduler's ``idempotency_namespace``."""
    locker = own if own is not None else default
    if not distributed:
        # Not coordinated, but its keys are its ledger's all the same: every replica runs
        # the slot, and a queue that de-duplicates by key takes it once.
        named = namespace_of(locker, namespace)
        return Wiring(namespace=named) if named else _UNCOORDINATED
    if locker is None:
        return Wiring(
            elected=elector is not None,
            gated=elector is not None,
            namespace=namespace_of(None, namespace),
        )
    fates, ledger, notes, crashes, batch, fleet, ahead, prunes, keyed, checks, _ = _locker_kinds(
        type(locker)
    )
    recorder = typing.cast(SlotRecordingLocker, locker) if fates else None
    return Wiring(
        locker=locker,
        ledger=typing.cast(LedgerLocker, locker) if ledger else None,
        note=tagged_note(typing.cast(ScheduleNotingLocker, locker).note_schedule)
        if notes
        else None,
        crashes=typing.cast(CrashWatchingLocker, locker) if crashes else None,
        batch=typing.cast(BatchLedgerLocker, locker) if batch else None,
        fleet=typing.cast(FleetWatchingLocker, locker) if fleet else None,
        elected=elector is not None,
        gated=True,
        ahead=_ahead(typing.cast(ClaimAheadLocker, locker).claims_ahead()) if ahead else _NOW,
        retention=typing.cast(PruningLocker, locker).retention() if prunes else None,
        fnv_keys=not (keyed and typing.cast(KeyedLocker, locker).keyed_keys()),
        check=typing.cast(CheckableLocker, locker) if checks else None,
        describe=None if recorder is None else recorder.describe_slots,
        record=None if recorder is None else recorder.record_slots,
        namespace=namespace_of(locker, namespace),
    )


_UNCOORDINATED = Wiring()


def checkable(locker: Locker | None) -> CheckableLocker | None:
    """*locker* when it can check that it works (a scheduler's own locker, which no job's
    wiring may name yet: it is checked at start all the same)."""
    if locker is None or not _locker_kinds(type(locker))[-2]:
        return None
    return typing.cast(CheckableLocker, locker)


_NOW = timedelta(0)


@functools.lru_cache(maxsize=64)
def _ahead(seconds: float) -> timedelta:
    return timedelta(seconds=seconds) if seconds > 0 else _NOW


@functools.cache
def _locker_kinds(
    kind: type,
) -> tuple[bool, bool, bool, bool, bool, bool, bool, bool, bool, bool, bool]:
    # A runtime Protocol check walks every member (~20 us); registering 100,000 jobs on
    # one locker pays for it once.
    return (  # (read from the end by namespace_of and checkable)
        issubclass(kind, SlotRecordingLocker),
        issubclass(kind, LedgerLocker),
        issubclass(kind, ScheduleNotingLocker),
        issubclass(kind, CrashWatchingLocker),
        issubclass(kind, BatchLedgerLocker),
        issubclass(kind, FleetWatchingLocker),
        issubclass(kind, ClaimAheadLocker),
        issubclass(kind, PruningLocker),
        issubclass(kind, KeyedLocker),
        issubclass(kind, CheckableLocker),
        issubclass(kind, NamespacedLocker),
    )


def tagged_note(note: Callable[..., None]) -> Note:
    """*note*, a locker's ``note_schedule``, called with a job's tags and its function
    (``target``) only when it takes them (``ScheduleNotingLocker``; one written for an
    older cronlock does not). Asked once per wiring, which jobs alike share."""
    try:
        takes = inspect.signature(note).parameters.keys() & {"tags", "target"}
    except (TypeError, ValueError):  # no signature to read: called as before
        takes = set()
    if takes == {"tags", "target"}:
        return lambda job, schedule, nxt, tags, target: note(
            job, schedule, nxt, tags=tags, target=target
        )
    if "tags" in takes:
        return lambda job, schedule, nxt, tags, target: note(job, schedule, nxt, tags=tags)
    if "target" in takes:
        return lambda job, schedule, nxt, tags, target: note(job, schedule, nxt, target=target)
    return lambda job, schedule, nxt, tags, target: note(job, schedule, nxt)
