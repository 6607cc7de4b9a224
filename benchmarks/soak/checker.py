"""The soak's checker: the simulator's oracle (``cronlock._sim.oracle.judge``) on what the
replicas of a real-time soak did and said.

One oracle judges the simulation and the soak: this module only reads the soak's evidence
and hands it over. It builds the oracle's inputs from

- the replicas' effects files (replica.py): a ``start`` line as a run's first act, ``end``
  as its last (``cancel`` when it was cancelled: an end too), each with its job, slot and
  attempt; an ``event`` line per event a scheduler emitted (its class name and fields); a
  ``log`` line per WARNING (or worse) of the ``cronlock`` logger; an ``error`` line per
  exception that escaped a task of a replica's loop;
- the nemesis's faults (run.py): their spans are the oracle's *disruptions*, the processes
  a ``kill`` killed are *gone* (a body started there and never ended ended then);
- the ledger (``cronlock_runs``) as the soak left it.

The verdict: every violation whose rule is in :func:`cronlock._sim.scenarios.known_rules`
for the soak's mode and the simulator's names of its faults' kinds (:data:`SIM_KINDS`) is a
known defect of today's code ("known (finding)": counted and printed apart, it does not
fail the run); any other fails it. The known-defects table lives in
``cronlock/_sim/scenarios.py`` (``KNOWN_BY_KIND``), not here: the checker excuses nothing
of its own.

Besides the slots, the checker keeps what only the soak can see: a ledger row that says
its run ran (``succeeded``, ``failed``, ``timed_out``) though no body ever started that
slot (``ledger-ran``, not a rule of the oracle, always a failure). run.py adds its own
problems (a replica that did not stop cleanly on SIGTERM, anything of cronlock's left on
the server).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import types
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cronlock._sim.oracle import RULES, JobView, Judged, Violation, judge
from cronlock._sim.run import Mode
from cronlock._sim.scenarios import known_rules

GRACE = 30.0
"""The soak's ``misfire_grace`` (replica.py's ``MISFIRE_GRACE``; run.py passes it)."""

SIM_KINDS: dict[str, tuple[str, ...]] = {
    "kill": ("kill",),
    "pause": ("freeze",),  # SIGSTOP, then SIGCONT: the process frozen, its sessions kept
    # A partition stops every byte (statements in flight hang, a claim may commit with its
    # answer held back), then, after ~6 s or at the heal, its connections are reset: the
    # simulator's "hang" followed by its "reset". Neither alone is the closest: both.
    "partition": ("hang", "reset"),
    "reset": ("reset",),
    "restart": ("crash",),  # pg_ctl restart -m immediate
    "clock": ("clock_step",),
    "failover": ("failover",),  # the primary crashes, the standby (async) is promoted
    "switchover": ("failover",),  # the same, the primary stopped cleanly first
}
"""The soak's fault kinds -> the simulator's (``cronlock._sim.faults.KINDS``), whose
known defects (``KNOWN_BY_KIND``) apply to them."""

RAN = frozenset({"succeeded", "failed", "timed_out"})
"""Outcomes of a ledger row that say its body ran."""
SOAK_RULES = ("ledger-ran",)
"""The checker's own checks (not slot judgements of the oracle)."""


@dataclasses.dataclass(frozen=True)
class Job:
    """A job of the soak: every *interval* s (slots at multiples of it since the epoch), its
    body's duration, whether it opted in to recovery, and its misfire grace."""

    name: str
    interval: float
    duration: float
    recover: bool = False
    grace: float = GRACE

    def view(self) -> JobView:
        """The job as the oracle knows it."""
        return JobView(
            self.name, f"every:{self.interval:g}", grace=self.grace, recover=self.recover
        )


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault the nemesis injected: *kind* on *replica* (``None``: the server) from
    *start* to *end* (true wall time). *pids* are the processes it killed. *window_end* and
    *outage_end* are the nemesis's pacing (when to inject the next one), not judged."""

    kind: str
    replica: int | None
    start: float
    end: float
    window_end: float
    pids: tuple[int, ...] = ()
    detail: str = ""
    outage_end: float | None = None


@dataclasses.dataclass(frozen=True)
class Effect:
    """What a body wrote (the oracle's effect): ``start`` or ``end``, seconds into the run."""

    kind: str
    job: str
    slot: datetime
    attempt: int
    replica: str
    at: float


