"""Exactly once per slot, measured with real replica processes on a real server.

Each replica runs ``replica.py --trace``: it prints every acquire with the real-time
window of the call and its answer, every run's start and end, and every lease release.
From those lines a slot is counted as

- *ran* (once, or duplicated: ``runs - 1`` duplicates);
- *busy*: nobody ran it because a run of the job was in progress when every replica
  asked (answer ``"locked"`` while some lease of the job was held, checked against the
  holders' acquire-to-release windows; or the overlap skip on the replica running it);
- *missed*: neither. That is the failure a ledger must not introduce.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..eventually import eventually_blocking
from ..throwaway import drop
from .conftest import Coordination
from .replica import command as replica_command

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

Record = dict[str, Any]


class Fleet:
    """Replica processes writing their JSON lines to files (a full pipe would stall them).

    :meth:`boot` starts a replica that waits for its start (``--start -``); :meth:`go`
    hands it one once every replica booted, so the first slot is chosen after the slow
    part (starting Python) however busy the machine is. :meth:`spawn` gives the start on
    the command line."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._procs: list[tuple[str, Any, Path]] = []
        self._waiting: list[tuple[str, Any, Path]] = []

    def spawn(
        self, group: str, dsn: str, job: str, rid: int, start: float | None, slots: int, *extra: str
    ) -> None:
        out = self._tmp / f"{group}-{rid}-{len(self._procs)}.jsonl"
        with out.open("w") as sink:
            proc = subprocess.Popen(
                replica_command(dsn, job, rid, start, slots, *extra),
                stdin=subprocess.PIPE if start is None else None,
                stdout=sink,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._procs.append((group, proc, out))
        if start is None:
            self._waiting.append((group, proc, out))

    def boot(self, group: str, dsn: str, job: str, rid: int, slots: int, *extra: str) -> None:
        """Start a replica that waits for :meth:`go` to give it its start."""
        self.spawn(group, dsn, job, rid, None, slots, *extra)

    def go(self, group: str | None = None, *, start: float | None = None) -> float:
        """Once every replica :meth:`boot` started has booted, give those of *group* (all
        by default) *start*, or the first whole second 2 s away or more, and return it."""

        def booted() -> bool:
            for _, proc, out in self._waiting:
                assert proc.poll() is None, out.read_text()[-2000:]
                if '"booted"' not in out.read_text():
                    return False
            return True

        eventually_blocking(booted, "every replica to boot", 120, every=0.1)
        if start is None:
            start = first_slot_in(2)  # what is left to do: connect and start a scheduler
        for entry in [w for w in self._waiting if group in (None, w[0])]:
            _, proc, _ = entry
            proc.stdin.write(f"{start!r}\n")
            proc.stdin.close()
            self._waiting.remove(entry)
        return start

    def records(self, group: str, timeout: float = 400) -> list[Record]:
        found: list[Record] = []
        for name, proc, out in self._procs:
            if name != group:
                continue
            proc.wait(timeout=timeout)
            text = out.read_text()
            assert proc.returncode == 0, text[-2000:]
            for line in text.splitlines():
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return found

    def kill(self) -> None:
        for _, proc, _ in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    replicas = Fleet(tmp_path)
    try:
        yield replicas
    finally:
        replicas.kill()


@dataclass
class Figures:
    slots: int
    ran_once: int
    duplicates: int
    busy: int
    missed: int
    unexplained_locked: int
    lock_failed: int
    held_elsewhere: int = 0
    """Reports of a job's lock held outside the fleet: a false alarm in these tests."""

    def line(self, label: str) -> str:
        return (
            f"[measured] {label}: {self.slots} slots, ran once {self.ran_once}, "
            f"duplicates {self.duplicates}, skipped while a run held the lock {self.busy}, "
            f"missed {self.missed} (unexplained 'locked' answers {self.unexplained_locked}, "
            f"lock failures {self.lock_failed})"
        )


def analyse(records: list[Record], expected: list[float]) -> Figures:
    runs: dict[float, int] = defaultdict(int)
    for r in records:
        if r["event"] == "start":
            runs[r["slot"]] += 1
    # Each lease's window on the real clock: from its acquire call to its release's return.
    # The server held the lock inside that window, so a "locked" answer given within it
    # is explained.
    granted = {
        (r["replica"], r["slot"]): r["t0"]
        for r in records
        if r["event"] == "attempt" and r["result"] == "granted"
    }
    released = {(r["replica"], r["slot"]): r["t"] for r in records if r["event"] == "released"}
    windows = [(t0, released.get(key, math.inf)) for key, t0 in granted.items()]
    busy_slots: set[float] = set()
    unexplained = 0
    for r in records:
        if r["event"] == "attempt" and r["result"] == "locked":
            if any(start <= r["t1"] and r["t0"] <= end for start, end in windows):
                busy_slots.add(r["slot"])
            else:
                unexplained += 1
        elif r["event"] == "skipped" and r["reason"] == "overlap":
            busy_slots.add(r["slot"])  # that replica was running the job itself
    ran_once = sum(1 for s in expected if runs.get(s) == 1)
    duplicates = sum(max(runs.get(s, 0) - 1, 0) for s in expected)
    busy = sum(1 for s in expected if not runs.get(s) and s in busy_slots)
    missed = sum(1 for s in expected if not runs.get(s) and s not in busy_slots)
    failed = sum(1 for r in records if r["event"] == "lock_failed")
    elsewhere = sum(1 for r in records if r["event"] == "held_elsewhere")
    return Figures(
        len(expected), ran_once, duplicates, busy, missed, unexplained, failed, elsewhere
    )


def first_slot_in(seconds: float) -> float:
    return float(math.ceil(time.time() + seconds))


def test_lock_only_runs_slots_twice_with_skewed_clocks_and_the_ledger_does_not(
    pg_dsn: str, coordination: Coordination, fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three replicas 0, 150 and 300 ms behind, a job every second that takes 1 ms.

    The ledger's replicas run in both modes (lease mode through PgBouncer); the lock-only
    ones, which exist in session mode only, run once, beside the session-mode ledger."""
    session = coordination.mode == "session"
    slots = 10  # every slot shows it: each lagging replica runs it again
    tag = uuid.uuid4().hex[:8]
    # The replicas read their own clocks (no fleet time): the skew is what is tested.
    common = ["--interval", "1", "--hold", "0.001", "--trace", "--host-clock"]
    for rid, offset in enumerate(("0", "-0.15", "-0.3"), 1):
        if session:
            fleet.boot(
                "lock",
                pg_dsn,
                f"gap-lock-{tag}",
                rid,
                slots,
                *common,
                "--offset",
                offset,
                "--no-ledger",
            )
        fleet.boot(
            "ledger",
            coordination.dsn,
            f"gap-ledger-{tag}",
            rid,
            slots,
            *common,
            *coordination.args,
            "--offset",
            offset,
        )
    start = fleet.go()  # once all six have booted, however long that took
    expected = [start + k for k in range(slots)]
    ledger_records = fleet.records("ledger")
    ledger = analyse(ledger_records, expected)
    with capsys.disabled():
        if session:
            lock_only = analyse(fleet.records("lock"), expected)
            print("\n" + lock_only.line("lock-only, clocks 0/-150/-300 ms, 1 ms job every 1 s"))
            # The lagging replicas find the lock free again and run the slot a second time.
            assert lock_only.duplicates > 0
        print(ledger.line(f"ledger ({coordination.mode} mode), clocks 0/-150/-300 ms, 1 ms job"))
    assert ledger.duplicates == 0
    assert ledger.ran_once == slots  # 1 ms runs: no slot is ever busy, none may be missed
    assert ledger.lock_failed == 0, [r for r in ledger_records if r["event"] == "lock_failed"]


def test_no_duplicate_and_no_missed_slot_over_60_slots(
    pg_dsn: str, coordination: Coordination, fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Clocks up to 500 ms apart, runs from 0 to twice the interval, both modes at once
    (the ledger in session mode, or in lease mode through PgBouncer; lock-only beside the
    session mode).

    The logic is judged over thousands of such schedules by the simulator (docs/testing.md);
    this is the same schedule on real processes and a real server, long enough for the
    lock alone to run slots twice and for runs to outlast the interval."""
    session = coordination.mode == "session"
    slots, interval = 60, 0.5
    tag = uuid.uuid4().hex[:8]
    common = [
        *("--interval", str(interval), "--hold-range", "0", str(2 * interval)),
        *("--trace", "--host-clock"),  # the replicas read their own, skewed clocks
    ]
    for rid, offset in enumerate(("0", "-0.2", "-0.5"), 1):
        fleet.boot(
            "ledger",
            coordination.dsn,
            f"once-ledger-{tag}",
            rid,
            slots,
            *common,
            *coordination.args,
            "--offset",
            offset,
        )
        if not session:
            continue
        fleet.boot(
            "lock",
            pg_dsn,
            f"once-lock-{tag}",
            rid,
            slots,
            *common,
            "--offset",
            offset,
            "--no-ledger",
        )
    start = fleet.go()  # once all six have booted, however long that took
    expected = [start + k * interval for k in range(slots)]
    ledger_records = fleet.records("ledger")
    ledger = analyse(ledger_records, expected)
    exits = [r for r in ledger_records if r["event"] == "exit"]
    statements = sum(r["statements"] for r in exits)
    granted = sum(r["granted"] for r in exits)
    with capsys.disabled():
        label = f"ledger ({coordination.mode} mode), clocks 0/-200/-500 ms, runs 0..1 s"
        print("\n" + ledger.line(label))
        if session:
            lock_only = analyse(fleet.records("lock"), expected)
            print(lock_only.line("lock-only, clocks 0/-200/-500 ms, runs 0..1 s every 0.5 s"))
        print(
            f"[measured] ledger fleet: {statements} statements for {granted} runs "
            f"({statements / max(granted, 1):.2f} per run, counting the losers' claims, "
            "history reads and upkeep)"
        )
    assert ledger.duplicates == 0
    assert ledger.missed == 0
    assert ledger.lock_failed == 0, [r for r in ledger_records if r["event"] == "lock_failed"]
    assert ledger.held_elsewhere == 0  # contention inside the fleet is never reported
    assert ledger.ran_once + ledger.busy == slots
    if session:  # what the ledger prevents, with the same clocks
        assert lock_only.duplicates > 0


def test_catch_up_after_every_replica_was_down_over_a_slot(
    coordination: Coordination, fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Slot s1 passes with no replica up. Back within misfire_grace: it runs once, on one
    of the two replicas that come up. Back after it: it is reported missed."""
    interval = 5.0
    tag = uuid.uuid4().hex[:8]
    within, beyond = f"catch-up-{tag}", f"too-late-{tag}"
    dsn, args = coordination.dsn, coordination.args
    common = [*args, "--interval", str(interval), "--hold", "0.1"]
    # Every process boots first, however slowly: a replica that has not been given its
    # start is down (no connection, no scheduler), and comes up when given it.
    # Before: one replica per job runs s0, then exits (slots=1) well before s1.
    for job in (within, beyond):
        fleet.boot("before", dsn, job, 1, 1, *common)
    # Back within misfire_grace: two replicas of the first job, together; they exit at
    # s1 + 4.5 s (s1 is their last slot), when a catch-up within the grace has ended.
    for rid in (2, 3):
        within_grace = ("--misfire-grace", "4", "--until-after", str(interval + 4.5))
        fleet.boot("within", dsn, within, rid, 2, *common, *within_grace)
    # Back after misfire_grace: one replica of the second job, up until s1 + 6 s.
    beyond_grace = ("--misfire-grace", "0.5", "--until-after", str(interval + 6.0))
    fleet.boot("beyond", dsn, beyond, 2, 2, *common, *beyond_grace)
    s0 = fleet.go("before")
    s1 = s0 + interval
    assert {r["slot"] for r in fleet.records("before") if r["event"] == "start"} == {s0}
    assert time.time() < s1, "the first replicas outlived slot s1; the test needs them down"
    time.sleep(max(s1 + 0.3 - time.time(), 0))  # s1 passes with every replica down
    fleet.go("within", start=s0)  # 0.3 s late, and the time it takes to start
    time.sleep(max(s1 + 1.0 - time.time(), 0))
    fleet.go("beyond", start=s0)  # 1 s late or more: past its grace of 0.5 s
    back = fleet.records("within")
    late = fleet.records("beyond")
    ran = [(r["replica"], r["slot"]) for r in back if r["event"] == "start"]
    with capsys.disabled():
        print(
            f"\n[measured] catch-up: s1 ran on {ran}; beyond grace: "
            f"{[(r['event'], r.get('reason')) for r in late if r['event'] == 'skipped']}"
        )
    assert [slot for _, slot in ran] == [s1]
    assert [r["slot"] for r in late if r["event"] == "start"] == []
    assert [(r["slot"], r["reason"]) for r in late if r["event"] == "skipped"] == [(s1, "misfire")]


def test_two_services_sharing_a_database_with_the_same_job_names_each_run_every_slot(
    pg_server: str, fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two services, each with its own ledger schema and two replicas, both with a job
    named "cleanup" (a run of 0.6 s every second), defaults otherwise. Advisory locks are
    database-wide: on the bare job name one service's run would block the other's slot.
    The keys are namespaced by the ledger, so each service runs every slot of its own.
    Two more services on the seed's bare keys (``bare_keys=True``) show what that prevents:
    they lose slots to each other."""
    slots = 12
    tag = uuid.uuid4().hex[:6]
    services = {
        name: f"cronlock_test_shared_{tag}_{name}" for name in ("a", "b", "bare_a", "bare_b")
    }
    common = ["--interval", "1", "--hold", "0.6", "--trace"]
    for name, schema in services.items():
        bare = ("--bare-keys",) if name.startswith("bare") else ()
        job = "cleanup-bare" if bare else "cleanup"
        for rid in (1, 2):
            fleet.boot(name, pg_server, job, rid, slots, *common, "--schema", schema, *bare)
    start = fleet.go()  # once all eight have booted, however long that took
    expected = [start + k for k in range(slots)]
    try:
        figures = {name: analyse(fleet.records(name), expected) for name in services}
        on_bare = [figures.pop("bare_a"), figures.pop("bare_b")]
        bare_ran = sum(seen.ran_once for seen in on_bare)
        bare_reports = sum(seen.held_elsewhere for seen in on_bare)
        with capsys.disabled():
            for name, seen in figures.items():
                print("\n" + seen.line(f"service {name} of two sharing a database"), end="")
            print(
                f"\n[measured] the same on bare keys: {bare_ran} of {2 * slots} slots ran, "
                f"reported held outside the fleet {bare_reports} time(s)"
            )
        assert bare_ran < 2 * slots
        assert bare_reports >= 1  # the lost slots were not lost in silence
        for seen in figures.values():
            assert (seen.duplicates, seen.missed, seen.busy, seen.lock_failed) == (0, 0, 0, 0)
            assert seen.ran_once == slots
    finally:
        asyncio.run(drop(pg_server, "schema", *services.values()))
