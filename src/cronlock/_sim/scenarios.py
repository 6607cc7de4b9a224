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

__all__ = ("KNOWN", "KNOWN_BY_KIND", "SCENARIOS", "known_rules", "scenario")

_TICKS = tuple(JobSpec(f"probe-{i}", "every:1", 0.2) for i in range(5))
_CRASHY = (
    JobSpec("slow-a", "every:20", 8.0, {"recover": True, "misfire_grace": 180}),
    JobSpec("slow-b", "every:20", 8.0, {"recover": True, "misfire_grace": 180}),
)
_LONG = tuple(JobSpec(f"long-{i}", "every:5", 3.0) for i in range(3))
_ALERTED = (JobSpec("tick", "every:5", 0.2, {"alert_after": 10}),)


def _frozen(seed: int, seconds: float) -> Plan:
    """The replica running ``long-0`` frozen 11 s in, for *seconds*, in a 70 s run."""
    freeze = Fault("freeze", 11.0, seconds=seconds, job="long-0")
    return Plan("session", seed, (freeze,), jobs=_LONG, seconds=70)


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
    # E3/E9: recover=True, the replica running a body killed 2 s in: nothing reran, though
    # a WARNING and JobCrashed(recovered=True) said it would (the replica that found the
    # crash was running the job itself, and the overlap policy skipped the rerun); and a
    # rerun's body was told attempt 1. Fixed: the rerun waits for that run to end.
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
    "holder-frozen": (("session", "lease"), _frozen(16, 30.0)),
    # E7: a session-mode holder frozen (SIGSTOP) and not woken within the run: its kernel
    # keeps the connections, the server its locks; the live replicas skip the jobs it held
    # as 'locked' and say nothing. (Woken after 30 s, as in the finding, it says itself
    # that the slots it slept through were coalesced into one run, and that run happens:
    # the oracle cannot tell who spoke; frozen for good, nobody does.)
    "holder-frozen-long": (("session", "lease"), _frozen(17, 600.0)),
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
    # Found by the simulation (E4's kin): the fleet killed (SIGKILL) instead of stopped.
    # The job's note in the ledger names as its next slot the one that just ran (a note is
    # written up to 35 s after a slot), so status --check says ok until the job turns
    # absent, 90 s on, whatever alert_after says (every kill instant 11-14.9 s, both modes;
    # fixed: the note names the job's spec, and the verdict reckons the slots due from it).
    "fleet-killed": (
        ("session", "lease"),
        Plan(
            "session",
            20,
            (Fault("kill", 12.0, replica=0),),
            replicas=1,
            seconds=12.0,
            quiet=0.0,
            jobs=_ALERTED,
            readings=(27.0, 42.0, 72.0),
        ),
    ),
    # E4 as it was seen: the same, the locker given an asyncpg pool (min 1, max 4). At
    # close, a lease-mode locker on a pool marked its channel closed before it flushed the
    # job's next slot, and a borrowing channel refused statements once closed: the note
    # was never written, the stored next slot stayed the last one that ran, and status
    # --check said ok for good (every stop instant 10.0-14.9 s in the sim). Fixed: the
    # close's own statements still go.
    "fleet-gone-pool": (
        ("lease",),
        Plan(
            "lease",
            19,
            (Fault("stop", 12.0),),
            replicas=1,
            seconds=12.0,
            quiet=0.0,
            jobs=_ALERTED,
            readings=(27.0, 42.0, 72.0),
            pool=True,
        ),
    ),
    # Found by the simulation (seed 100163, lease mode): a replica frozen past its lease's
    # fence just after it claimed a slot ahead woke and began that run, on a lease another
    # replica held by then, before the keeper's timer marked it lost (two at once).
    "frozen-past-its-fence": (
        ("lease",),
        Plan(
            "lease",
            100163,
            (
                Fault("freeze", 28.836, seconds=26.317, replica=1),
                Fault("freeze", 49.473, seconds=19.151, replica=0),
                Fault("freeze", 67.966, seconds=30.108, replica=2),
                Fault("freeze", 74.85, seconds=18.885, replica=0),
                Fault("freeze", 86.87, seconds=2.017, replica=0),
            ),
        ),
    ),
}
"""Each scenario: the modes it runs in, and its plan (its mode is set per run)."""

