"""The soak's checker: every slot of the judged window, matched to the runs that were for it.

It reads what the replicas did (their effects files: a ``start`` line as a run's first act,
``end`` as its last, ``cancel`` when it was cancelled; ``skip``, ``lockfailed`` and
``lost`` lines for the events ``JobSkipped``, ``LockFailed`` and ``LockLost``), what the
nemesis did (its faults, each with its *outage*, the time until every replica could reach
the server again, and its *window*, in which it may cost slots), and the ledger as the
soak left it (``cronlock_runs``: which process's claim of each slot stands), and judges:

- **duplicates**: a slot with two *finished* runs (``end`` lines). Must be 0, but for a
  ``recover=True`` job inside a fault window: its run may have finished while the fault
  kept its outcome from the ledger (a partition, a server crash), and another replica then
  reruns the slot as crashed. That is the documented price of ``recover=True`` (at least
  once, for idempotent jobs), reported as **recovered twice**.
- **overlaps**: two runs of one job, by different processes, in progress at the same
  instant. Must be 0 outside partitions; reported inside them.
- **misses outside fault windows**: a slot with no run, while no run of its job was in
  progress (then the slot was skipped by the overlap rule, as designed) and outside every
  fault's window. Must be 0.
- **misses inside fault windows**: every fault here is shorter than the jobs' misfire
  grace, so a slot due during one is owed a late run once it is over (cronlock's
  ``_core/outage.py``). A slot missed inside a window is a failure, "missed though its
  grace outlasted the fault", unless it is explained, and the explained ones are counted
  by the fault's kind and the explanation:

  - **grace ran out**: the slot's grace ended before the fault's outage did;
  - **outage outlasted the soak**: the fault's outage was not over when the soak stopped
    the replicas (a fault in its last seconds): nothing could run the slot;
  - **claimed by a killed replica**: the ledger's claim of the slot is a process the
    nemesis killed, which never wrote its start line (claimed, then killed);
  - **held**: a replica's claim found the job ``locked`` (``JobSkipped(reason="locked")``):
    its exclusion was held by a cut-off or killed replica's lock or lease;
  - **coalesced**: a replica's claim of it never reached the server (``LockFailed`` with
    ``LockUnavailable``, ``SessionLost`` or ``StatementTimeout``) and was not tried again
    because the replica fired a later slot of the job (owed too, or claimed): cronlock
    keeps only the latest slot of a job owed across an outage (one run of the latest slot
    within the grace); or no replica said a word of it (but a standby's skip: it leaves
    the slot to the racers), it fell due while a claim of an
    earlier slot of the job hung on the server (that claim failed after it: cronlock owes
    such a slot without an event) and a later slot of the job was fired; or the ledger's
    claim of it is ``lock_lost`` by a replica that lost the lock before the run began (a
    ``lost`` line) and fired a later slot of the job since (the loss is known once the
    server answers again: the slot coalesced into the later one). The later slot is judged
    on its own;
  - **behind a late run**: every replica that spoke of it skipped it by the overlap rule,
    and a run of an earlier slot of the job began after it (that run's claim was in flight
    across the outage, and a claim in flight counts as the job running): the outage's
    slots ran once, late, as coalescing would have run them. The overlap rule's skips
    behind a run in progress (``BUSY_EARLY``, ``BUSY_LATE``) are not misses at all.

  A slot a replica skipped as ``misfire`` although the fault's outage ended within its
  grace is a failure whatever else explains it.
- **lost claims**: a slot whose claim in the ledger names a process never killed that
  wrote no start line for it (the fleet took the slot for run, and it never ran). Must be
  0, but for a claim whose lock its claimer lost before the run began (a ``lost`` line,
  outcome ``lock_lost``) and which then fired a later slot of the job: cronlock owes such
  a slot again, and it coalesced into the later one (counted apart); and for a claim the
  server recorded whose answer never reached its claimer (its last word on the slot a
  ``LockFailed`` for want of the server, the claim unfinished) and which then fired a
  later slot of the job: owed, then coalesced (counted apart too). One whose claimer
  claimed it again instead (and was told ``already_ran`` by its own claim) is still a
  lost claim.
- **unrecovered**: slots of a ``recover=True`` job whose only runs never finished.
- **unledgered**: slots that ran but have no claim in the ledger (reported: after a
  failover, claims the standby had not received are gone).

A run with no ``end`` or ``cancel`` line ended when its process was killed (the nemesis
logs the pid), or else is taken to have lasted its job's duration. Only the standard
library is used, so the unit tests can feed it made-up effects.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BUSY_EARLY = 0.3
"""A run that ended up to this long before a slot still made its claim find the job busy
(claims go out ``claim_ahead`` early, and take a round trip)."""
BUSY_LATE = 0.5
"""A run that started up to this long after a slot may have been claimed before it."""
WINDOW_BEFORE = 1.0
"""A fault's window opens this long before it: a claim committed just before a kill (or a
cut, a pause) belongs to a run that never wrote its first line."""
UNREACHABLE = frozenset({"LockUnavailable", "SessionLost", "StatementTimeout"})
"""The ``LockFailed`` exceptions of a claim that never reached a server that could answer
it: the replica owes the slot and claims it again while its grace lasts (only the latest
owed slot of a job is kept)."""
GRACE = 30.0
"""The soak's ``misfire_grace`` (replica.py's ``MISFIRE_GRACE``; run.py passes it)."""


@dataclasses.dataclass(frozen=True)
class Job:
    """What the checker needs of a job: its interval (slots at multiples of it since the
    epoch), its body's duration, whether it opted in to recovery, and its misfire grace."""

    name: str
    interval: float
    duration: float
    recover: bool = False
    grace: float = GRACE


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault the nemesis injected: *kind* on *replica* (``None``: the server) from
    *start* to *end* (true wall time), costing slots until *window_end*. Its outage was
    over by *outage_end*: every replica could reach the server again (the window without
    the lease's term: a lease left held shows as a ``locked`` claim); ``None`` (evidence of
    an older soak): *window_end*. *pids* are the processes it killed."""

    kind: str
    replica: int | None
    start: float
    end: float
    window_end: float
    pids: tuple[int, ...] = ()
    detail: str = ""
    outage_end: float | None = None

    def covers(self, t: float) -> bool:
        return self.start - WINDOW_BEFORE <= t <= self.window_end

    @property
    def over(self) -> float:
        """When its outage was over (see the class)."""
        return self.window_end if self.outage_end is None else self.outage_end


@dataclasses.dataclass(frozen=True)
class Claim:
    """One row of the ledger (``cronlock_runs``) at the end of the soak: *job*'s *slot* was
    claimed by process *pid* on *host* (a rerun's claim replaces the first), and its run
    ended as *outcome* (``None``: unfinished). Times are seconds since the epoch."""

    job: str
    slot: float
    pid: int
    host: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    outcome: str | None = None
    attempt: int = 1
    holder: str | None = None


@dataclasses.dataclass
class Run:
    job: str
    slot: float
    replica: int
    pid: int
    start: float
    end: float | None = None
    outcome: str = "unfinished"  # end, cancel, killed, unfinished


@dataclasses.dataclass
class Verdict:
    """What the checker found; :attr:`failures` lists the rules broken (empty: passed)."""

    judged_from: float
    judged_to: float
    slots: int = 0
    ran: int = 0
    busy: int = 0
    duplicates: list[str] = dataclasses.field(default_factory=list)
    recovered_twice: list[str] = dataclasses.field(default_factory=list)
    double_starts: int = 0
    overlaps_outside: list[str] = dataclasses.field(default_factory=list)
    overlaps_inside: list[str] = dataclasses.field(default_factory=list)
    misses_outside: list[str] = dataclasses.field(default_factory=list)
    misses_inside: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Slots missed inside fault windows, by the kind of the fault that began last before
    them (of those whose windows hold them): the explained and the unexplained ones."""
    explained: dict[str, collections.Counter[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    """kind -> explanation -> slots (the module's list of explanations)."""
    explained_slots: list[str] = dataclasses.field(default_factory=list)
    """Each explained miss: the slot, the fault's kind, the explanation, what was said."""
    unexplained: list[str] = dataclasses.field(default_factory=list)
    """Slots missed inside a fault window though their grace outlasted its outage."""
    unexplained_inside: collections.Counter[str] = dataclasses.field(
        default_factory=collections.Counter
    )
    """The same, counted by the fault's kind."""
    lost_claims: list[str] = dataclasses.field(default_factory=list)
    lost_then_coalesced: int = 0
    unanswered_then_coalesced: int = 0
    """Claims the server recorded whose answer never reached their claimer (its last word
    on the slot a claim that failed for want of the server), which fired a later slot of
    the job since: owed, then coalesced, as a claim that never got through is."""
    unledgered: list[str] = dataclasses.field(default_factory=list)
    ledger: bool = False
    """Whether the ledger was read (the evidence of an older soak has none)."""
    unrecovered: list[str] = dataclasses.field(default_factory=list)
    faults: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    runs: int = 0
    cancelled: int = 0
    killed: int = 0

    @property
    def failures(self) -> list[str]:
        found = []
        if self.duplicates:
            found.append(f"{len(self.duplicates)} slot(s) finished twice: {self.duplicates[:5]}")
        if self.overlaps_outside:
            found.append(
                f"{len(self.overlaps_outside)} overlap(s) outside partitions: "
                f"{self.overlaps_outside[:5]}"
            )
        if self.misses_outside:
            found.append(
                f"{len(self.misses_outside)} slot(s) missed outside fault windows: "
                f"{self.misses_outside[:5]}"
            )
        if self.unexplained:
            found.append(
                f"{len(self.unexplained)} slot(s) missed though their grace outlasted the "
                f"fault: {self.unexplained[:5]}"
            )
        if self.lost_claims:
            found.append(
                f"{len(self.lost_claims)} slot(s) claimed by a live process that never "
                f"started them: {self.lost_claims[:5]}"
            )
        return found

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["misses_inside"] = dict(self.misses_inside)
        data["explained"] = {kind: dict(why) for kind, why in self.explained.items()}
        data["unexplained_inside"] = dict(self.unexplained_inside)
        data["faults"] = dict(self.faults)
        data["failures"] = self.failures
        return data


def read_effects(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The lines of the effects files (a torn last line, cut by a SIGKILL, is dropped)."""
    records: list[dict[str, Any]] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return records


def runs_of(records: Iterable[dict[str, Any]], faults: Sequence[Fault]) -> list[Run]:
    """The runs the records describe, each with its end (or its process's kill)."""
    killed_at = {pid: f.start for f in faults for pid in f.pids}
    runs: dict[tuple[int, str, float], Run] = {}
    for r in records:
        kind = r["e"]
        key = (r["pid"], r["job"], r["slot"])
        if kind == "start":
            runs[key] = Run(r["job"], r["slot"], r["rep"], r["pid"], r["t"])
        elif kind in ("end", "cancel") and key in runs:
            runs[key].end = r["t"]
            runs[key].outcome = kind
    for run in runs.values():
        if run.end is None and run.pid in killed_at and killed_at[run.pid] >= run.start:
            run.end, run.outcome = killed_at[run.pid], "killed"
    return list(runs.values())


def slots_between(job: Job, start: float, stop: float) -> list[float]:
    """The slots of *job* in [start, stop): multiples of its interval since the epoch."""
    first = math.ceil(start / job.interval)
    last = math.ceil(stop / job.interval)
    return [round(k * job.interval, 6) for k in range(first, last)]


def read_ledger(path: Path) -> list[Claim]:
    """The ledger as run.py saved it (a JSON list of ``cronlock_runs`` rows)."""
    with open(path, encoding="utf-8") as f:
        return [Claim(**row) for row in json.load(f)]


def check(
    records: Iterable[dict[str, Any]],
    faults: Sequence[Fault],
    jobs: Sequence[Job],
    judged_from: float,
    judged_to: float,
    ledger: Iterable[Claim] | None = None,
) -> Verdict:
    """Judge the slots of *jobs* in [judged_from, judged_to) (see the module's rules).
    Without a *ledger* no slot is explained as claimed by a killed replica, and claims are
    not checked."""
    records = list(records)
    verdict = Verdict(judged_from, judged_to, ledger=ledger is not None)
    verdict.faults.update(f.kind for f in faults)
    runs = runs_of(records, faults)
    said = _Said(records, faults, ledger)
    by_job: dict[str, list[Run]] = collections.defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    partitions = [f for f in faults if f.kind == "partition"]
    for job in jobs:
        mine = sorted(by_job.get(job.name, ()), key=lambda run: run.start)
        _overlaps(job, mine, partitions, verdict)
        _slots(job, mine, faults, said, verdict)
    judged = [r for r in runs if judged_from <= r.slot < judged_to]
    verdict.runs = len(judged)
    verdict.cancelled = sum(r.outcome == "cancel" for r in judged)
    verdict.killed = sum(r.outcome == "killed" for r in judged)
    return verdict


class _Said:
    """What is known of each slot besides its runs: the replicas' ``skip``, ``lockfailed``
    and ``lost`` lines, in order, and the ledger's claim."""

    def __init__(
        self,
        records: Iterable[dict[str, Any]],
        faults: Sequence[Fault],
        ledger: Iterable[Claim] | None,
    ) -> None:
        self.killed = {pid for f in faults for pid in f.pids}
        self.lines: dict[tuple[str, float], list[dict[str, Any]]] = collections.defaultdict(list)
        self.hung: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        """job -> (slot, when its claim failed for want of the server) of each such failure."""
        self.fired: dict[tuple[int, str], list[float]] = collections.defaultdict(list)
        """(pid, job) -> the slots that process fired (started, skipped or failed to claim)."""
        for r in sorted(records, key=lambda r: r["t"]):
            if r["e"] in ("start", "skip", "lockfailed"):
                self.fired[(r["pid"], r["job"])].append(round(r["slot"], 6))
            if r["e"] == "lockfailed" and r.get("why") in UNREACHABLE:
                self.hung[r["job"]].append((round(r["slot"], 6), r["t"]))
            if r["e"] in ("skip", "lockfailed", "lost"):
                slot = round(r["slot"], 6)
                self.lines[(r["job"], slot)].append(r)
        self.claims = None if ledger is None else {(c.job, round(c.slot, 6)): c for c in ledger}

    def claim(self, job: str, slot: float) -> Claim | None:
        return None if self.claims is None else self.claims.get((job, slot))

    def skipped(self, job: str, slot: float, reason: str) -> bool:
        return any(
            r["e"] == "skip" and r.get("reason") == reason for r in self.lines.get((job, slot), ())
        )

    def coalesced(self, job: str, slot: float) -> bool:
        """Whether a replica owed *slot* and dropped it for a later slot of *job*: its last
        word on the slot is a claim that never reached the server, and it fired a later
        slot of the job (owed too, started, or skipped): the latest slot supersedes the
        older, whether it failed or got through (cronlock's ``_core/outage.py``)."""
        last: dict[int, dict[str, Any]] = {}
        for r in self.lines.get((job, slot), ()):
            if not (r["e"] == "skip" and r.get("reason") == "standby"):
                last[r["pid"]] = r
        if not last:
            # No racing replica said a word of it (a standby's skip says only that it left
            # the slot to the racers): it fell due while a claim of an earlier slot of the
            # job hung on the server (the failure came after it), which owes it without an
            # event; a later slot was fired since.
            hung = any(earlier < slot < t for earlier, t in self.hung.get(job, ()))
            return hung and any(
                later > slot
                for (_, name), fired in self.fired.items()
                if name == job
                for later in fired
            )
        return any(
            r["e"] == "lockfailed"
            and r.get("why") in UNREACHABLE
            and any(later > slot for later in self.fired[(pid, job)])
            for pid, r in last.items()
        )

    def coalesced_after_loss(self, job: str, slot: float, pid: int) -> bool:
        """Whether *pid* claimed *slot*, lost the lock before the run began (a ``lost``
        line), and fired a later slot of *job* since: the slot was owed again (cronlock
        claims a run that never began again) and coalesced into that later one."""
        lines = self.lines.get((job, slot), ())
        lost = [r["t"] for r in lines if r["pid"] == pid and r["e"] == "lost"]
        return bool(lost) and any(later > slot for later in self.fired[(pid, job)])

    def unanswered(self, job: str, slot: float, pid: int) -> bool:
        """Whether *pid*'s last word on *slot* is a claim that failed for want of the server
        (it may have been recorded, its answer lost: a partition, a statement timed out)
        and *pid* fired a later slot of *job* since: the slot was owed and coalesced."""
        mine = [r for r in self.lines.get((job, slot), ()) if r["pid"] == pid]
        return (
            bool(mine)
            and mine[-1]["e"] == "lockfailed"
            and mine[-1].get("why") in UNREACHABLE
            and any(later > slot for later in self.fired[(pid, job)])
        )

    def behind_late_run(self, job: str, slot: float, runs: Sequence[Run]) -> bool:
        """Whether every replica that spoke of *slot* skipped it by the overlap rule, and a
        run of an earlier slot of *job* began after it: that run's claim was in flight
        across the outage when the slot came (a claim in flight counts as the job running),
        and the outage's slots ran once, late, as coalescing would have run them."""
        lines = self.lines.get((job, slot), ())
        return (
            bool(lines)
            and all(r["e"] == "skip" and r.get("reason") == "overlap" for r in lines)
            and any(run.slot < slot < run.start for run in runs)
        )

    def summary(self, job: str, slot: float) -> str:
        """The replicas' words on the slot and its claim, in short, for a failure's text."""
        words: list[str] = []
        for r in self.lines.get((job, slot), ()):
            word = f"r{r['rep']} {r['e']} {r.get('reason') or r.get('why') or ''}".rstrip()
            if word not in words:
                words.append(word)
        claim = self.claim(job, slot)
        if claim is not None:
            words.append(
                f"ledger: pid {claim.pid}{' (killed)' if claim.pid in self.killed else ''} "
                f"{claim.outcome or 'unfinished'}, attempt {claim.attempt}"
            )
        elif self.claims is not None:
            words.append("ledger: no claim")
        return "; ".join(words) or "nothing said"


def _end(job: Job, run: Run) -> float:
    return run.end if run.end is not None else run.start + job.duration


def _overlaps(job: Job, runs: Sequence[Run], partitions: Sequence[Fault], v: Verdict) -> None:
    for i, a in enumerate(runs):
        a_end = _end(job, a)
        for b in runs[i + 1 :]:
            if b.start >= a_end:
                break
            if b.pid == a.pid or not (v.judged_from <= b.slot < v.judged_to):
                continue
            what = (
                f"{job.name}: slot {a.slot:.0f} on r{a.replica} ({a.start:.3f}-{a_end:.3f}) "
                f"and slot {b.slot:.0f} on r{b.replica} from {b.start:.3f}"
            )
            inside = any(p.covers(b.start) or p.covers(a_end) for p in partitions)
            (v.overlaps_inside if inside else v.overlaps_outside).append(what)


def _busy(job: Job, runs: Sequence[Run], starts: list[float], longest: float, t: float) -> bool:
    """Whether a run of *job* was in progress around instant *t* (its claim found it busy)."""
    i = bisect.bisect_right(starts, t + BUSY_LATE) - 1
    while i >= 0 and starts[i] >= t - BUSY_EARLY - longest:
        if _end(job, runs[i]) >= t - BUSY_EARLY:
            return True
        i -= 1
    return False


def _slots(job: Job, runs: Sequence[Run], faults: Sequence[Fault], said: _Said, v: Verdict) -> None:
    for_slot: dict[float, list[Run]] = collections.defaultdict(list)
    for run in runs:
        for_slot[round(run.slot, 6)].append(run)
    starts = [run.start for run in runs]  # *runs* are in order of start
    longest = max((_end(job, run) - run.start for run in runs), default=0.0)
    for slot in slots_between(job, v.judged_from, v.judged_to):
        v.slots += 1
        mine = for_slot.get(slot, [])
        covering = [f for f in faults if f.covers(slot)]
        # The grace outlasted the faults' outage (no fault: nothing to outlast), and the
        # outage was over before the soak stopped the replicas (else they had no chance).
        over = max((f.over for f in covering), default=-math.inf)
        outlasted = over >= v.judged_to
        owed = slot + job.grace >= over and not outlasted
        _claim(job, slot, mine, owed, said, v)
        if mine:
            v.ran += 1
            finished = [r for r in mine if r.outcome == "end"]
            if len(finished) > 1:
                what = f"{job.name}@{slot:.0f} finished on " + ", ".join(
                    f"r{r.replica}/pid {r.pid} at {r.end:.3f}" for r in finished
                )
                first = min(_end(job, r) for r in finished)
                if job.recover and any(f.covers(first) for f in faults):
                    v.recovered_twice.append(what)
                else:
                    v.duplicates.append(what)
            if len(mine) > 1:
                v.double_starts += 1
            if job.recover and not finished:
                v.unrecovered.append(f"{job.name}@{slot:.0f}")
            continue
        if _busy(job, runs, starts, longest, slot):
            v.busy += 1
            continue
        if not covering:
            v.misses_outside.append(f"{job.name}@{slot:.3f}")
            continue
        kind = max(covering, key=lambda f: f.start).kind  # the latest to begin before it
        v.misses_inside[kind] += 1
        why = "outage outlasted the soak" if outlasted else _explained(job, slot, owed, runs, said)
        if why is not None:
            v.explained[kind][why] += 1
            v.explained_slots.append(
                f"{job.name}@{slot:.0f} ({kind}: {why}; {said.summary(job.name, slot)})"
            )
            continue
        v.unexplained_inside[kind] += 1
        over = max(f.over for f in covering)
        v.unexplained.append(
            f"{job.name}@{slot:.0f} ({kind}, its outage over {over - slot:.1f} s after the "
            f"slot; {said.summary(job.name, slot)})"
        )


def _explained(job: Job, slot: float, owed: bool, runs: Sequence[Run], said: _Said) -> str | None:
    """Why a slot missed inside a fault window did not run (the module's explanations), or
    ``None``: it should have."""
    if not owed:
        return "grace ran out"
    if said.skipped(job.name, slot, "misfire"):
        return None  # reported missed although the outage ended within its grace
    claim = said.claim(job.name, slot)
    if claim is not None and claim.pid in said.killed:
        return "claimed by a killed replica"  # and it wrote no start line: no run did
    if said.skipped(job.name, slot, "locked"):
        return "held"
    if said.coalesced(job.name, slot) or (
        claim is not None
        and claim.outcome == "lock_lost"
        and said.coalesced_after_loss(job.name, slot, claim.pid)
    ):
        return "coalesced"
    if said.behind_late_run(job.name, slot, runs):
        return "behind a late run"
    return None


def _claim(job: Job, slot: float, runs: Sequence[Run], owed: bool, said: _Said, v: Verdict) -> None:
    """Check the ledger's claim of *slot* against its runs *runs*."""
    if said.claims is None:
        return
    claim = said.claim(job.name, slot)
    if claim is None:
        if runs:
            v.unledgered.append(f"{job.name}@{slot:.0f}")
        return
    if claim.pid in said.killed or any(r.pid == claim.pid for r in runs) or not owed:
        return
    if (
        not runs
        and claim.outcome == "lock_lost"
        and said.coalesced_after_loss(job.name, slot, claim.pid)
    ):
        v.lost_then_coalesced += 1
        return
    if not runs and claim.outcome is None and said.unanswered(job.name, slot, claim.pid):
        v.unanswered_then_coalesced += 1
        return
    ran = ", ".join(f"r{r.replica}/pid {r.pid}" for r in runs) or "nobody"
    v.lost_claims.append(
        f"{job.name}@{slot:.0f} claimed by pid {claim.pid} ({claim.outcome or 'unfinished'}), "
        f"run by {ran}; {said.summary(job.name, slot)}"
    )