@dataclasses.dataclass(frozen=True)
class Said:
    """An event a replica emitted (an object of the event's class name) or a record it
    logged (a ``logging.LogRecord``), seconds into the run."""

    replica: str
    at: float
    what: Any


_EVENT_CLASSES: dict[str, type[types.SimpleNamespace]] = {}


def event(name: str, **fields: Any) -> types.SimpleNamespace:
    """An object whose class is called *name* (the event's), with *fields*: what a listener
    sees of the event, as far as the oracle reads it."""
    cls = _EVENT_CLASSES.get(name)
    if cls is None:
        cls = _EVENT_CLASSES[name] = type(name, (types.SimpleNamespace,), {})
    return cls(**fields)


def replica_name(line: dict[str, Any]) -> str:
    """One process of the soak (a killed replica comes back as another process)."""
    return f"r{line['rep']}/{line['pid']}"


def slot_of(value: str | float) -> datetime:
    """A slot as the files hold it (ISO 8601; seconds since the epoch in older evidence)."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    slot = datetime.fromisoformat(value)
    return slot if slot.tzinfo is not None else slot.replace(tzinfo=UTC)


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


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The ledger as run.py saved it (a JSON list of ``cronlock_runs`` rows)."""
    with open(path, encoding="utf-8") as f:
        rows: list[dict[str, Any]] = json.load(f)
    return rows


@dataclasses.dataclass
class Evidence:
    """The oracle's inputs, made of a soak's files (times in seconds since *origin*)."""

    effects: list[Effect]
    said: list[Said]
    errors: list[str]
    gone: dict[str, float]
    disruptions: list[tuple[float, float]]
    ledger: list[dict[str, Any]]


def evidence(
    records: Iterable[dict[str, Any]],
    faults: Sequence[Fault],
    ledger: Iterable[dict[str, Any]],
    origin: float,
) -> Evidence:
    """Read *records* (the effects files' lines), *faults* and *ledger* as the oracle's
    inputs."""
    killed = {pid: f.start for f in faults for pid in f.pids}
    out = Evidence([], [], [], {}, [], [])
    for line in sorted(records, key=lambda r: r["t"]):
        kind, at, who = line["e"], line["t"] - origin, replica_name(line)
        if kind in ("start", "end", "cancel"):
            out.effects.append(
                Effect(
                    "start" if kind == "start" else "end",
                    line["job"],
                    slot_of(line["slot"]),
                    int(line.get("attempt", 1)),
                    who,
                    at,
                )
            )
        elif kind == "event":
            fields = {k: v for k, v in line.items() if k in ("job", "reason", "recovered", "fate")}
            for instant in ("slot", "last", "into"):  # (a SlotsDecided's range and target)
                if instant in line:
                    fields[instant] = None if line[instant] is None else slot_of(line[instant])
            if "attempt" in line:
                fields["attempt"] = int(line["attempt"])
            out.said.append(Said(who, at, event(line["name"], **fields)))
        elif kind == "log":
            record = logging.makeLogRecord(
                {
                    "name": line.get("logger", "cronlock"),
                    "levelno": line["level"],
                    "levelname": logging.getLevelName(line["level"]),
                    "msg": line["msg"],
                    "args": None,
                    "created": line.get("at", line["t"]),
                }
            )
            out.said.append(Said(who, at, record))
        elif kind == "error":
            out.errors.append(f"{at:.3f}s {who}: {line['msg']}")
    pids = {(line["rep"], line["pid"]) for line in records}
    out.gone = {f"r{rep}/{pid}": killed[pid] - origin for rep, pid in pids if pid in killed}
    out.disruptions = [(f.start - origin, f.end - origin) for f in faults if f.kind != "clock"]
    for row in ledger:
        out.ledger.append({**row, "slot": slot_of(row["slot"])})
    return out