KNOWN: dict[tuple[str, Mode], frozenset[str]] = {
    # E2 (slots due in a table lock or a server stall vanish without a word) and E5 (a claim
    # committed, its answer lost, never runs and stays unfinished) are fixed: every slot
    # owed is told (SlotsDecided: coalesced into the latest, or missed), a claim sent and
    # unanswered is given back once a session is open again, and a lock session cut off is
    # ended at the reconnect so that its locks hold nothing off. E8/E12 (a failover just
    # before a slot) pass with them. (E1, two replicas running one job at once in lease
    # mode, is fixed: a reconnect releases only the leases of runs that ended here.) E13 (a
    # snapshot restored under the same identity left the claims it lost the outcomes of
    # unfinished) is fixed: a restart is noticed (the postmaster's start) and the replicas
    # write their recent runs back, as after a failover.
    # (E6 in lease mode, a killed holder's jobs losing their next slots as ordinary
    # 'locked' skips, is fixed: the claim that takes the lapsed lease over tells the slots
    # since the holder's last renewal coalesced into its own, with a WARNING.)
    # (E10 and E7, a holder frozen shorter or longer than its lease or membership, pass:
    # a stopped process runs nothing, so the oracle leaves a body's freezes out of its
    # span, and what it does once it wakes counts; in session mode the claim that takes a
    # job over from a holder whose lock session ended mid-run tells the slots it held
    # coalesced into its own, as lease mode's takeover of a lapsed lease does.)
    # (Four long stalls, lease mode, pass: a slot owed across an outage that finds the
    # job running here, a claim stuck in the stall answered late, waits for that run and
    # runs late, rather than being skipped by the overlap policy; and an owed slot no
    # longer coalesces into a later one the overlap policy skipped.)
    # (A killed fleet's job read ok until it was absent, the note naming the slot that ran:
    # fixed, the verdict rebuilds the slot after the latest success from the job's spec.)
}
"""(scenario, mode) -> the oracle's rules it breaks on today's code (main at 60f70fc and
this simulator, updated as issue 48 fixes them): known failures until they are fixed. A
scenario not listed must pass."""


def scenario(name: str, mode: Mode) -> Plan:
    """The plan of scenario *name* in *mode*."""
    modes, plan = SCENARIOS[name]
    if mode not in modes:
        raise ValueError(f"scenario {name!r} runs in {', '.join(modes)}, not {mode}")
    return replace(plan, mode=mode, name=name)


