"""The oracle of the promise (DESIGN.md §3a): every slot runs once across the fleet, or
says why — judged from what a user can see, never from cronlock's own rules.

It reads the jobs' own effects (a body writes ``start`` and ``end`` itself), the events the
replicas emitted and the lines they logged (matched by class name and text, as a
listener or a log search would), and the ledger's rows as ``history`` shows them. It knows
the jobs' schedules (it computes their slots itself, by plain arithmetic) and the faults
that were staged; it does not import the library's rules: not its grace checks, not its
coalescing, not its notion of owed. What it checks:

- ``twice``: a (job, slot, attempt) started more than once, or more attempts than retries allow;
- ``overlap``: two runs of one job ran at the same time (spans from the bodies' effects;
  a process stopped runs nothing, so a body's span leaves out its process's freezes, and
  what the body does once it wakes counts);
- ``silent``: a slot in the judged window neither started nor has a fate a user can see;
- ``late``: a slot that did not run, whose disruption ended within its grace, was given up
  (not run late, nor coalesced into a later slot that ran);
- ``unfinished``: a ledger row without an outcome once everything settled (but for the
  last claims of replicas killed in a fleet that is gone: nobody is left to mark them);
- ``lie``: a replica said it reruns a crashed run (``JobCrashed(recovered=True)``) and no
  start of that slot followed;
- ``attempt``: that rerun was told the same attempt number as the run it reruns;
- ``error``: an exception escaped a task of the library;
- ``livelock``: a replica kept its loop busy without time moving (the world could not go on);
- ``gone-ok``: every replica had stopped and a job's alert grace (``alert_after``) had
  passed since its first slot that did not run, and ``status --check`` did not say it is
  overdue (DESIGN.md §5: that verdict comes from the ledger alone, fleet gone or not). The
  oracle gets the verdict texts the command printed, per job; ``absent`` (no live replica
  runs it) is the other word ``--check`` fails a gone fleet's job with.

A fate a user can see: a ledger row for the slot with an outcome; a ``SlotsDecided`` event
naming it (its fate, and the slot it coalesced into, followed while that one was coalesced
in turn); a ``JobSkipped`` event for
it with a reason that is a fate (``overlap``, ``misfire``, ``paused``, ``standby``,
``not_leader``: not ``locked`` or ``already_ran``, which say someone else ran it); or a
WARNING (or worse) naming the job and the slot, or a range of slots holding it.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ("RULES", "JobView", "Judged", "Violation", "judge")

RULES = (
    "twice",
    "overlap",
    "silent",
    "late",
    "unfinished",
    "lie",
    "attempt",
    "error",
    "livelock",
    "gone-ok",
)

_FATES = {"overlap", "misfire", "paused", "standby", "not_leader"}
_ISO = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class JobView:
    """What the oracle knows of a job: its name, its schedule, the options a user set."""

    name: str
    schedule: str
    """``every:<seconds>`` or ``cron:* * * * *`` (the forms the simulation's jobs use)."""
    grace: float = 60.0
    retries: int = 0
    overlap: str = "skip"
    recover: bool = False
    """A crashed run's slot may run again (one attempt more)."""
    alert_after: float | None = None
    """Seconds after a slot that did not run by which the fleet's status must say the job
    is overdue (the ``alert_after`` its user set; ``None``: not judged)."""

    @property
    def attempts(self) -> int:
        """The most attempts a slot of this job may have."""
        return 1 + self.retries + (1 if self.recover else 0)

    def slots(self, start: datetime, end: datetime) -> list[datetime]:
        """The job's slots in [start, end), computed here, not by the library."""
        kind, _, value = self.schedule.partition(":")
        if kind == "every":
            step = float(value)
        elif value.split()[0] == "*":
            step = 60.0
        else:
            raise ValueError(f"the oracle computes 'every:N' and '* * * * *' only, not {value!r}")
        first = -(-(start - _EPOCH).total_seconds() // step) * step
        slots = []
        t = first
        while _EPOCH + timedelta(seconds=t) < end:
            slots.append(_EPOCH + timedelta(seconds=t))
            t += step
        return slots


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken promise: the rule, the job and slot, and what was seen."""

    rule: str
    job: str
    slot: datetime | None
    detail: str

    def text(self) -> str:
        """One line."""
        at = "" if self.slot is None else f" slot {self.slot:%H:%M:%S.%f}"[:-3]
        return f"{self.rule}: job {self.job!r}{at}: {self.detail}"


@dataclass(slots=True)
class Judged:
    """The verdict of one run."""

    slots: int = 0
    ran: int = 0
    explained: int = 0
    violations: list[Violation] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Start:
    slot: datetime
    attempt: int
    replica: str
    begin: float
    end: float | None


def judge(
    *,
    jobs: Sequence[JobView],
    epoch: datetime,
    window: tuple[float, float],
    settled: float,
    effects: Iterable[Any],
    said: Iterable[Any],
    ledger: Iterable[dict[str, Any]],
    disruptions: Sequence[tuple[float, float]],
    gone: dict[str, float],
    frozen: Sequence[tuple[str, float, float]] = (),
    killed: Set[tuple[str, int]] = frozenset(),
    errors: Sequence[str] = (),
    readings: Sequence[tuple[float, Mapping[str, str]]] = (),
    fleet_gone: float | None = None,
) -> Judged:
    """Judge a run.

    *window*: seconds into the run whose slots are judged; *settled*: when the run ended
    (every slot of the window has had its chance, every owed thing its time);
    *disruptions*: the staged faults' spans (seconds); *gone*: replicas killed, and when
    (a body started there and never ended is taken to have ended then); *frozen*: each
    freeze of a replica (its name, from, until: its bodies run nothing meanwhile); *killed*:
    the (host, pid) of the replicas killed (with the fleet gone, nobody is left to mark
    their last claims crashed: those stay unfinished, truly); *readings*: what
    ``status --check`` said of each job (``overdue``, ``ok``...), and when (seconds);
    *fleet_gone*: when every replica had stopped (``None``: the fleet never did).
    """
    verdict = Judged()

    def at(seconds: float) -> datetime:
        return epoch + timedelta(seconds=seconds)

    starts: dict[str, list[_Start]] = defaultdict(list)
    open_: dict[tuple[str, datetime, int, str], float] = {}
    for effect in effects:
        key = (effect.job, effect.slot, effect.attempt, effect.replica)
        if effect.kind == "start":
            open_[key] = effect.at
        else:
            begin = open_.pop(key, effect.at)
            starts[effect.job].append(
                _Start(effect.slot, effect.attempt, effect.replica, begin, effect.at)
            )
    for (name, slot, attempt, replica), begin in open_.items():
        starts[name].append(_Start(slot, attempt, replica, begin, gone.get(replica)))

    skipped: dict[tuple[str, datetime], set[str]] = defaultdict(set)
    told: list[Any] = []  # SlotsDecided events
    decided: dict[tuple[str, datetime], tuple[str, datetime | None]] = {}
    recovered: list[tuple[str, datetime, str, float, int | None]] = []
    warnings: list[tuple[float, str]] = []
    for item in said:
        what = item.what
        if isinstance(what, logging.LogRecord):
            if what.levelno >= logging.WARNING:
                warnings.append((item.at, what.getMessage()))
            continue
        kind = type(what).__name__
        if kind == "JobSkipped":
            skipped[(what.job, what.slot)].add(what.reason)
        elif kind == "JobCrashed" and what.recovered:
            recovered.append((what.job, what.slot, item.replica, item.at, None))
        elif kind == "JobRetrying":
            recovered.append((what.job, what.slot, item.replica, item.at, what.attempt))
        elif kind == "SlotsDecided":
            told.append(what)
    rows = {(row["job"], row["slot"]): row for row in ledger}
    by_name = {job.name: job for job in jobs}
    for what in told:  # a range of slots, each with the fate told (the first told stands)
        job = by_name.get(what.job)
        end = what.last + timedelta(microseconds=1)  # (slots() is half-open; a range is not)
        for slot in () if job is None else job.slots(what.slot, end):
            decided.setdefault((what.job, slot), (what.fate, what.into))

    for message in errors:
        verdict.violations.append(Violation("error", "-", None, message))

    for job in jobs:
        runs = starts.get(job.name, [])
        reruns = _reruns(job, runs, recovered, verdict, warnings)
        _twice(job, [run for run in runs if id(run) not in reruns], verdict)
        if job.overlap != "allow":
            _overlaps(job, runs, verdict, settled, frozen)
        ran = {run.slot for run in runs}
        for slot in job.slots(at(window[0]), at(window[1])):
            verdict.slots += 1
            if slot in ran:
                verdict.ran += 1
                continue
            found = _fate(job, slot, skipped, rows, warnings, decided)
            if found is None:
                seen = sorted(skipped.get((job.name, slot), ()))
                verdict.violations.append(
                    Violation(
                        "silent",
                        job.name,
                        slot,
                        "never ran and nothing a user can see says why"
                        + (f" (skips seen: {', '.join(seen)})" if seen else ""),
                    )
                )
                continue
            verdict.explained += 1
            fate, into = found
            due = (slot - epoch).total_seconds()
            ended = _disruption_end(due, disruptions)
            later = [s for s in ran if slot < s <= slot + timedelta(seconds=job.grace)]
            into = _follow(job.name, into, ran, decided)
            if fate == "coalesced" and into is not None and into not in ran:
                verdict.violations.append(
                    Violation(
                        "late",
                        job.name,
                        slot,
                        f"coalesced into slot {into:%H:%M:%S}, which did not run",
                    )
                )
            elif fate == "coalesced" and not later:
                verdict.violations.append(
                    Violation(
                        "late", job.name, slot, "coalesced into a later slot, none of which ran"
                    )
                )
            elif (
                fate in ("misfire", "missed")
                and ended is not None
                and ended < due + job.grace - 5
                and not later
            ):
                verdict.violations.append(
                    Violation(
                        "late",
                        job.name,
                        slot,
                        f"given up ({fate}) though its disruption ended "
                        f"{ended - due:.1f}s after it, within its grace of {job.grace:g}s",
                    )
                )
    if fleet_gone is not None:
        _gone_ok(jobs, starts, readings, fleet_gone, at, verdict)
    for (job_name, slot), row in rows.items():
        orphaned = fleet_gone is not None and (row.get("host"), row.get("pid")) in killed
        if row.get("outcome") is None and not orphaned:
            verdict.violations.append(
                Violation(
                    "unfinished",
                    job_name,
                    slot,
                    f"its ledger row has no outcome once the fleet settled (claimed by "
                    f"{row.get('host')}:{row.get('pid')})",
                )
            )
    return verdict


_SAID_OVERDUE = frozenset({"overdue", "absent"})
_SLACK = 1.0
"""Seconds past a grace before the status must say it (the oracle does not know how the
library compares instants, nor how long its reads take)."""


def _gone_ok(
    jobs: Sequence[JobView],
    starts: Mapping[str, list[_Start]],
    readings: Sequence[tuple[float, Mapping[str, str]]],
    gone: float,
    at: Callable[[float], datetime],
    verdict: Judged,
) -> None:
    """``gone-ok``: once the fleet is gone and a job's alert grace passed since its first
    slot that did not run (the first after the last that started), each reading of the
    status must say the job is overdue."""
    for job in jobs:
        if job.alert_after is None:
            continue
        began = [run.slot for run in starts.get(job.name, [])]
        after = max(began) + timedelta(microseconds=1) if began else at(0.0)
        missed = job.slots(after, after + timedelta(days=1))[0]
        due = (missed - at(0.0)).total_seconds() + job.alert_after
        for when, said in readings:
            if when < gone or when <= due + _SLACK:
                continue
            word = said.get(job.name, "unknown")
            if word not in _SAID_OVERDUE:
                verdict.violations.append(
                    Violation(
                        "gone-ok",
                        job.name,
                        missed,
                        f"the fleet was gone at {gone:.3f}s; at {when:.3f}s, "
                        f"{when - due + job.alert_after:.1f}s after this slot that did not run "
                        f"(alert_after {job.alert_after:g}s), status --check said {word!r}",
                    )
                )


def _reruns(
    job: JobView,
    runs: list[_Start],
    announced: list[tuple[str, datetime, str, float, int | None]],
    verdict: Judged,
    warnings: Sequence[tuple[float, str]] = (),
) -> set[int]:
    """The runs a replica announced: a crashed run's rerun (``JobCrashed(recovered=True)``,
    attempt *None*: the one after the run it reruns) or a retry (``JobRetrying``, its
    attempt), each the first start of the slot at or after the announcement. A rerun
    announced that never starts is a ``lie``, unless its replica said afterwards, at WARNING,
    that it is not made after all (naming the job and the slot); an announced run told a
    lower attempt than
    announced is an ``attempt`` violation (its body cannot tell it from the first, nor can
    a key made of the two). Returns those runs (by ``id``), which are judged here, not as a
    slot started twice."""
    found: set[int] = set()
    for name, slot, replica, said_at, attempt in announced:
        if name != job.name:
            continue
        before = [run for run in runs if run.slot == slot and run.begin < said_at]
        after = sorted(
            (run for run in runs if run.slot == slot and run.begin >= said_at),
            key=lambda run: run.begin,
        )
        if not after:
            # (a retry may be refused: the next slot came first)
            if attempt is None and not _retracted(name, slot, said_at, warnings):
                verdict.violations.append(
                    Violation("lie", job.name, slot, f"{replica} said it reruns it; no rerun began")
                )
            continue
        rerun = after[0]
        found.add(id(rerun))
        expected = (
            attempt if attempt is not None else 1 + max((run.attempt for run in before), default=0)
        )
        if rerun.attempt < expected:
            what = "rerun" if attempt is None else "retry"
            verdict.violations.append(
                Violation(
                    "attempt",
                    job.name,
                    slot,
                    f"the {what} {replica} announced (attempt {expected}) was told attempt "
                    f"{rerun.attempt}",
                )
            )
    return found


def _retracted(
    name: str, slot: datetime, said_at: float, warnings: Sequence[tuple[float, str]]
) -> bool:
    """Whether a WARNING after *said_at* says the rerun of *name*'s *slot* is not made
    after all (any replica's line: the oracle does not know who logged it)."""
    quoted, stamp = repr(name), slot.isoformat()
    return any(
        at >= said_at and quoted in message and stamp in message and "after all" in message
        for at, message in warnings
    )


def _twice(job: JobView, runs: list[_Start], verdict: Judged) -> None:
    seen: dict[tuple[datetime, int], _Start] = {}
    for run in runs:
        key = (run.slot, run.attempt)
        if key in seen:
            verdict.violations.append(
                Violation(
                    "twice",
                    job.name,
                    run.slot,
                    f"attempt {run.attempt} started on {seen[key].replica} and on {run.replica}",
                )
            )
        seen[key] = run
        if run.attempt > job.attempts:
            verdict.violations.append(
                Violation("twice", job.name, run.slot, f"attempt {run.attempt} of {job.attempts}")
            )


def _executing(
    begin: float, end: float, freezes: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of a body's span [*begin*, *end*] its process was not frozen in: a
    stopped process runs nothing, so its body does nothing while another replica runs the
    job; what it does once it wakes counts."""
    if begin == end:  # an instant: a start (and end) while frozen is not one
        return [] if any(stop <= begin < wake for stop, wake in freezes) else [(begin, end)]
    pieces = [(begin, end)]
    for stop, wake in freezes:
        pieces = [
            part
            for low, high in pieces
            for part in ((low, min(high, stop)), (max(low, wake), high))
            if part[1] > part[0]
        ]
    return pieces


def _meet(a: float, b: float, c: float, d: float) -> bool:
    """Whether [a, b] and [c, d] share a moment inside both (an instant inside a span
    counts; two spans that only touch do not)."""
    if a == b:
        return c < a < d
    if c == d:
        return a < c < b
    return max(a, c) < min(b, d)


def _overlaps(
    job: JobView,
    runs: list[_Start],
    verdict: Judged,
    settled: float,
    frozen: Sequence[tuple[str, float, float]],
) -> None:
    spans = sorted((run.begin, run.end if run.end is not None else settled, run) for run in runs)
    freezes: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for replica, stop, wake in frozen:
        freezes[replica].append((stop, wake))
    for i, (begin, end, run) in enumerate(spans):
        for other_begin, other_end, other in spans[i + 1 :]:
            if other_begin >= end:
                break
            if other_begin == end:
                continue
            mine = _executing(begin, end, freezes[run.replica])
            theirs = _executing(other_begin, other_end, freezes[other.replica])
            if not any(_meet(a, b, c, d) for a, b in mine for c, d in theirs):
                continue  # apart once the freezes are taken out
            verdict.violations.append(
                Violation(
                    "overlap",
                    job.name,
                    other.slot,
                    f"started on {other.replica} at {other_begin:.3f}s while the run of "
                    f"slot {run.slot:%H:%M:%S} on {run.replica} ran ({begin:.3f}-{end:.3f}s)",
                )
            )


def _follow(
    name: str,
    into: datetime | None,
    ran: set[datetime],
    decided: Mapping[tuple[str, datetime], tuple[str, datetime | None]],
) -> datetime | None:
    """The slot a coalesced slot's run is: *into*, or, when *into* did not run and was told
    coalesced in turn, the slot that one was coalesced into, and so on."""
    for _ in range(100):
        if into is None or into in ran:
            return into
        fate, further = decided.get((name, into), ("", None))
        if fate != "coalesced" or further is None or further <= into:
            return into
        into = further
    return into


def _fate(
    job: JobView,
    slot: datetime,
    skipped: dict[tuple[str, datetime], set[str]],
    rows: dict[tuple[str, datetime], dict[str, Any]],
    warnings: list[tuple[float, str]],
    decided: Mapping[tuple[str, datetime], tuple[str, datetime | None]] = {},
) -> tuple[str, datetime | None] | None:
    """What a user can see became of a slot that did not start, or ``None``; with, for a
    slot said coalesced into a range's last slot ("missed slots from A to B coalesced into
    one run"), that slot B (the one run, which must have run). A ``SlotsDecided`` event
    names the fate and the slot coalesced into as data."""
    row = rows.get((job.name, slot))
    if row is not None and row.get("outcome") is not None:
        return str(row["outcome"]), None
    told = decided.get((job.name, slot))
    if told is not None:
        return told
    reasons = skipped.get((job.name, slot), set()) & _FATES
    if reasons:
        return sorted(reasons)[0], None
    quoted = repr(job.name)
    for _, message in warnings:
        if quoted not in message and f"'{job.name}'" not in message:
            continue
        stamps = [s for s in (_parse(text) for text in _ISO.findall(message)) if s is not None]
        coalesced = "coalesc" in message
        if len(stamps) >= 2 and stamps[0] <= slot <= stamps[1]:
            if not coalesced:
                return "missed", None
            if slot < stamps[1]:
                return "coalesced", stamps[1]
            continue  # the one run itself: said of it, not a fate of it
        if slot in stamps:
            return ("coalesced" if coalesced else "missed"), None
    return None


def _parse(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _disruption_end(due: float, disruptions: Sequence[tuple[float, float]]) -> float | None:
    """When the staged disruption the slot fell due in ended (``None``: none did)."""
    ends = [end for begin, end in disruptions if begin - 1.0 <= due <= end + 1.0]
    return max(ends) if ends else None
