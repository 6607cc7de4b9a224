"""A replica killed mid-run, in the simulation, on a virtual clock: its run is marked
``crashed`` by another replica, which says so (``JobCrashed``, naming the killed replica),
and with ``recover=True`` one replica reruns the slot, once, if the slot is still within
its ``misfire_grace``; in both modes.

The replicas race for the job's one slot; the one that runs it is killed (SIGKILL: its
sessions end as the kernel closes them, its lease is left to expire) while its body runs.
The statements behind it have their agreement tests against the real server
(``test_statements_*.py``); the real-process case, a real SIGKILL and a real rerun, is
``tests/postgres/test_crashed_replicas.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cronlock import JobCrashed
from cronlock._sim.fleet import Effect, Fleet, JobSpec, Mode
from cronlock._sim.world import Process, World

SLOT_AT = 20.0  # seconds into the run: every replica is up long before
BODY = 8.0  # seconds the job's body takes: it is killed in the middle


@dataclass
class Crash:
    killed: Process
    crashed: list[tuple[str, JobCrashed]]  # (replica that said it, the event)
    starts: list[Effect]
    row: dict[str, Any]


def _crash(mode: Mode, *, recover: bool, grace: float, kill_after: float) -> Crash:
    """Three replicas race for the slot of ``crashy``; the one running it is killed
    *kill_after* seconds after the slot; the world runs on for two minutes (past a killed
    replica's membership with the default heartbeats)."""
    options = {"recover": recover, "misfire_grace": grace}
    job = JobSpec("crashy", "every:3600", BODY, options)
    world = World(53, epoch=datetime(2026, 3, 1, 9, tzinfo=UTC) - timedelta(seconds=SLOT_AT))
    fleet = Fleet(world, mode=mode, replicas=3, jobs=(job,))
    killed: list[Process] = []

    def kill() -> None:
        running = fleet.running("crashy")
        assert running is not None, "nobody runs the slot to kill"
        killed.append(running)
        world.kill(running)

    world.call_at(SLOT_AT + kill_after, kill)
    fleet.run(SLOT_AT + 120.0)
    assert not world.errors, world.errors
    crashed = [(s.replica, s.what) for s in fleet.said if isinstance(s.what, JobCrashed)]
    starts = [e for e in fleet.effects if e.kind == "start" and e.job == "crashy"]
    [row] = [row for row in fleet.ledger if row["job"] == "crashy"]
    return Crash(killed[0], crashed, starts, row)


def _owner(process: Process) -> str:
    return f"{process.host}:{process.pid}"


@pytest.mark.parametrize("mode", ["session", "lease"])
def test_a_killed_replicas_run_is_marked_crashed_and_not_rerun_without_recover(
    mode: Mode,
) -> None:
    seen = _crash(mode, recover=False, grace=60.0, kill_after=1.0)
    [(teller, crashed)] = seen.crashed  # one replica marked it, and only it said so
    assert teller != seen.killed.name
    assert crashed.owner == _owner(seen.killed)
    assert crashed.recovered is False
    assert [(e.replica, e.attempt) for e in seen.starts] == [(seen.killed.name, 1)]
    row = seen.row
    assert (row["outcome"], row["attempt"], row["pid"]) == ("crashed", 1, seen.killed.pid)
    assert "died mid-run" in row["error"]
    assert row["finished_at"] is not None


@pytest.mark.parametrize("mode", ["session", "lease"])
def test_with_recover_one_of_two_replicas_reruns_the_slot_exactly_once(mode: Mode) -> None:
    seen = _crash(mode, recover=True, grace=60.0, kill_after=1.0)
    [(teller, crashed)] = seen.crashed
    assert crashed.recovered is True
    assert crashed.owner == _owner(seen.killed)
    # The killed run, then one rerun, by the replica that said it reruns it.
    assert [(e.replica, e.attempt) for e in seen.starts] == [
        (seen.killed.name, 1),
        (teller, 2),
    ]
    assert seen.starts[1].slot == crashed.slot == seen.starts[0].slot
    row = seen.row
    assert (row["outcome"], row["attempt"]) == ("succeeded", 2)
    assert row["pid"] != seen.killed.pid


@pytest.mark.parametrize("mode", ["session", "lease"])
def test_with_recover_a_slot_past_its_grace_is_marked_crashed_and_not_rerun(mode: Mode) -> None:
    # Killed 3 s after the slot with a grace of 1 s: late whenever the crash is noticed.
    seen = _crash(mode, recover=True, grace=1.0, kill_after=3.0)
    [(_, crashed)] = seen.crashed
    assert crashed.recovered is False
    assert crashed.owner == _owner(seen.killed)
    assert [(e.replica, e.attempt) for e in seen.starts] == [(seen.killed.name, 1)]
    row = seen.row
    assert (row["outcome"], row["attempt"], row["pid"]) == ("crashed", 1, seen.killed.pid)
