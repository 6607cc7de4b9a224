"""The named scenarios: this round's findings (``../shared/findings/round-6-slots-that-vanish.md``)
staged in the simulation, each from a fixed seed, and the faults that show them.

``KNOWN`` says which scenarios break the promise on today's code, and how (the oracle's
rules): the tests mark them as known failures, strictly, so a scenario that starts passing
fails its marker until the mark is taken off.
"""

from __future__ import annotations

from dataclasses import replace

from .faults import Fault
from .fleet import JobSpec
from .run import Mode, Plan

__all__ = ("KNOWN", "SCENARIOS", "scenario")

_TICKS = tuple(JobSpec(f"probe-{i}", "every:1", 0.2) for i in range(5))
_CRASHY = (
    JobSpec("slow-a", "every:20", 8.0, {"recover": True, "misfire_grace": 180}),
    JobSpec("slow-b", "every:20", 8.0, {"recover": True, "misfire_grace": 180}),
)
_LONG = tuple(JobSpec(f"long-{i}", "every:5", 3.0) for i in range(3))
_ALERTED = (JobSpec("tick", "every:5", 0.2, {"alert_after": 10}),)

SCENARIOS: dict[str, tuple[tuple[Mode, ...], Plan]] = {
    # E1: another session holds the ledger table for 10 s; in lease mode two replicas then
    # ran one job at once.
    "table-lock": (
        ("session", "lease"),
        Plan("session", 11, (Fault("table_lock", 8.5, seconds=10.0),), jobs=_TICKS, seconds=40),
    ),
    # E2: the whole server stalled 10 s: most slots due meanwhile vanished without a word.
    "stall": (
        ("session", "lease"),
        Plan("session", 12, (Fault("stall", 8.5, seconds=10.0),), jobs=_TICKS, seconds=40),
    ),
    # E3: recover=True, the replica running a body killed 2 s in: in lease mode nothing
    # reran, though a WARNING and JobCrashed(recovered=True) said it would.
    "recover-kill": (
        ("session", "lease"),
        Plan("session", 13, (Fault("kill", 22.0, job="slow-a"),), jobs=_CRASHY, seconds=80),
    ),
    # E5: a claim commits and its answer is lost: the slot never runs, its row stays
    # unfinished.
    "answer-lost": (
        ("session", "lease"),
        Plan("session", 14, (Fault("reply_lost", 9.7, replica=0),), jobs=_TICKS, seconds=40),
    ),
    # E6: a replica killed while its bodies run: in lease mode its jobs lost ~20 slots, seen
    # only as ordinary 'locked' skips.
    "holder-killed": (
        ("session", "lease"),
        Plan("session", 15, (Fault("kill", 11.0, job="long-0"),), jobs=_LONG, seconds=60),
    ),
    # E6/E7: a replica frozen 30 s while its bodies run.
    "holder-frozen": (
        ("session", "lease"),
        Plan(
            "session",
            16,
            (Fault("freeze", 11.0, seconds=30.0, job="long-0"),),
            jobs=_LONG,
            seconds=70,
        ),
    ),
    # E8/E12: a failover just before a slot, the standby missing the last commits.
    "failover-before-slot": (
        ("session", "lease"),
        Plan(
            "session",
            17,
            (Fault("failover", 9.985, seconds=1.0, commits=5),),
            jobs=_TICKS,
            seconds=40,
        ),
    ),
    # E13: a snapshot restored under the same identity.
    "snapshot-restore": (
        ("session", "lease"),
        Plan(
            "session",
            18,
            (Fault("restore", 20.0, seconds=0.5, back=10.0),),
            jobs=_TICKS,
            seconds=45,
        ),
    ),
    # Found by the random schedules (seed 1015): while a lease renewal hung on a stalled
    # server, the lease keeper woke for the renewal already due, again and again, without
    # waiting (a busy loop until the statement timed out); fixed with this simulator.
    "stalls": (
        ("lease",),
        Plan(
            "lease",
            1015,
            (
                Fault("stall", 34.334, seconds=9.249),
                Fault("stall", 55.202, seconds=13.536),
                Fault("stall", 66.56, seconds=11.423),
                Fault("stall", 89.466, seconds=13.375),
            ),
        ),
    ),
    # E4: one replica, one job every 5 s with alert_after=10, the fleet stopped 12.0 s in;
    # status --check read 15, 30 and 60 s after the stop must say the job is overdue.
    "fleet-gone": (
        ("session", "lease"),
        Plan(
            "session",
            19,
            (Fault("stop", 12.0),),
            replicas=1,
            seconds=12.0,
            quiet=0.0,
            jobs=_ALERTED,
            readings=(27.0, 42.0, 72.0),
        ),
    ),
}
"""Each scenario: the modes it runs in, and its plan (its mode is set per run)."""

KNOWN: dict[tuple[str, Mode], frozenset[str]] = {
    # E2: slots due while the ledger is locked or the server stalled vanish without a word;
    # E1: in lease mode, two replicas then run one job at once.
    ("table-lock", "session"): frozenset({"silent"}),
    ("table-lock", "lease"): frozenset({"overlap", "silent"}),
    ("stall", "session"): frozenset({"silent"}),
    ("stall", "lease"): frozenset({"overlap", "silent"}),
    # E3/E9: JobCrashed(recovered=True) and a WARNING say a rerun; the rerun is skipped.
    ("recover-kill", "session"): frozenset({"lie"}),
    ("recover-kill", "lease"): frozenset({"lie"}),
    # E5: the claim committed, its answer lost: never runs, its row stays unfinished.
    ("answer-lost", "session"): frozenset({"silent", "unfinished"}),
    ("answer-lost", "lease"): frozenset({"silent", "unfinished"}),
    # E6: a killed lease holder's jobs lose their next slots as ordinary 'locked' skips.
    ("holder-killed", "lease"): frozenset({"silent"}),
    # E10: runs frozen past their lease finish after others ran the job's later slots.
    ("holder-frozen", "lease"): frozenset({"overlap"}),
    # E8/E12: a failover just before a slot loses that slot of the jobs claimed ahead.
    ("failover-before-slot", "session"): frozenset({"silent"}),
    ("failover-before-slot", "lease"): frozenset({"silent"}),
    # E13: a snapshot restored under the same identity goes unnoticed.
    ("snapshot-restore", "session"): frozenset({"silent", "unfinished"}),
    ("snapshot-restore", "lease"): frozenset({"unfinished"}),
    # E2/E1 again, over four long stalls; and a recover=True rerun that tells its body it is
    # attempt 1 (the ledger says 2: the body sees attempt 1 start twice, and no rerun).
    ("stalls", "lease"): frozenset({"lie", "overlap", "silent", "twice"}),
}
"""(scenario, mode) -> the oracle's rules it breaks on today's code (main at 60f70fc and
this simulator): known failures until the next issue fixes them. A scenario not listed
must pass."""


def scenario(name: str, mode: Mode) -> Plan:
    """The plan of scenario *name* in *mode*."""
    modes, plan = SCENARIOS[name]
    if mode not in modes:
        raise ValueError(f"scenario {name!r} runs in {', '.join(modes)}, not {mode}")
    return replace(plan, mode=mode, name=name)