_SILENT_LOST = frozenset({"silent", "unfinished", "late"})
"""E2/E5/E15 and E11: slots due in an outage vanish or stay claimed and unfinished; or a
replica cut off says they were "coalesced into one run" and that run is refused or skipped
(late: coalesced into nothing, given up within its grace; seen in the soak at cfcde12,
seed 1704640636, a partition before a failover)."""
_RELABEL = frozenset({"attempt", "lie"})
KNOWN_BY_KIND: dict[tuple[Mode, str], frozenset[str]] = {
    # E5: a claim whose answer is lost (or hangs past the statement timeout) never runs
    # and its row stays unfinished.
    # A run those cut short is marked crashed, and its rerun told attempt 1 (C3's cause).
    **{(mode, "reply_lost"): _SILENT_LOST | _RELABEL for mode in ("session", "lease")},
    **{(mode, "hang"): _SILENT_LOST | _RELABEL for mode in ("session", "lease")},
    # E2: the slots due in a table lock or a stall vanish; reruns and retries across them
    # are told attempt 1 (C3's cause), or announced and dropped (E3).
    ("session", "table_lock"): _SILENT_LOST | _RELABEL,
    ("session", "stall"): _SILENT_LOST | _RELABEL,
    # (on a pool, whose connections keep statements prepared, the waiting claim commits
    # after its replica gave up, as in session mode: unfinished).
    ("lease", "table_lock"): _SILENT_LOST | _RELABEL,
    ("lease", "stall"): _SILENT_LOST | _RELABEL,
    # E15/E8/E12: a restart or failover coalesces or loses the slots due across it with
    # only an INFO line; reruns and retries across it are told attempt 1 or dropped; a
    # retry across a restart also starts its body as attempt 1 again (seen as twice).
    **{(mode, "crash"): _SILENT_LOST | {"twice"} | _RELABEL for mode in ("session", "lease")},
    **{(mode, "failover"): _SILENT_LOST | _RELABEL for mode in ("session", "lease")},
    # E13/S2: a snapshot restored under the same identity: rows vanish, slots run again.
    **{
        (mode, "restore"): _SILENT_LOST | _RELABEL | {"twice", "overlap"}
        for mode in ("session", "lease")
    },
    # E6 and a fleet gone: a killed holder's jobs lose slots as 'locked' skips; with every
    # replica killed, nothing accounts for the slots due (nor marks the last runs crashed).
    **{(mode, "kill"): _SILENT_LOST | _RELABEL for mode in ("session", "lease")},
    # E11: the frozen replica's "coalesced into one run" line covers slots that were then
    # given up; E7: a claim it made just before it froze is never run nor finished (seed
    # 3249, E5's kin). (E10, a run frozen past its lock or lease running beside others'
    # runs, is fixed: a freeze breaks no exclusion, and an overlap under it is news.)
    **{
        (mode, "freeze"): frozenset({"late", "silent", "unfinished"}) | _RELABEL
        for mode in ("session", "lease")
    },
    # Found by the simulation (seed 100121, session mode): a replica's host clock stepped
    # +23 s, then -19 s: its fleet time stays ahead, it claims slots early and holds their
    # jobs while it waits for them, and the other replicas' claims of the slots between
    # are refused 'locked' (nobody runs them).
    # E11 too: the replica whose clock stepped back says the slots since were "coalesced
    # into one run", and that run is skipped or refused (slots coalesced into nothing).
    **{(mode, "clock_step"): frozenset({"silent", "late"}) for mode in ("session", "lease")},
    # A reset's rerun of a run cut short is told attempt 1 (C3's cause).
    **{(mode, "reset"): _RELABEL | {"silent", "late"} for mode in ("session", "lease")},
    # E2 again, on a pool (lease mode only): while the user's code holds every connection
    # of a replica's pool, its claims fail ("the pool is exhausted"). The slots due
    # meanwhile are now told (SlotsDecided: coalesced into a later one), but an older
    # owed claim answered late runs and holds the job, and the slot they were told
    # coalesced into is refused 'locked' elsewhere and skipped by the overlap policy here
    # (late: seed 200244 with a pool, E6's kin); the other replicas' 'locked' skips of
    # the slots it held stay silent (E6).
    ("lease", "pool_exhaustion"): frozenset({"silent", "late"}),
}
"""(mode, fault kind) -> the oracle's rules a random schedule with that kind of fault may
break on today's code, each a finding of this round (round-6-slots-that-vanish.md) or of
the simulator (docs/testing.md). ``simulate.py --allow-known`` counts such violations apart
and fails on any other: a rule broken under a fault kind not listed for it is news."""


def known_rules(mode: Mode, kinds: set[str]) -> frozenset[str]:
    """The rules a run of *mode* with faults of *kinds* may break on today's code."""
    allowed: frozenset[str] = frozenset()
    for kind in kinds:
        allowed |= KNOWN_BY_KIND.get((mode, kind), frozenset())
    return allowed