@dataclasses.dataclass
class Verdict:
    """What the checker found: the oracle's verdict, its violations split into the known
    defects of today's code and the rest, and the checker's own findings."""

    mode: str
    judged_from: float
    judged_to: float
    kinds: list[str]
    """The simulator's names of the faults' kinds (:data:`SIM_KINDS`)."""
    allowed: list[str]
    """``known_rules(mode, kinds)``: the rules known broken under those kinds today."""
    judged: Judged
    known: list[Violation] = dataclasses.field(default_factory=list)
    new: list[Violation] = dataclasses.field(default_factory=list)
    soak: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """The checker's own findings, by check (:data:`SOAK_RULES`)."""
    faults: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    runs: int = 0
    cancelled: int = 0
    killed: int = 0
    unledgered: int = 0
    """Slots that ran with no row in the ledger (after a failover: rows the standby never
    received); reported, not judged."""

    @property
    def failures(self) -> list[str]:
        """What fails the run: a violation outside the known rules, a finding of the
        checker's own (empty: passed)."""
        found = [v.text() for v in self.new]
        for check, texts in self.soak.items():
            found += [f"{check}: {text}" for text in texts]
        return found

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per rule (the oracle's and the checker's): (violations outside the known rules,
        known ones)."""
        new = collections.Counter(v.rule for v in self.new)
        known = collections.Counter(v.rule for v in self.known)
        counts = {rule: (new[rule], known[rule]) for rule in RULES}
        counts.update({rule: (len(self.soak.get(rule, ())), 0) for rule in SOAK_RULES})
        return counts

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "judged_from": self.judged_from,
            "judged_to": self.judged_to,
            "kinds": self.kinds,
            "allowed": self.allowed,
            "slots": self.judged.slots,
            "ran": self.judged.ran,
            "explained": self.judged.explained,
            "counts": {rule: {"new": n, "known": k} for rule, (n, k) in self.counts().items()},
            "known": [v.text() for v in self.known],
            "new": [v.text() for v in self.new],
            "soak": self.soak,
            "faults": dict(self.faults),
            "runs": self.runs,
            "cancelled": self.cancelled,
            "killed": self.killed,
            "unledgered": self.unledgered,
            "failures": self.failures,
        }


def check(
    records: Iterable[dict[str, Any]],
    faults: Sequence[Fault],
    jobs: Sequence[Job],
    *,
    mode: Mode,
    judged_from: float,
    judged_to: float,
    settled: float,
    ledger: Iterable[dict[str, Any]] = (),
) -> Verdict:
    """Judge the slots of *jobs* due in [judged_from, judged_to) with the oracle, the run
    over at *settled* (every replica stopped); times in seconds since the epoch."""
    records = list(records)
    seen = evidence(records, faults, ledger, judged_from)
    kinds = sorted({sim for f in faults for sim in SIM_KINDS.get(f.kind, (f.kind,))})
    allowed = known_rules(mode, set(kinds))
    judged = judge(
        jobs=[job.view() for job in jobs],
        epoch=datetime.fromtimestamp(judged_from, UTC),
        window=(0.0, judged_to - judged_from),
        settled=settled - judged_from,
        effects=seen.effects,
        said=seen.said,
        ledger=seen.ledger,
        disruptions=seen.disruptions,
        gone=seen.gone,
        errors=seen.errors,
    )
    verdict = Verdict(mode, judged_from, judged_to, kinds, sorted(allowed), judged)
    for violation in judged.violations:
        (verdict.known if violation.rule in allowed else verdict.new).append(violation)
    verdict.faults.update(f.kind for f in faults)
    _own(verdict, seen, jobs)
    verdict.cancelled = sum(
        line["e"] == "cancel" and judged_from <= slot_of(line["slot"]).timestamp() < judged_to
        for line in records
    )
    return verdict


def _own(verdict: Verdict, seen: Evidence, jobs: Sequence[Job]) -> None:
    """The checker's own findings and the run's figures."""
    names = {job.name for job in jobs}
    started = {(e.job, e.slot) for e in seen.effects if e.kind == "start"}
    rows = {(row["job"], row["slot"]): row for row in seen.ledger}
    window = (
        datetime.fromtimestamp(verdict.judged_from, UTC),
        datetime.fromtimestamp(verdict.judged_to, UTC),
    )
    lied = [
        f"job {job!r} slot {slot:%H:%M:%S}: the ledger says {row.get('outcome')} "
        f"(claimed by {row.get('host')}:{row.get('pid')}, attempt {row.get('attempt')}); "
        f"no body started it"
        for (job, slot), row in sorted(rows.items())
        if job in names and row.get("outcome") in RAN and (job, slot) not in started
    ]
    if lied:
        verdict.soak["ledger-ran"] = lied
    runs = [e for e in seen.effects if e.kind == "start" and window[0] <= e.slot < window[1]]
    ends = {(e.job, e.slot, e.attempt, e.replica) for e in seen.effects if e.kind == "end"}
    verdict.runs = len(runs)
    verdict.killed = sum(
        (e.job, e.slot, e.attempt, e.replica) not in ends and e.replica in seen.gone for e in runs
    )
    verdict.unledgered = len({(e.job, e.slot) for e in runs} - set(rows))
